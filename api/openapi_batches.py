"""The batch routes' part of the OpenAPI document (api/batches.py): ``document(settings)`` is the whole
document served at /openapi.json, api/openapi.py's with these paths added."""

from __future__ import annotations

from typing import Any

from api import openapi, workflowspec
from api.openapi import _AUTH, _json, _problem
from pipeline.settings import Settings
from pipeline.state.batches import MAX_ITEMS

_BATCH_ID = {"name": "batch_id", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "the batch's id, bat_ and 20 hex digits (anything else: 404)"}
_ERRORS = {**_AUTH, "404": _problem("no such batch for this tenant (batch-not-found)")}
_PROBLEM = {"$ref": "#/components/schemas/Problem"}
_COUNTS = {"type": "object", "additionalProperties": {"type": "integer"},
           "description": "jobs per state, and refused: the items that made no job"}
_ITEM = {"type": "object", "required": ["index"], "properties": {
    "index": {"type": "integer"}, "job": {"$ref": "#/components/schemas/Job"}, "problem": _PROBLEM}}

PATHS: dict[str, Any] = {
    "/v1/batches": {"post": {
        "summary": f"Submit 1 to {MAX_ITEMS} jobs, each as if posted alone under <Idempotency-Key>.<index>",
        "parameters": [{"name": "Idempotency-Key", "in": "header", "required": True,
                        "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,250}$"}}],
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["jobs"], "additionalProperties": False, "properties": {
                "jobs": {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": {},
                         "description": "job requests; an item that is not a valid one is refused by itself"}}}}}},
        "responses": {
            "202": {**_json({"type": "object", "required": ["id", "items"], "properties": {
                "id": {"type": "string"}, "items": {"type": "array", "items": _ITEM}}},
                "each item's job (its first response) or problem; a retry with the same key and body replays it"),
                "headers": {"Location": {"schema": {"type": "string"}},
                            "Idempotent-Replayed": {"schema": {"type": "string"}}}},
            "400": _problem("malformed JSON (malformed-json) or Idempotency-Key (idempotency-key-invalid)"),
            **_AUTH,
            "409": _problem("an item's job is still being published by an earlier request with this key; retry"),
            "413": _problem("request body larger than 32 MiB (payload-too-large)"),
            "415": _problem("the body is not application/json or application/*+json"),
            "422": _problem(f"not {{\"jobs\": [1 to {MAX_ITEMS} items]}} (invalid-batch), nested too deep "
                            "(invalid-job), a member name repeated (duplicate-member), or the key used before "
                            "with another body (idempotency-key-reused); nothing was written"),
        },
    }},
    "/v1/batches/{batch_id}": {"get": {
        "summary": "A batch: its jobs' counts per state and a page of its items", "parameters": [
            _BATCH_ID,
            {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
            {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}}],
        "responses": {"200": _json({"type": "object", "required": ["id", "size", "counts", "items", "next_cursor"],
                                    "properties": {"id": {"type": "string"}, "size": {"type": "integer"},
                                                   "counts": _COUNTS, "items": {"type": "array", "items": _ITEM},
                                                   "next_cursor": {"type": ["string", "null"]}}}),
                      "400": _problem("invalid query parameter"), **_ERRORS}}},
    "/v1/batches/{batch_id}/cancel": {"post": {
        "summary": "Cancel the batch's unfinished jobs (at once if not running; else a cancel request)",
        "parameters": [_BATCH_ID],
        "responses": {"200": _json({"type": "object", "required": ["id", "cancel_requested", "counts"],
                                    "properties": {"id": {"type": "string"}, "cancel_requested": {"type": "integer"},
                                                   "counts": _COUNTS}}), **_ERRORS}}},
}


def document(settings: Settings) -> dict[str, Any]:
    spec = openapi.document(settings)
    spec["paths"] |= PATHS
    workflowspec.add_to(spec)
    return spec
