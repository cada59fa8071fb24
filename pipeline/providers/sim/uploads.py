"""The simulated ComfyUI's input folder: ``POST /upload/image`` as ComfyUI v0.3.64 answers it, the
files kept (in memory, through a restart unless it wipes them), and the refusal of a prompt whose
loader names a file the folder does not hold.

An upload without ``overwrite`` of a name the folder holds keeps the file when the bytes are the
same (ComfyUI's duplicate check) and saves other bytes as ``name (1).ext`` (then ``(2)``...), as
ComfyUI does; with ``overwrite`` (``true`` or ``1``) it replaces the file.
"""

from __future__ import annotations

import posixpath
from typing import Any

from pipeline.inputs import LOADERS

#: The error ComfyUI's loaders (``VALIDATE_INPUTS``) give for a file their folder lacks, by node class.
KIND = {"LoadImage": "image", "LoadImageMask": "image", "LoadAudio": "audio", "LoadVideo": "video"}


def parse_form(content_type: str, body: bytes) -> dict[str, tuple[str | None, bytes]]:
    """A ``multipart/form-data`` body: field name -> (file name or None, bytes)."""
    boundary = next((part.strip()[len("boundary="):].strip('"') for part in content_type.split(";")
                     if part.strip().startswith("boundary=")), "")
    if not content_type.startswith("multipart/form-data") or not boundary:
        raise ValueError("not multipart/form-data")
    fields: dict[str, tuple[str | None, bytes]] = {}
    for part in body.split(b"--" + boundary.encode())[1:]:
        if part.startswith(b"--"):
            break
        head, _, data = part.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        params = _disposition(head.decode("latin-1"))
        if "name" in params:
            fields[params["name"]] = (params.get("filename"), data.removesuffix(b"\r\n"))
    return fields


def _disposition(head: str) -> dict[str, str]:
    for line in head.split("\r\n"):
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-disposition":
            pairs = (item.strip().partition("=") for item in value.split(";")[1:])
            return {key: val.strip('"') for key, _, val in pairs}
    return {}


def store_upload(files: dict[str, bytes], fields: dict[str, tuple[str | None, bytes]]) -> tuple[int, Any]:
    """Store an uploaded file as ComfyUI's ``image_upload`` does; (status, answer)."""
    filename, data = fields.get("image", (None, b""))
    if not filename or fields.get("type", (None, b"input"))[1] != b"input":
        return 400, b""
    subfolder = fields.get("subfolder", (None, b""))[1].decode()
    overwrite = fields.get("overwrite", (None, b""))[1] in (b"true", b"1")
    stem, ext = posixpath.splitext(filename)
    name, n = filename, 1
    while not overwrite and posixpath.join(subfolder, name) in files:
        if files[posixpath.join(subfolder, name)] == data:
            break  # a duplicate: kept as it is
        name, n = f"{stem} ({n}){ext}", n + 1
    files[posixpath.join(subfolder, name)] = data
    return 200, {"name": name, "subfolder": subfolder, "type": "input"}


def missing_input_refusal(files: dict[str, bytes], prompt: dict[str, Any]) -> dict[str, Any] | None:
    """ComfyUI's 400 answer for a prompt whose loader names a file the input folder lacks, or None."""
    errors: dict[str, Any] = {}
    for node_id, spec in prompt.items():
        field = LOADERS.get(spec.get("class_type")) if isinstance(spec, dict) else None
        value = (spec.get("inputs") or {}).get(field) if field else None
        if isinstance(value, str) and value not in files:
            detail = f"{field} - Invalid {KIND[spec['class_type']]} file: {value}"
            errors[node_id] = {"errors": [{"type": "custom_validation_failed", "details": detail,
                                           "message": "Custom validation failed for node",
                                           "extra_info": {"input_name": field}}],
                               "dependent_outputs": [], "class_type": spec["class_type"]}
    if not errors:
        return None
    error = {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
             "details": "", "extra_info": {}}
    return {"error": error, "node_errors": errors}
