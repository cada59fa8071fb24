"""The OpenAPI 3.1 document served at /openapi.json; tests check the app against it.

Business rules a client can meet with well-formed data are declared too, so a checker (schemathesis
with every check) can tell a rule from a bug: the answers 402, 409, 410, 413, 415, 422 and 503 are
documented where they occur, and ``document(settings)`` states max_cost's minimum (one attempt at
the configured price) as JSON Schema.
"""

from __future__ import annotations

import copy
from typing import Any

from pipeline.fleet import highest_price
from pipeline.settings import Settings
from pipeline.state.jobs import KINDS, MAX_COST, MAX_DEADLINE_SECONDS, MAX_DEPTH, MAX_OUTPUTS, PRIORITIES
from pipeline.state.ids import JOB_ID_RE
from pipeline.state.records import CURSOR_PATTERN
from pipeline.webhooks.endpoints import EVENT_TYPES, MAX_URL_LENGTH

_SHA256 = {"name": "sha256", "in": "path", "required": True, "schema": {"type": "string"},
           "description": "the input's sha256, 64 lowercase hex digits (anything else: 404)"}
_INPUT = {"type": "object", "required": ["name", "sha256", "bytes", "content_type"], "properties": {
    "name": {"type": "string", "pattern": "^reckon/[0-9a-f]{64}\\.[a-z0-9]{1,8}$",
             "description": "what a workflow writes in LoadImage's or LoadImageMask's image, LoadAudio's audio or "
                            "LoadVideo's file"},
    "sha256": {"type": "string"}, "bytes": {"type": "integer"}, "content_type": {"type": "string"}}}
_UPLOAD_TYPES = ("application/octet-stream", "image/png", "image/jpeg", "image/webp", "image/gif", "audio/wav",
                 "audio/flac", "audio/mpeg", "audio/ogg", "audio/mp4", "video/mp4", "video/webm", "video/quicktime",
                 "video/x-matroska")
STATES = ["queued", "running", "retry_wait", "reconciling", "needs_review", "completed", "failed", "cancelled"]


def _problem(description: str) -> dict[str, Any]:
    return {"description": description,
            "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


#: ``Prefer: wait`` (docs/api.md "Waiting for the result"): held until the job ends or N seconds pass.
_PREFER = {"name": "Prefer", "in": "header", "required": False, "schema": {"type": "string"},
           "description": "RFC 7240; wait or wait=N (seconds, at most 60; wait alone is 60) holds the request until "
                          "the job is completed, failed or cancelled, or N seconds pass; any other wait is ignored"}
_WAITED = {"Preference-Applied": {"description": "wait=N when the request was held", "schema": {"type": "string"}}}
_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}
_UNAVAILABLE = {"503": _problem("job state cannot be read or written now (Retry-After); nothing was changed")}
_AUTH = {"401": _problem("missing, unknown or revoked API key, or a disabled tenant"), **_UNAVAILABLE}
_AUTH_ERRORS = {**_AUTH, "404": _problem("no such job for this tenant")}
_TIME = {"type": "string", "format": "date-time"}
_SPAN = {"type": ["object", "null"], "required": ["earliest", "latest"],  # an ETA range (pipeline/state/plans.py)
         "properties": {"earliest": _TIME, "latest": _TIME}}

#: What the job view's cost shows only when there is something to show (docs/api.md "The job view").
_BOOKED: dict[str, Any] = {
    "attempts": {"type": "array", "items": {"type": "object", "required": ["attempt", "server", "units"],
                                            "properties": {"attempt": {"type": "integer"},
                                                           "server": {"type": ["string", "null"]},
                                                           "units": {"type": "integer"},
                                                           "seconds": {"type": "number"}}}},
    "adjusted": {"type": "integer"},
    "adjustments": {"type": "array", "items": {"type": "object", "required": ["id", "attempt", "units", "reason", "at"],
                                               "properties": {"id": {"type": "string"},
                                                              "attempt": {"type": ["integer", "null"]},
                                                              "units": {"type": "integer"},
                                                              "reason": {"type": "string"},
                                                              "at": {"type": "string", "format": "date-time"}}}},
}
_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
_AFTER = {"name": "after", "in": "query", "description": "only events with a higher seq",
          "schema": {"type": "integer", "minimum": 0, "maximum": 10**18 - 1}}

_WEBHOOK_ID = {"name": "webhook_id", "in": "path", "required": True, "schema": {"type": "string"}}
_WEBHOOK_ERRORS = {**_AUTH, "404": _problem("no such webhook endpoint for this tenant (webhook-not-found)")}
_ENDPOINT = {"type": "object", "required": ["id", "url", "types", "created_at", "previous_secret_valid_until"],
             "properties": {"id": {"type": "string"}, "url": {"type": "string"},
                            "types": {"type": "array", "items": {"enum": list(EVENT_TYPES)}},
                            "created_at": {"type": "integer"},
                            "previous_secret_valid_until": {"type": ["integer", "null"]}}}
_WITH_SECRET = {**_ENDPOINT, "required": [*_ENDPOINT["required"], "secret"],
                "properties": {**_ENDPOINT["properties"], "secret": {"type": "string", "pattern": "^whsec_"}}}
#: A URL the API accepts: a host, a port that is a port, no user name, printable ASCII only.
_URL_PATTERN = r"^https?://[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?(?::[1-9][0-9]{0,3})?(?:[/?#][!-~]*)?$"
_WEBHOOK_PATHS: dict[str, Any] = {
    "/v1/webhooks": {
        "get": {"summary": "The tenant's webhook endpoints (never their secrets)",
                "responses": {"200": _json({"type": "object", "required": ["webhooks"], "properties": {
                    "webhooks": {"type": "array", "items": _ENDPOINT}}}), **_AUTH}},
        "post": {"summary": "Add a webhook endpoint; its signing secret is shown in this answer only",
                 "requestBody": {"required": True, "content": {"application/json": {"schema": {
                     "type": "object", "additionalProperties": False, "required": ["url", "types"],
                     "properties": {"url": {"type": "string", "minLength": 1, "maxLength": MAX_URL_LENGTH,
                                            "pattern": _URL_PATTERN,
                                            "description": "private, loopback and link-local hosts are refused "
                                                           "unless the deployment allows them (422)"},
                                    "types": {"type": "array", "minItems": 1,
                                              "items": {"enum": list(EVENT_TYPES)}}}}}}},
                 "responses": {"201": _json(_WITH_SECRET, "added"),
                               "400": _problem("malformed JSON"), "413": _problem("body too large"),
                               "415": _problem("not application/json"),
                               "409": _problem("too-many-webhooks: the tenant has as many endpoints as allowed"),
                               "422": _problem("invalid-webhook (a field named)"), **_AUTH}}},
    "/v1/webhooks/{webhook_id}": {
        "get": {"summary": "One webhook endpoint", "parameters": [_WEBHOOK_ID],
                "responses": {"200": _json(_ENDPOINT), **_WEBHOOK_ERRORS}},
        "delete": {"summary": "Remove a webhook endpoint and its exhausted deliveries", "parameters": [_WEBHOOK_ID],
                   "responses": {"204": {"description": "removed"}, **_WEBHOOK_ERRORS}}},
    "/v1/webhooks/{webhook_id}/rotate": {"post": {
        "summary": "A new signing secret (shown once); the previous one still signs during the overlap",
        "parameters": [_WEBHOOK_ID], "responses": {"200": _json(_WITH_SECRET), **_WEBHOOK_ERRORS}}},
    "/v1/webhooks/{webhook_id}/deliveries": {"get": {
        "summary": "Deliveries whose retries ran out (exhausted), newest first", "parameters": [_WEBHOOK_ID],
        "responses": {"200": _json({"type": "object", "required": ["deliveries"], "properties": {
            "deliveries": {"type": "array", "items": {"type": "object", "required": [
                "id", "type", "job_id", "attempts", "first_attempt_at", "exhausted_at"], "properties": {
                "id": {"type": "string"}, "type": {"enum": list(EVENT_TYPES)}, "job_id": {"type": "string"},
                "attempts": {"type": "integer"}, "first_attempt_at": _TIME, "exhausted_at": _TIME,
                "last_status": {"type": ["integer", "null"]},
                "last_error": {"type": ["string", "null"]}}}}}}), **_WEBHOOK_ERRORS}}},
}

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "reckon", "version": "0.1.0",
             "description": "Reliable execution of expensive AI jobs: one job per intent, exact cost."},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        "schemas": {
            "Problem": {
                "type": "object", "required": ["type", "title", "status"],
                "properties": {"type": {"type": "string"}, "title": {"type": "string"},
                               "status": {"type": "integer"}, "detail": {"type": "string"}},
            },
            "JobRequest": {
                "type": "object", "additionalProperties": False, "required": ["kind", "workflow", "outputs"],
                "properties": {
                    "kind": {"enum": sorted(KINDS)},
                    "workflow": {"type": "object", "minProperties": 1},
                    "outputs": {"type": "integer", "minimum": 1, "maximum": MAX_OUTPUTS},
                    "max_cost": {"type": "integer", "minimum": 1, "maximum": MAX_COST,
                                 "description": "at least outputs x the fleet's highest price per output, else 422"},
                    "deadline_s": {"type": "integer", "minimum": 1, "maximum": MAX_DEADLINE_SECONDS},
                    "priority": {"enum": list(PRIORITIES)},
                    "supersedes": {"type": "string", "pattern": f"^{JOB_ID_RE.pattern}$",
                                   "description": "id of an older job this one replaces"},
                    "max_seconds": {"type": "integer", "minimum": 1, "maximum": MAX_DEADLINE_SECONDS,
                                    "description": "seconds one attempt may execute at its server (interrupted "
                                                   "past them); required when a server priced per second may "
                                                   "run it and its class has no default, else 422"},
                },
            },
            "Job": {
                "type": "object",
                "required": ["id", "state", "kind", "priority", "outputs_requested", "outputs", "attempt_count",
                             "cost", "deadline", "created_at", "updated_at", "error"],
                "properties": {
                    "id": {"type": "string"}, "state": {"enum": STATES}, "kind": {"type": "string"},
                    "priority": {"enum": list(PRIORITIES)},
                    "outputs_requested": {"type": "integer"},
                    "outputs": {"type": "array", "items": {
                        "type": "object", "required": ["index", "sha256", "bytes", "content_type", "href"],
                        "properties": {"index": {"type": "integer"}, "sha256": {"type": "string"},
                                       "bytes": {"type": "integer"}, "content_type": {"type": "string"},
                                       "href": {"type": "string"}}}},
                    "inputs": {"type": "array", "items": {"type": "object", "required": ["sha256"],
                                                          "properties": {"sha256": {"type": "string"}}}},
                    "attempt_count": {"type": "integer"},
                    "cost": {"type": "object", "required": ["price", "ceiling", "reserved", "uncertain", "settled"],
                             "properties": {**{k: {"type": "integer"}
                                               for k in ("price", "ceiling", "reserved", "uncertain", "settled")},
                                            **_BOOKED}},
                    "cancel_requested": {"type": "boolean"},
                    "obsolete": {"type": "boolean"},
                    "external_effect": {"enum": [None, "none", "possible", "occurred"]},
                    "deadline": _TIME, "created_at": _TIME, "updated_at": _TIME,
                    "queue": {"type": ["object", "null"],
                              "properties": {"position": {"type": "integer", "minimum": 0}}},
                    "eta": {"type": ["object", "null"], "properties": {"start": _SPAN, "finish": _SPAN}},
                    "error": {"oneOf": [{"type": "null"}, {
                        "type": "object", "required": ["class", "reason"],
                        "properties": {"class": {"type": "string"}, "reason": {"type": ["string", "null"]},
                                       "detail": {"type": ["object", "null"], "description": (
                                           "what the provider said failed: node_id, class_type, error_type, "
                                           "input_name, message (inputs elided); never the workflow"),
                                           "additionalProperties": {"type": "string"}}}}]},
                },
            },
            "Event": {"oneOf": [
                {"type": "object", "required": ["seq", "at", "type", "from", "to", "reason"],
                 "properties": {"seq": {"type": "integer"}, "at": _TIME, "type": {"const": "state"},
                                "from": {"type": ["string", "null"]}, "to": {"type": "string"},
                                "reason": {"type": "string"}}},
                {"type": "object", "required": ["seq", "at", "type", "attempt", "node", "value", "max"],
                 "properties": {"seq": {"type": "integer"}, "at": _TIME, "type": {"const": "progress"},
                                "attempt": {"type": "integer"}, "node": {"type": "string"},
                                "value": {"type": "number"}, "max": {"type": "number"}}},
            ]},
        },
    },
    "security": [{"bearer": []}],
    "paths": {
        "/v1/jobs": {
            "post": {
                "summary": "Submit a job (idempotent per tenant and Idempotency-Key)",
                "parameters": [{"name": "Idempotency-Key", "in": "header", "required": True,
                                "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,255}$"}}, _PREFER],
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/JobRequest"}}}},
                "responses": {
                    "202": {**_json({"$ref": "#/components/schemas/Job"}, "accepted, or the first response replayed"),
                            "headers": {"Location": {"schema": {"type": "string"}},
                                        "Idempotent-Replayed": {"schema": {"type": "string"}}, **_WAITED}},
                    "200": {**_json({"$ref": "#/components/schemas/Job"}, "held (Prefer: wait) until the job ended"),
                            "headers": {"Location": {"schema": {"type": "string"}},
                                        "Idempotent-Replayed": {"schema": {"type": "string"}}, **_WAITED}},
                    "400": _problem("malformed JSON (malformed-json) or Idempotency-Key (idempotency-key-invalid)"),
                    **_AUTH,
                    "402": _problem("the cost ceiling exceeds the available allowance (insufficient-allowance)"),
                    "429": _problem("over the tenant's limit: jobs in flight (too-many-in-flight) or submission "
                                    "rate (rate-limited); Retry-After says when to try again; nothing was written"),
                    "409": _problem("the first request with this key is still being processed"),
                    "503": _problem("the class's queue is at its cap (queue-full), batch work is shed while "
                                    "interactive jobs wait past their target (load-shed), or job state cannot be "
                                    "read or written now (state-unavailable); Retry-After says when to try "
                                    "again; nothing was written. Or (replication-timeout) the job was written "
                                    "on the primary but no replica confirmed it in time: the same request with "
                                    "the same Idempotency-Key replays it once it is replicated"),
                    "413": _problem("request body larger than RECKON_MAX_BODY_BYTES (payload-too-large)"),
                    "415": _problem("the body is not application/json or application/*+json"),
                    "422": _problem(
                        f"invalid job (invalid-job; nested deeper than {MAX_DEPTH} levels, too large a workflow, "
                        "supersedes naming no job of the tenant), max_cost below one attempt (max-cost-too-low), "
                        "no max_seconds where a server priced per second may run the job (max-seconds-required), "
                        "a member name repeated in one object (duplicate-member), the key used before with "
                        "another request (idempotency-key-reused), or a deadline the backlog ahead of the job "
                        "makes impossible to meet (deadline-infeasible, with estimate_seconds and "
                        "deadline_seconds), or a workflow no server can run (unsupported-workflow, with "
                        "missing_node_classes and missing_models), or a workflow naming an input the tenant has "
                        "not uploaded (input-unknown) or a file no upload made (input-not-allowed), with names"),
                },
            },
            "get": {
                "summary": "List the tenant's jobs, newest first",
                "parameters": [
                    {"name": "state", "in": "query", "schema": {"enum": STATES}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}},
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 200}},
                ],
                "responses": {
                    "200": _json({"type": "object", "required": ["jobs", "next_cursor"], "properties": {
                        "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
                        "next_cursor": {"type": ["string", "null"]}}}),
                    "400": _problem("invalid query parameter"),
                    **_AUTH,
                },
            },
        },
        "/v1/jobs/{job_id}": {"get": {
            "summary": "One job (held until it ends with Prefer: wait)", "parameters": [_JOB_ID, _PREFER],
            "responses": {"200": {**_json({"$ref": "#/components/schemas/Job"}), "headers": _WAITED},
                          **_AUTH_ERRORS}}},
        "/v1/jobs/{job_id}/cancel": {"post": {
            "summary": "Cancel a job (at once if not running; else a cancel request)", "parameters": [_JOB_ID],
            "responses": {"200": _json({"$ref": "#/components/schemas/Job"}, "cancelled"),
                          "202": _json({"$ref": "#/components/schemas/Job"}, "cancel requested while running"),
                          "409": _problem("the job already completed or failed"), **_AUTH_ERRORS}}},
        "/v1/jobs/{job_id}/attempts": {"get": {
            "summary": "The job's append-only attempt records", "parameters": [_JOB_ID],
            "responses": {"200": _json({"type": "object", "required": ["attempts"], "properties": {
                "attempts": {"type": "array", "items": {"type": "object", "required": [
                    "number", "worker", "generation", "provider", "operation_id", "state", "started_at"],
                    "properties": {"number": {"type": "integer"}, "worker": {"type": "string"},
                                   "submitted_at": _NULLABLE_TIME,
                                   "generation": {"type": "integer"}, "provider": {"type": "string"},
                                   "server": {"type": "string", "description": "the fleet server it ran on"},
                                   "operation_id": {"type": "string"}, "state": {"type": "string"},
                                   "started_at": _TIME, "ended_at": _NULLABLE_TIME,
                                   "error_class": {"type": ["string", "null"]},
                                   "seconds_ms": {"type": "integer", "description": "milliseconds of execution "
                                                  "a server priced per second billed (its own timestamps)"}}}}}}),
                          **_AUTH_ERRORS}}},
        "/v1/jobs/{job_id}/events": {"get": {
            "summary": "The job's events (state changes and progress) in seq order", "parameters": [_JOB_ID, _AFTER],
            "responses": {"200": _json({"type": "object", "required": ["events"], "properties": {
                "events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}}}}),
                          "400": _problem("after is not 0..10^18-1 (invalid-parameter)"), **_AUTH_ERRORS}}},
        "/v1/jobs/{job_id}/events/stream": {"get": {
            "summary": "The job's events as Server-Sent Events, until it is terminal; resumable",
            "description": "Each message: `id` the event's seq, `event` its type, `data` the event as in "
                           "/events. A stream ends after RECKON_SSE_MAX_SECONDS; reconnect with Last-Event-ID. "
                           "Once its key is revoked or its tenant disabled it ends with `event: end` (no id), "
                           "`data` the 401 problem saying why.",
            "parameters": [_JOB_ID, _AFTER, {
                "name": "Last-Event-ID", "in": "header", "description": "resume after this seq (over after)",
                "schema": {"type": "string", "pattern": "^[0-9]{1,18}$"}}],
            "responses": {"200": {"description": "the event stream; the schema describes one message",
                                  "content": {"text/event-stream": {"schema": {"oneOf": [{
                                      "type": "object", "required": ["id", "event", "data"], "properties": {
                                          "id": {"type": "string", "pattern": "^[0-9]+$"},
                                          "event": {"enum": ["state", "progress"]},
                                          "data": {"type": "string", "contentMediaType": "application/json",
                                                   "contentSchema": {"$ref": "#/components/schemas/Event"}}}}, {
                                      "type": "object", "required": ["event", "data"], "properties": {
                                          "event": {"const": "end"},
                                          "data": {"type": "string", "contentMediaType": "application/json",
                                                   "contentSchema": {"$ref": "#/components/schemas/Problem"}}}}]}}}},
                          "204": {"description": "the job is terminal and no event is left after the given seq"},
                          "400": _problem("after or Last-Event-ID is not 0..10^18-1 (invalid-parameter)"),
                          **_AUTH_ERRORS,
                          "503": _problem("every event stream of the server is taken (too-many-streams), or job "
                                          "state cannot be read now; Retry-After")}}},
        "/v1/jobs/{job_id}/outputs/{index}": {"get": {
            "summary": "One stored output's bytes; ETag is its sha256",
            "parameters": [_JOB_ID, {"name": "index", "in": "path", "required": True,
                                     "schema": {"type": "integer", "minimum": 0}}],
            "responses": {"200": {"description": "the bytes", "headers": {"ETag": {"schema": {"type": "string"}}},
                                  "content": {"image/png": {"schema": {"type": "string", "format": "binary"}}}},
                          "304": {"description": "not modified"},
                          "410": _problem("the output was stored but its bytes are gone (output-missing)"),
                          **_AUTH_ERRORS}}},
        "/v1/usage": {"get": {
            "summary": "The tenant's ledger",
            "responses": {"200": _json({"type": "object", "required": [
                "allowance", "reserved", "uncertain", "settled", "available"],
                "properties": {k: {"type": "integer"} for k in (
                    "allowance", "reserved", "uncertain", "settled", "available")}}),
                **_AUTH}}},
        "/v1/usage/records": {"get": {
            "summary": "The tenant's bookings (attempt charges, uncertain holds resolved, adjustments), newest first",
            "parameters": [
                {"name": "from", "in": "query", "schema": {"type": "string", "format": "date-time"}},
                {"name": "to", "in": "query", "schema": {"type": "string", "format": "date-time"}},
                {"name": "cursor", "in": "query", "schema": {"type": "string", "pattern": CURSOR_PATTERN}},
                {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 500}}],
            "responses": {"200": _json({"type": "object", "required": ["records", "next_cursor"], "properties": {
                "records": {"type": "array", "items": {"type": "object", "required": [
                    "at", "kind", "booking_id", "job", "units"], "properties": {
                    "at": {"type": "string", "format": "date-time"},
                    "kind": {"type": "string", "enum": ["charge", "uncertain", "adjustment"]},
                    "booking_id": {"type": "string"}, "job": {"type": "string"},
                    "attempt": {"type": ["integer", "null"]}, "server": {"type": ["string", "null"]},
                    "operation_id": {"type": ["string", "null"]}, "seconds": {"type": ["number", "null"]},
                    "units": {"type": "integer"}, "reason": {"type": ["string", "null"]}}}},
                "next_cursor": {"type": ["string", "null"]}}}),
                "400": _problem("a bad from, to, cursor or limit (invalid-parameter)"),
                **_AUTH}}},
        "/v1/inputs": {"post": {
            "summary": "Upload an input (image, audio or video) for the tenant's jobs; its type comes from its bytes",
            "requestBody": {"required": True, "content": {
                t: {"schema": {"type": "string", "format": "binary"}} for t in _UPLOAD_TYPES}},
            "responses": {
                "201": {**_json(_INPUT, "stored: its bytes are durable"),
                        "headers": {"Location": {"schema": {"type": "string"}}}},
                "200": {**_json(_INPUT, "the tenant has these bytes already: the same answer"),
                        "headers": {"Location": {"schema": {"type": "string"}}}},
                "400": _problem("an empty body (input-empty), or one cut short: the client stopped sending "
                                "(input-incomplete)"),
                "413": _problem("larger than RECKON_INPUT_MAX_BYTES (input-too-large, with limit)"),
                "415": _problem("bytes no loader of ComfyUI reads, or not of the type declared (input-type-unsupported)"),
                "507": _problem("the tenant's inputs would hold more than its quota, or it keeps the most inputs "
                                "it may already (input-quota-exceeded, with held, quota, bytes, inputs, max_inputs)"),
                **_AUTH, "503": _problem("job state or the blob store cannot be written now (state-unavailable, "
                                         "input-unavailable); Retry-After; nothing was recorded")}}},
        "/v1/inputs/{sha256}": {
            "parameters": [_SHA256],
            "get": {"summary": "An input's metadata", "responses": {
                "200": _json(_INPUT), **_AUTH, "404": _problem("no such input of the tenant (input-not-found)")}},
            "delete": {"summary": "Delete an input no unfinished job uses", "responses": {
                "204": {"description": "deleted"}, **_AUTH,
                "404": _problem("no such input of the tenant (input-not-found)"),
                "409": _problem("unfinished jobs name it (input-in-use, with jobs)")}}},
        **_WEBHOOK_PATHS,
        "/healthz": {"get": {"summary": "Process up", "security": [],
                             "responses": {"200": _json({"type": "object"})}}},
        "/readyz": {"get": {"summary": "Redis reachable and scripts loaded", "security": [],
                            "responses": {"200": _json({"type": "object"}), "503": _problem("not ready")}}},
        "/openapi.json": {"get": {"summary": "This document", "security": [],
                                  "responses": {"200": _json({"type": "object"})}}},
        "/metrics": {"get": {"summary": "Prometheus exposition", "security": [],
                             "responses": {"200": {"description": "text exposition, no tenant named",
                                                   "content": {"text/plain": {"schema": {"type": "string"}}}},
                                           **_UNAVAILABLE}}},
    },
}


def document(settings: Settings) -> dict[str, Any]:
    """SPEC plus the rules that depend on settings: max_cost, when given, covers one attempt
    (outputs x the price a job is reserved at, the fleet's highest); below that the answer is 422
    max-cost-too-low."""
    spec = copy.deepcopy(SPEC)
    price = highest_price(settings.servers())
    spec["components"]["schemas"]["JobRequest"]["anyOf"] = [
        {"properties": {"max_cost": False}},
        *({"properties": {"outputs": {"const": n}, "max_cost": {"minimum": n * price}}}
          for n in range(1, MAX_OUTPUTS + 1)),
    ]
    return spec
