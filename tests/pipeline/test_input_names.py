"""Which inputs a workflow names, and which file names admission refuses (pipeline/inputs.py)."""

from __future__ import annotations

import hashlib

from pipeline.inputs import InputName, name_for, names_in
from pipeline.mediatypes import sniff

SHA = hashlib.sha256(b"one").hexdigest()
OTHER = hashlib.sha256(b"two").hexdigest()


def test_a_workflow_names_each_input_once_in_order_of_first_mention() -> None:
    workflow = {
        "1": {"class_type": "LoadImage", "inputs": {"image": f"reckon/{SHA}.png"}},
        "2": {"class_type": "LoadAudio", "inputs": {"audio": f"reckon/{OTHER}.wav"}},
        "3": {"class_type": "LoadImageMask", "inputs": {"image": f"reckon/{SHA}.png", "channel": "alpha"}},
        "4": {"class_type": "SomeCustomLoader", "inputs": {"path": f"reckon/{OTHER}.wav", "n": 3}},
    }
    named = names_in(workflow)
    assert named.inputs == (InputName(SHA, "png"), InputName(OTHER, "wav"))
    assert named.refused == ()
    assert named.inputs[0].name == f"reckon/{SHA}.png" and named.inputs[0].filename == f"{SHA}.png"


def test_a_loaders_file_that_is_not_an_input_and_a_malformed_reckon_name_are_refused() -> None:
    workflow = {
        "1": {"class_type": "LoadImage", "inputs": {"image": "example.png"}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "ComfyUI_00001_.png [output]"}},
        "3": {"class_type": "LoadVideo", "inputs": {"file": "../../etc/passwd"}},
        "4": {"class_type": "CLIPTextEncode", "inputs": {"text": f"reckon/{SHA[:10]}.png"}},
        "5": {"class_type": "CLIPTextEncode", "inputs": {"text": "a reckon/ of a cat"}},  # not a name: kept
    }
    assert names_in(workflow).refused == ("example.png", "ComfyUI_00001_.png [output]", "../../etc/passwd",
                                          f"reckon/{SHA[:10]}.png")
    assert names_in(workflow).inputs == ()


def test_a_name_comes_from_the_content_type_sniffed_from_the_bytes() -> None:
    wav = b"RIFF\x24\x00\x00\x00WAVEfmt "
    assert sniff(wav) == "audio/wav" and name_for(SHA, "audio/wav") == f"reckon/{SHA}.wav"
    assert sniff(b"\x00\x00\x00\x18ftypisom") == "video/mp4" and name_for(SHA, "video/mp4").endswith(".mp4")
    assert sniff(b"fLaC\x00") == "audio/flac" and sniff(b"plain text") is None
