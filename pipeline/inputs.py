"""What an uploaded input is called on a server, and which inputs a workflow names.

An input a tenant uploads (``POST /v1/inputs``) is named after its content:
``reckon/<sha256>.<extension>``, the extension from its content type. A workflow writes that name
where ComfyUI takes a file from its input folder (``LOADERS``); the worker puts the bytes at that
place on the server that runs the job (under reckon's own subfolder, ``SUBFOLDER``, so they never
collide with an operator's files), and the same bytes have the same name on every server.

A workflow may name only its tenant's own inputs: admission refuses a name in reckon's form that
the tenant has not uploaded, and any other file name in a loader's file input (an operator's file,
a path, or ComfyUI's ``[output]``/``[temp]`` annotations, which would read what other jobs saved).
Every string of a node's inputs is looked at, however deep in lists and objects (ComfyUI hands an
object to a node as it is: ``Load3D`` reads the file names in its ``image`` object), and any other
spelling that reaches reckon's subfolder (``./reckon/...``, ``reckon//...``, ``RECKON/...``, an
``[input]`` annotation, the folder itself, which ``LoadImageSetFromFolderNode`` reads whole) is
refused; so is a link into an input that names a file of the input folder (``READERS``), whose
string another node would compute where admission cannot see it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pipeline.mediatypes import EXTENSIONS

#: The subfolder of a server's input folder that holds reckon's uploads.
SUBFOLDER = "reckon"
#: Node class -> the input that names a file of ComfyUI's input folder (ComfyUI v0.3.64's loaders).
LOADERS = {"LoadImage": "image", "LoadImageMask": "image", "LoadAudio": "audio", "LoadVideo": "file"}
#: Node class -> every input that names a file or folder of a server's (ComfyUI v0.3.64's core nodes: its
#: input folder, or its output folder for LoadImageOutput): each one, as a loader's file input, takes only
#: an input's name, literally (a link is computed by another node after admission).
READERS = {**{node: (name,) for node, name in LOADERS.items()}, "LoadLatent": ("latent",),
           "Load3D": ("model_file", "image"), "Load3DAnimation": ("model_file", "image"),
           "LoadImageSetNode": ("images",), "LoadImageSetFromFolderNode": ("folder",),
           "LoadImageTextSetFromFolderNode": ("folder",), "LoadImageOutput": ("image",), "WebcamCapture": ("image",)}
#: An input's name: ``reckon/<sha256>.<extension>``.
NAME_RE = re.compile(rf"{SUBFOLDER}/([0-9a-f]{{64}})\.([a-z0-9]{{1,8}})")
#: Any path through reckon's subfolder, however spelled (either separator, any case, trailing dots or
#: spaces, which Windows drops): what is not exactly an input's name is refused.
SUBFOLDER_RE = re.compile(rf"(?:^|[/\\]){SUBFOLDER}[. ]*(?:[/\\]|$)", re.IGNORECASE)


@dataclass(frozen=True)
class InputName:
    """One input a workflow names: its content's sha256 and its name on a server."""

    sha256: str
    extension: str

    @property
    def name(self) -> str:
        """What the workflow writes: ``reckon/<sha256>.<extension>``."""
        return f"{SUBFOLDER}/{self.sha256}.{self.extension}"

    @property
    def filename(self) -> str:
        """The file's name inside ``SUBFOLDER``."""
        return f"{self.sha256}.{self.extension}"


@dataclass(frozen=True)
class Named:
    """What a workflow names: reckon inputs (each once, in order of first mention), and the file names
    admission refuses outright (a loader's file that is not an input, a malformed reckon name)."""

    inputs: tuple[InputName, ...]
    refused: tuple[str, ...]


def name_for(sha256: str, content_type: str) -> str:
    """The name an input with this content gets (``reckon/<sha256>.<extension>``)."""
    return InputName(sha256, EXTENSIONS.get(content_type, "bin")).name


def names_in(workflow: dict[str, Any]) -> Named:
    """Every input a workflow names, in any node's inputs however nested, and every file name refused."""
    found: dict[str, InputName] = {}
    refused: list[str] = []
    for spec in workflow.values():
        inputs = spec.get("inputs") if isinstance(spec, dict) else None
        if not isinstance(inputs, dict):
            continue
        class_type = spec.get("class_type")
        reads = READERS.get(class_type, ())  # type: ignore[arg-type]
        for key, value in inputs.items():
            if key in reads and isinstance(value, list):
                refused.append(f"{class_type}.{key} linked to another node's output")
            elif key in reads and not isinstance(value, str):
                refused.append(f"{class_type}.{key} not a file's name")
            for text in _strings(value):
                match = NAME_RE.fullmatch(text)
                if match:
                    found.setdefault(text, InputName(match.group(1), match.group(2)))
                elif (key in reads and text is value) or SUBFOLDER_RE.search(text):
                    refused.append(text)
    return Named(tuple(found.values()), tuple(dict.fromkeys(refused)))


def _strings(value: Any) -> list[str]:
    """Every string in ``value``, through lists and objects, keys and values (a loop: no nesting depth can
    overflow it)."""
    strings, todo = [], [value]
    while todo:
        item = todo.pop()
        if isinstance(item, str):
            strings.append(item)
        elif isinstance(item, dict):  # its keys too: a custom node may read them as names
            todo.extend(reversed([part for pair in item.items() for part in pair]))
        elif isinstance(item, list):
            todo.extend(reversed(item))
    return strings
