"""The saved workflows' part of the OpenAPI document (api/openapi.py adds it): their routes, and a job
request that names one (``workflow_ref`` and ``params`` instead of ``workflow``)."""

from __future__ import annotations

from typing import Any

from pipeline.state.workflows import NAME_RE, REF_RE

_PROBLEM = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
_AUTH = {"401": {"description": "missing, unknown or revoked API key, or a disabled tenant", "content": _PROBLEM},
         "503": {"description": "state cannot be read or written now (Retry-After)", "content": _PROBLEM}}
_PARAM = {"type": "object", "required": ["node", "input", "type", "required"], "properties": {
    "node": {"type": "string"}, "input": {"type": "string"},
    "type": {"enum": ["string", "integer", "number", "boolean", "input"]}, "required": {"type": "boolean"},
    "min_length": {"type": "integer"}, "max_length": {"type": "integer"}, "minimum": {"type": "number"},
    "maximum": {"type": "number"}, "default": {}, "description": {"type": "string"}}}
VERSION = {"type": "object", "required": ["name", "version", "ref", "owner", "saved_at", "params", "needs"],
           "properties": {
               "name": {"type": "string"}, "version": {"type": "integer", "minimum": 1}, "ref": {"type": "string"},
               "owner": {"enum": ["shared", "tenant"]}, "saved_at": {"type": "integer"},
               "params": {"type": "object", "additionalProperties": _PARAM},
               "needs": {"type": "object", "required": ["node_classes", "models"], "properties": {
                   "node_classes": {"type": "array", "items": {"type": "string"}},
                   "models": {"type": "array", "items": {"type": "string"}}}},
               "workflow": {"type": "object", "description": "the graph: only to the tenant that owns it"}}}
PATHS: dict[str, Any] = {
    "/v1/workflows": {
        "get": {"summary": "The saved workflows the tenant may name: its own and the shared ones",
                "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["workflows"], "properties": {"workflows": {
                        "type": "array", "items": {"type": "object", "required": ["name", "owner", "latest"],
                                                   "properties": {"name": {"type": "string"},
                                                                  "owner": {"enum": ["shared", "tenant"]},
                                                                  "latest": {"type": "integer"}}}}}}}}},
                              **_AUTH}},
        "post": {"summary": "Save the next version of one of the tenant's own workflows",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "additionalProperties": False, "required": ["name", "workflow"],
                     "properties": {"name": {"type": "string", "pattern": f"^{NAME_RE.pattern}$"},
                                    "workflow": {"type": "object", "minProperties": 1},
                                    "params": {"type": "object", "additionalProperties": {"type": "object"}}}}}}},
                 "responses": {
                     "201": {"description": "saved (Location: /v1/workflows/name@version)",
                             "content": {"application/json": {"schema": VERSION}},
                             "headers": {"Location": {"schema": {"type": "string"}}}},
                     "200": {"description": "the latest version holds this graph and these parameters already: "
                                            "that version (a retried save)",
                             "content": {"application/json": {"schema": VERSION}}},
                     "400": {"description": "malformed JSON", "content": _PROBLEM},
                     "409": {"description": "the name is a shared workflow's (workflow-name-taken), or has 1,000 "
                                            "versions (too-many-versions)", "content": _PROBLEM},
                     "413": {"description": "body larger than RECKON_MAX_BODY_BYTES", "content": _PROBLEM},
                     "415": {"description": "the body is not JSON", "content": _PROBLEM},
                     "422": {"description": "a graph admission refuses, or a parameter naming no node input, a model "
                                            "file, a link, or with a bad bound or default (invalid-workflow)",
                             "content": _PROBLEM},
                     **_AUTH}},
    },
    "/v1/workflows/{ref}": {"get": {
        "summary": "One version (name@version), or the latest (name)",
        "parameters": [{"name": "ref", "in": "path", "required": True,
                        "schema": {"type": "string", "pattern": f"^{REF_RE.pattern}$"}}],
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": VERSION}}},
                      "404": {"description": "no such workflow for this tenant (workflow-not-found)",
                              "content": _PROBLEM}, **_AUTH}}},
}


def add_to(spec: dict[str, Any]) -> None:
    """Add the routes, and ``workflow_ref`` + ``params`` as the alternative to ``workflow`` in a job request."""
    spec["paths"] |= PATHS
    request = spec["components"]["schemas"]["JobRequest"]
    request["required"] = [name for name in request["required"] if name != "workflow"]
    request["properties"] |= {
        "workflow_ref": {"type": "string", "description": "a saved workflow: name@version, or name for the latest"},
        "params": {"type": "object", "description": "values of the saved workflow's parameters"}}
    request["oneOf"] = [{"required": ["workflow"], "properties": {"workflow_ref": False, "params": False}},
                        {"required": ["workflow_ref"], "properties": {"workflow": False}}]
    answers = spec["paths"]["/v1/jobs"]["post"]["responses"]["422"]
    answers["description"] += (", or a workflow_ref naming no saved workflow of the tenant's (workflow-not-found), "
                               "or params the saved workflow refuses, each named in params (invalid-params)")
