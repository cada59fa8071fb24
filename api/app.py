"""The Falcon app factory: wires routes, middleware and error handlers, nothing else.

gunicorn serves ``api.app:create_app()`` (see ops/gunicorn.conf.py).
"""

from __future__ import annotations

import logging
import math
from typing import Any, Callable

import falcon
import falcon.media
import orjson
import redis
from redis.exceptions import RedisClusterException

from api import batches, inputs, jobpage, resources, sse, ui, usage, webhooks, workflows
from api.auth import Authenticate
from api.metrics import Metrics
from api.openapi_batches import document
from api.problems import Problem, problem_body, serialize
from api.waiting import Waiter
from pipeline.blobs import open_blobs
from pipeline.errors import (
    DeadlineInfeasible,
    IdempotencyConflict,
    IdempotencyKeyReused,
    InputUnknown,
    InsufficientAllowance,
    InvalidRequest,
    JobNotFound,
    NotAllowed,
    OverLimit,
    ReckonError,
    UnknownTenant,
    UnsupportedWorkflow,
)
from pipeline.settings import Settings
from pipeline.state.redisconn import name_connections
from pipeline.state.inputs import InputStore
from pipeline.state.scripts import ReplicationTimeout
from pipeline.state.store import Store, open_store
from pipeline.state.batching import BatchAdmitter
from pipeline.state.submit import Admitter
from pipeline.webhooks.deliveries import Deliveries
from pipeline.webhooks.endpoints import Endpoints

log = logging.getLogger(__name__)


def create_app(
    settings: Settings | None = None, *, store: Store | None = None,
    publish: Callable[[str, str], None] | None = None,
) -> falcon.App:
    settings = settings or Settings.from_env()
    if store is None:
        name_connections("web")
    store = store or open_store(settings, check=False)  # checked at readiness
    admitter = open_admitter(settings, store, publish)

    auth = Authenticate(store.redis, trust_seconds=settings.auth_cache_seconds)
    app = falcon.App(middleware=[auth])
    json = falcon.media.JSONHandler(dumps=orjson.dumps, loads=orjson.loads)
    app.req_options.media_handlers[falcon.MEDIA_JSON] = json
    app.resp_options.media_handlers[falcon.MEDIA_JSON] = json
    app.set_error_serializer(serialize)
    for exc_type, handler in _ERROR_HANDLERS.items():
        app.add_error_handler(exc_type, handler)

    blobs = open_blobs(settings)
    slots = sse.StreamSlots(settings.sse_max_streams)  # event streams and held requests (Prefer: wait)
    waiter = Waiter(store, slots)
    app.add_route("/v1/jobs", resources.Jobs(admitter, store, waiter))
    app.add_route("/v1/jobs/{job_id}", resources.Job(store, waiter))
    app.add_route("/v1/jobs/{job_id}/cancel", resources.Cancel(store))
    app.add_route("/v1/jobs/{job_id}/attempts", resources.Attempts(store))
    app.add_route("/v1/jobs/{job_id}/events", resources.Events(store))
    app.add_route("/v1/jobs/{job_id}/events/stream", resources.EventStream(
        store, max_seconds=settings.sse_max_seconds, slots=slots,
        refusal=auth.refusal))
    app.add_route("/v1/jobs/{job_id}/outputs/{index:int(min=0)}", resources.Output(store, blobs))
    app.add_route("/v1/batches", batches.Batches(BatchAdmitter(admitter), store, _problem_of))
    app.add_route("/v1/batches/{batch_id}", batches.Batch(store))
    app.add_route("/v1/batches/{batch_id}/cancel", batches.BatchCancel(store))
    stored_inputs = InputStore(store.redis, store.scripts)
    app.add_route("/v1/inputs", inputs.Inputs(stored_inputs, blobs, settings))
    app.add_route("/v1/inputs/{sha256}", inputs.OneInput(stored_inputs))
    app.add_route("/v1/usage", resources.Usage(store))
    app.add_route("/v1/usage/records", usage.UsageRecords(store))
    webhooks.add_routes(app, Endpoints(store), Deliveries(store), settings)
    workflows.add_routes(app, admitter.workflows, settings.max_body_bytes)
    app.add_route("/healthz", resources.Health())
    app.add_route("/readyz", resources.Ready(store))
    app.add_route("/openapi.json", resources.Document(document(settings)))
    app.add_route("/metrics", Metrics(store, settings.caps()))
    app.add_route("/ui", ui.Page(settings.operator_token))
    app.add_route("/ui/status.json", ui.Status(store, settings.operator_token, settings.caps()))
    app.add_route("/ui/jobs", jobpage.Page(settings.operator_token))
    app.add_route("/ui/jobs/{job_id}", jobpage.Page(settings.operator_token))
    app.add_route("/ui/jobs/{job_id}.json", jobpage.Job(store, settings.operator_token))
    app.add_route("/ui/jobs.json", jobpage.Recent(store, settings.operator_token))
    return app


def open_admitter(settings: Settings, store: Store, publish: Callable[[str, str], None] | None = None) -> Admitter:
    """Admission as the API runs it (also the streams process's, api/streams/app.py): publishing each job's
    message to the broker of ``settings`` unless ``publish`` is given."""
    if publish is None:
        from pipeline.work.broker import Publisher, build_broker

        publish = Publisher(build_broker(settings))
    return Admitter(store, publish, settings)


def _problem(build: Callable[[Any], Problem]) -> Callable[..., None]:
    def handler(req: falcon.Request, resp: falcon.Response, exc: Exception, params: dict) -> None:
        raise build(exc)

    return handler


def _problem_of(exc: Exception) -> dict[str, Any]:
    """The problem object the error handlers answer ``exc`` with (a batch's refused item)."""
    handler = next(_ERROR_HANDLERS[cls] for cls in type(exc).__mro__ if cls in _ERROR_HANDLERS)
    try:
        handler(None, None, exc, {})
    except Problem as problem:
        return problem_body(problem)
    raise AssertionError("an error handler answers with a Problem")


def _logged(exc: Exception, problem: Problem) -> Problem:
    log.error("unhandled %s answered %d", type(exc).__name__, problem.status_code, exc_info=exc)
    return problem


#: Status, problem type, title and detail of each admission refusal for load.
_OVER_LIMIT = {
    "rate": (429, "rate-limited", "Over the tenant's limit", "submissions faster than the tenant's rate"),
    "max_inflight": (429, "too-many-in-flight", "Over the tenant's limit",
                     "the tenant has as many jobs in flight as its limit allows"),
    "queue_full": (503, "queue-full", "Queue full",
                   "the queue of this workload class is at its cap; nothing was changed"),
    "load_shed": (503, "load-shed", "Batch work shed",
                  "interactive jobs wait longer than their target, so batch submissions are refused for now"),
}

_ERROR_HANDLERS = {
    InvalidRequest: _problem(lambda e: Problem(422, e.problem, "Invalid job request", e.detail, field=e.field)),
    InputUnknown: _problem(lambda e: Problem(
        422, e.problem, "Input not allowed" if e.problem == "input-not-allowed" else "Unknown input", e.detail,
        field=e.field, names=[name[:200] for name in e.names[:20]])),
    UnsupportedWorkflow: _problem(lambda e: Problem(
        422, e.problem, "No server can run this workflow", e.detail, field=e.field,
        missing_node_classes=list(e.nodes), missing_models=list(e.models))),
    IdempotencyKeyReused: _problem(lambda e: Problem(
        422, "idempotency-key-reused", "Idempotency-Key reused",
        "this key was used before with a different request body")),
    IdempotencyConflict: _problem(lambda e: Problem(
        409, "idempotency-request-in-progress", "Request in progress",
        "the first request with this key is still being processed; retry shortly")),
    OverLimit: _problem(lambda e: Problem(
        *_OVER_LIMIT[e.reason], limit=e.reason, headers={"Retry-After": str(max(1, math.ceil(e.retry_after)))})),
    DeadlineInfeasible: _problem(lambda e: Problem(
        422, "deadline-infeasible", "Deadline cannot be met", str(e),
        estimate_seconds=e.estimate_s, deadline_seconds=e.deadline_s)),
    InsufficientAllowance: _problem(lambda e: Problem(
        402, "insufficient-allowance", "Insufficient allowance", str(e),
        available=e.available, required=e.required)),
    UnknownTenant: _problem(lambda e: Problem(401, "unauthorized", "Authentication required")),
    # the job was purged between a resource's read of it and its action
    JobNotFound: _problem(lambda e: Problem(404, "job-not-found", "Job not found")),
    NotAllowed: _problem(lambda e: Problem(409, "job-state-conflict", "Not allowed in the job's state", str(e))),
    ReplicationTimeout: _problem(lambda e: Problem(
        503, "replication-timeout", "Write not yet replicated",
        "the write reached the primary but no replica confirmed it in time; retry the same request (a "
        "submission with the same Idempotency-Key replays its job once the write is replicated)",
        headers={"Retry-After": "1"})),
    redis.RedisError: _problem(lambda e: Problem(
        503, "state-unavailable", "Service unavailable", "job state cannot be read or written now; nothing was changed",
        headers={"Retry-After": "1"})),
}
# Falcon picks the handler of the nearest class in an error's MRO: this one takes only what no
# other does (a script's unexpected reply), so even a defect answers problem+json, logged.
_ERROR_HANDLERS[ReckonError] = _problem(lambda e: _logged(e, Problem(
    500, "internal-error", "Internal error", "the request could not be completed; retry later")))
# A Redis Cluster none of whose nodes answers raises RedisClusterException, which is no RedisError.
_ERROR_HANDLERS[RedisClusterException] = _ERROR_HANDLERS[redis.RedisError]


def refusal(exc: Exception) -> Problem | None:
    """The problem this process answers for ``exc`` (the handler of the nearest class in its MRO), None
    when no handler takes it: the streams process answers its admissions the same (api/streams/waits.py)."""
    handler = next((_ERROR_HANDLERS[cls] for cls in type(exc).__mro__ if cls in _ERROR_HANDLERS), None)
    if handler is None:
        return None
    try:
        handler(None, None, exc, {})
    except Problem as problem:
        return problem
    return None
