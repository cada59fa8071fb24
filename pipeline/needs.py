"""What a workflow needs of a server, and what a server offers: node classes and model files.

A ComfyUI server runs a workflow only if it has every node class the workflow names
(``class_type``) and every model file the workflow's loaders name. The watcher reads what each
server offers (``GET /object_info``: its node classes; ``GET /models/<folder>``: its files) and
stores it; admission refuses a workflow no server can run, and a claim sends a job only to a
server that can (docs/fleet.md "Routing by what a server can run").

A model file is recognised by its input's name (``MODEL_INPUTS``, the loaders of ComfyUI's own
nodes); a file named by any other input is not checked here (ComfyUI's validation still is).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

#: Input name -> the models folder its file comes from; ``(class_type, input)`` where a loader
#: uses a common input name for another folder.
MODEL_INPUTS: dict[str, str] = {
    "ckpt_name": "checkpoints", "lora_name": "loras", "unet_name": "diffusion_models",
    "clip_name": "text_encoders", "clip_name1": "text_encoders", "clip_name2": "text_encoders",
    "clip_name3": "text_encoders", "clip_name4": "text_encoders", "control_net_name": "controlnet",
    "style_model_name": "style_models", "gligen_name": "gligen", "hypernetwork_name": "hypernetworks",
}
CLASS_MODEL_INPUTS: dict[tuple[str, str], str] = {
    ("CLIPVisionLoader", "clip_name"): "clip_vision", ("UpscaleModelLoader", "model_name"): "upscale_models",
}
#: The folders the watcher lists (``GET /models/<folder>``).
FOLDERS = tuple(sorted(set(MODEL_INPUTS.values()) | set(CLASS_MODEL_INPUTS.values())))


@dataclass(frozen=True)
class Needs:
    """Node classes and (folder, file) pairs a workflow names; ``checkpoint``: its first checkpoint
    (what a server loads into GPU memory: the key of checkpoint affinity), or ''."""

    nodes: frozenset[str]
    models: frozenset[tuple[str, str]]
    checkpoint: str = ""


def needs_of(workflow: Mapping[str, Any]) -> Needs:
    """The needs of a workflow in ComfyUI's API format (node id -> {class_type, inputs})."""
    nodes, models, checkpoints = set(), set(), []
    for node_id in sorted(workflow, key=str):
        node = workflow[node_id]
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str):
            continue
        cls = node["class_type"]
        nodes.add(cls)
        inputs = node.get("inputs") if isinstance(node.get("inputs"), dict) else {}
        for name, value in sorted(inputs.items()):
            folder = CLASS_MODEL_INPUTS.get((cls, name)) or MODEL_INPUTS.get(name)
            if folder and isinstance(value, str):
                models.add((folder, value))
                if folder == "checkpoints":
                    checkpoints.append(value)
    return Needs(frozenset(nodes), frozenset(models), checkpoints[0] if checkpoints else "")


@dataclass(frozen=True)
class Offer:
    """What a server offers: its node classes and its files per models folder."""

    nodes: frozenset[str]
    models: Mapping[str, frozenset[str]]

    def to_json(self) -> dict[str, Any]:
        return {"nodes": sorted(self.nodes), "models": {k: sorted(v) for k, v in sorted(self.models.items())}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Offer:
        return cls(frozenset(data.get("nodes", ())),
                   {folder: frozenset(files) for folder, files in (data.get("models") or {}).items()})


@dataclass(frozen=True)
class Missing:
    """What one server lacks of a workflow's needs."""

    nodes: tuple[str, ...]
    models: tuple[str, ...]  # "<folder>/<file>"

    def __bool__(self) -> bool:
        return bool(self.nodes or self.models)

    def __len__(self) -> int:
        return len(self.nodes) + len(self.models)


def missing(needs: Needs, offer: Offer | None) -> Missing:
    """What ``offer`` lacks; nothing when the offer is not known (a server not read yet may run it)."""
    if offer is None:
        return Missing((), ())
    nodes = tuple(sorted(needs.nodes - offer.nodes))
    models = tuple(sorted(f"{folder}/{name}" for folder, name in needs.models
                          if name not in offer.models.get(folder, frozenset())))
    return Missing(nodes, models)
