"""Which inputs a workflow names, and which file names admission refuses (pipeline/inputs.py)."""

from __future__ import annotations

import hashlib

import pytest

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


@pytest.mark.parametrize("node", [
    {"class_type": "LoadImage", "inputs": {"image": f"reckon/{SHA}.png [input]"}},
    {"class_type": "LoadImage", "inputs": {"image": f"./reckon/{SHA}.png"}},
    {"class_type": "LoadLatent", "inputs": {"latent": f"./reckon/{SHA}.png"}},
    {"class_type": "LoadLatent", "inputs": {"latent": f"reckon//{SHA}.png"}},
    {"class_type": "SomeCustomLoader", "inputs": {"path": f"RECKON/{SHA}.png"}},
    {"class_type": "SomeCustomLoader", "inputs": {"path": f"x/../reckon/{SHA}.png"}},
    {"class_type": "SomeCustomLoader", "inputs": {"path": f"/srv/comfyui/input/reckon/{SHA}.png"}},
    {"class_type": "SomeCustomLoader", "inputs": {"path": f"reckon\\{SHA}.png"}},
    {"class_type": "SomeCustomLoader", "inputs": {"path": f"reckon./{SHA}.png"}},
    {"class_type": "LoadImageSetFromFolderNode", "inputs": {"folder": "reckon", "resize_method": "None"}},
    {"class_type": "LoadImageTextSetFromFolderNode", "inputs": {"folder": "reckon/"}},
    {"class_type": "Load3D", "inputs": {"model_file": "3d/x.glb", "image": {"image": f"./reckon/{SHA}.png"}}},
    {"class_type": "SomeCustomLoader", "inputs": {"paths": {"list": [f"reckon/{SHA}.png [input]"]}}},
    {"class_type": "SomeCustomLoader", "inputs": {"paths": {f"./reckon/{SHA}.png": 1}}},
])
def test_every_other_spelling_that_reaches_the_subfolder_is_refused_however_deep(node) -> None:
    """What ComfyUI would read from ``input/reckon/`` by another spelling (get_annotated_filepath strips the
    annotation and joins the rest onto the input folder; LoadImageSetFromFolderNode reads a folder whole;
    Load3D reads the names in its ``image`` object) would be a file admission never checked."""
    assert names_in({"1": node}).refused != ()
    assert names_in({"1": node}).inputs == ()


def test_a_name_inside_an_object_is_an_input_and_a_link_into_a_file_input_is_refused() -> None:
    nested = {"1": {"class_type": "SomeCustomLoader", "inputs": {"paths": {"image": f"reckon/{SHA}.png", "n": 2}}}}
    assert names_in(nested).inputs == (InputName(SHA, "png"),)  # checked against the tenant's, and staged
    linked = {"1": {"class_type": "StringConcatenate",
                    "inputs": {"string_a": "reck", "string_b": f"on/{SHA}.png", "delimiter": ""}},
              "2": {"class_type": "LoadImage", "inputs": {"image": ["1", 0]}},
              "3": {"class_type": "LoadImageSetFromFolderNode", "inputs": {"folder": ["1", 0]}}}
    assert names_in(linked).refused == ("LoadImage.image linked to another node's output",
                                        "LoadImageSetFromFolderNode.folder linked to another node's output")
    deep: object = f"reckon/{OTHER}.wav"
    for _ in range(5000):  # nesting no recursion would survive
        deep = [deep]
    assert names_in({"1": {"class_type": "X", "inputs": {"v": deep}}}).inputs == (InputName(OTHER, "wav"),)


def test_every_node_that_reads_a_servers_files_takes_only_an_inputs_name() -> None:
    """LoadImageOutput reads ComfyUI's output folder (other jobs' outputs, other tenants' among them); Load3D the
    names in its ``image`` object; LoadLatent and the folder loaders any file or folder of the input folder."""
    workflow = {
        "1": {"class_type": "LoadImageOutput", "inputs": {"image": "ComfyUI_00001_.png [output]"}},
        "2": {"class_type": "Load3D", "inputs": {"model_file": "3d/x.glb", "image": {"image": "x.png [output]"}}},
        "3": {"class_type": "LoadLatent", "inputs": {"latent": "ComfyUI_00001_.latent [output]"}},
        "4": {"class_type": "LoadImageSetFromFolderNode", "inputs": {"folder": "3d"}},
        "5": {"class_type": "WebcamCapture", "inputs": {"image": f"reckon/{SHA}.png", "width": 64}},
    }
    named = names_in(workflow)
    assert named.refused == ("ComfyUI_00001_.png [output]", "3d/x.glb", "Load3D.image not a file's name",
                             "ComfyUI_00001_.latent [output]", "3d")
    assert named.inputs == (InputName(SHA, "png"),)
