"""Saved workflows' parameters: what a saved graph lets a request set, and the graph a request's values build.

A parameter names one node input of the saved graph (``{"node": "6", "input": "text", "type": "string",
"max_length": 2000}``) and says what a value must be: a ``string`` (``min_length``, ``max_length``), an
``integer`` or a ``number`` (``minimum``, ``maximum``), a ``boolean``, or an ``input`` (an uploaded input's
name, ``reckon/<sha256>.<ext>``: docs/api.md "Inputs"). ``default`` is used when a request leaves it out;
``required`` refuses a request without it; neither: the saved graph's own value stays.

A parameter never sets a node's class nor a model file's input (``needs.MODEL_INPUTS``): what a server must
have to run a saved workflow is then the same for every request, computed once when it is saved.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Mapping

from pipeline.errors import InvalidParams, InvalidRequest
from pipeline.inputs import NAME_RE
from pipeline.needs import CLASS_MODEL_INPUTS, MODEL_INPUTS

TYPES = ("string", "integer", "number", "boolean", "input")
#: Parameters one saved workflow declares at most.
MAX_PARAMS = 64
#: A parameter's name: what a request's ``params`` object names.
PARAM_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
#: The bounds a ``string`` (lengths) or an ``integer``/``number`` (values) may declare.
_BOUNDS = {"string": ("min_length", "max_length"), "integer": ("minimum", "maximum"),
           "number": ("minimum", "maximum"), "boolean": (), "input": ()}
_COMMON = frozenset({"node", "input", "type", "default", "required", "description"})
#: JSON's safe integers: a bound or a value beyond them is refused (another client would read it rounded).
_SAFE = 2**53


@dataclass(frozen=True)
class Param:
    """One declared parameter (see the module's docstring)."""

    name: str
    node: str
    input: str
    type: str
    low: int | float | None = None
    high: int | float | None = None
    default: Any = None
    required: bool = False
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "input": self.input, "type": self.type}
        for bound, value in zip(_BOUNDS[self.type], (self.low, self.high)):
            if value is not None:
                out[bound] = value
        if self.default is not None:
            out["default"] = self.default
        return out | {"required": self.required} | ({"description": self.description} if self.description else {})

    def problem(self, value: Any) -> str | None:
        """Why ``value`` cannot be this parameter's ("wrong type: ..." or "out of bounds: ..."), or None."""
        kind = self.type
        if kind == "boolean":
            return None if isinstance(value, bool) else "wrong type: must be true or false"
        if kind in ("string", "input"):
            if not isinstance(value, str):
                return "wrong type: must be a string"
            if kind == "input":
                return None if NAME_RE.fullmatch(value) else "wrong type: must name an uploaded input (reckon/<sha256>.<ext>)"
            return _out_of(len(value), self.low, self.high, "characters")
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "integer" and not (number and (isinstance(value, int) or float(value).is_integer())):
            return "wrong type: must be an integer"
        if not number or value != value or abs(value) > _SAFE:  # NaN, infinities and beyond 2**53
            return "wrong type: must be a number"
        return _out_of(value, self.low, self.high, "")


def _out_of(value: int | float, low: int | float | None, high: int | float | None, unit: str) -> str | None:
    if (low is not None and value < low) or (high is not None and value > high):
        return f"out of bounds: must be from {low if low is not None else '-'} to {high if high is not None else '-'}" \
            + (f" {unit}" if unit else "")
    return None


def declare(spec: Any, graph: Mapping[str, Any]) -> dict[str, Param]:
    """Validate the parameters a workflow is saved with against its graph; InvalidRequest names the
    first bad one (``params.<name>``), with the problem type ``invalid-workflow``."""
    if not isinstance(spec, dict) or len(spec) > MAX_PARAMS:
        raise _bad("params", f"must be an object of at most {MAX_PARAMS} parameters")
    params, targets = {}, set()
    for name, item in spec.items():
        params[name] = param = _param(name, item, graph)
        if (param.node, param.input) in targets:
            raise _bad(f"params.{name}", "another parameter sets the same node input")
        targets.add((param.node, param.input))
    return params


def _param(name: str, item: Any, graph: Mapping[str, Any]) -> Param:
    field = f"params.{name}"
    if not PARAM_NAME_RE.fullmatch(name) or not isinstance(item, dict):
        raise _bad(field, f"a parameter's name matches {PARAM_NAME_RE.pattern}; its value is an object")
    kind = item.get("type")
    if kind not in TYPES:
        raise _bad(field, f"type must be one of: {', '.join(TYPES)}")
    unknown = sorted(set(item) - _COMMON - set(_BOUNDS[kind]))
    if unknown:
        raise _bad(field, f"unknown member {unknown[0]} for a {kind}")
    node_id, input_name = item.get("node"), item.get("input")
    node = graph.get(node_id) if isinstance(node_id, str) else None
    inputs = node.get("inputs") if isinstance(node, dict) else None
    if not isinstance(inputs, dict) or not isinstance(input_name, str) or input_name not in inputs:
        raise _bad(field, "node must name a node of the workflow and input one of that node's inputs")
    if input_name in MODEL_INPUTS or (node.get("class_type"), input_name) in CLASS_MODEL_INPUTS:
        raise _bad(field, "a parameter cannot set a model file (save a version per model)")
    if isinstance(inputs[input_name], list):
        raise _bad(field, "that input is a link to another node's output")
    low, high = (item.get(bound) for bound in _BOUNDS[kind] or ("", ""))
    for bound in (low, high):
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float)) or abs(bound) > _SAFE
                                  or (kind != "number" and not float(bound).is_integer())):
            raise _bad(field, "a bound must be a number within 2**53 (a whole one for lengths and integers)")
    if low is not None and high is not None and low > high:
        raise _bad(field, "a lower bound above the upper one: no value could be sent")
    required = item.get("required", False)
    description = item.get("description", "")
    if not isinstance(required, bool) or not isinstance(description, str) or len(description) > 500:
        raise _bad(field, "required is true or false; description a string of at most 500 characters")
    param = Param(name, node_id, input_name, kind, low, high, item.get("default"), required, description)  # type: ignore[arg-type]
    if param.default is not None and (reason := param.problem(param.default)):
        raise _bad(field, f"default {reason}")
    if param.required and param.default is not None:
        raise _bad(field, "a required parameter has no default (a request must send it)")
    return param


def _bad(field: str, detail: str) -> InvalidRequest:
    return InvalidRequest(field, detail, problem="invalid-workflow")


def fill(graph: Mapping[str, Any], params: Mapping[str, Param], values: Any) -> dict[str, Any]:
    """The graph a request's ``params`` build; InvalidParams names every bad one (unknown, missing, wrong type,
    out of bounds) at once. The saved graph is not changed (only the nodes set are copied)."""
    if not isinstance(values, dict):
        raise InvalidRequest("params", "must be an object")
    bad = [(name, "unknown: the workflow declares no such parameter") for name in sorted(values) if name not in params]
    built = dict(graph)
    for name, param in params.items():
        value = values.get(name)
        if value is None:  # left out, or null (docs/api.md: the same): the default, if any
            value = param.default
        if value is None:
            if param.required:
                bad.append((name, "missing: required"))
            continue
        reason = param.problem(value)
        if reason:
            bad.append((name, reason))
            continue
        if built[param.node] is graph[param.node]:
            built[param.node] = copy.deepcopy(graph[param.node])
        built[param.node]["inputs"][param.input] = int(value) if param.type == "integer" else value
    if bad:
        raise InvalidParams(tuple(bad))
    return built
