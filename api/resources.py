"""Thin Falcon resources: parse, call the pipeline, set the response."""

from __future__ import annotations

import functools
import logging
import re
from typing import Any, Callable

import falcon
import orjson
import redis

from api import sse
from api.body import read_json
from api.problems import Problem
from api.waiting import Waiter, answer_after_wait
from pipeline.blobs import Blobs
from pipeline.errors import BlobMissing, BlobUnreadable, WrongShards
from pipeline.state import plans, progress, views
from pipeline.state.jobs import State, iso, job_view
from pipeline.state.ids import tenant_of
from pipeline.state.store import Store
from pipeline.state.submit import Admitter, Submitted

log = logging.getLogger(__name__)

#: Validation patterns are used with ``fullmatch``: ``$`` would accept a trailing newline,
#: and ``str.isdigit`` accepts non-ASCII digits ("١٢", "²") that ``int`` reads or refuses.
IDEMPOTENCY_KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
#: Cursors and page sizes: ASCII digits, at most 18 (below 2**63, far below int()'s digit limit).
NUMBER_PARAM_RE = re.compile(r"[0-9]{1,18}")
DEFAULT_PAGE = 50
MAX_PAGE = 200
MAX_CURSOR = 10**18 - 1
#: Index rows a filtered listing reads at most per page before it hands back a cursor.
MAX_SCAN = 1000


def owned_job(store: Store, tenant: str, job_id: str) -> dict[str, str]:
    """The job record's view fields if it belongs to ``tenant``; otherwise 404 (never 403)."""
    try:
        owner = tenant_of(job_id)
    except ValueError:
        owner = None
    record = views.job_record(store.redis, job_id) if owner == tenant else None
    if not record:
        raise Problem(404, "job-not-found", "Job not found")
    return record


def _int_param(req: falcon.Request, name: str, low: int, high: int) -> int | None:
    """A query parameter of ASCII digits from ``low`` to ``high``, None if absent; 400 for anything else."""
    raw = req.get_param(name)
    if raw is None:
        return None
    if not NUMBER_PARAM_RE.fullmatch(raw) or not low <= int(raw) <= high:
        raise Problem(400, "invalid-parameter", "Invalid query parameter", f"{name} must be {low}..{high}", field=name)
    return int(raw)


def resume_after(req: Any) -> int:
    """Where an event stream starts: after ``Last-Event-ID`` (what a reconnecting EventSource sends),
    else after ``?after=``, else from the first event. Both are checked when both are given."""
    after = _int_param(req, "after", 0, MAX_CURSOR) or 0
    last_id = req.get_header("Last-Event-ID")
    if last_id is None:
        return after
    if not NUMBER_PARAM_RE.fullmatch(last_id):
        raise Problem(400, "invalid-parameter", "Invalid header", "Last-Event-ID must be an event seq",
                      field="Last-Event-ID")
    return int(last_id)


def current_view(store: Store, tenant: str, job_id: str) -> dict[str, Any]:
    """The job's view as ``GET /v1/jobs/{id}`` gives it (404 problem if it is not ``tenant``'s)."""
    record = owned_job(store, tenant, job_id)  # with its queue position and ETA while it waits or runs
    return plans.with_plan(job_view(record, store.outputs(job_id), store.attempts(job_id)), store.redis)


def answer_submitted(resp: Any, submitted: Submitted) -> None:
    """The answer to a job's submission: its first response (replayed or not), where it can be read."""
    resp.status = submitted.status
    resp.content_type = falcon.MEDIA_JSON
    resp.data = submitted.body
    resp.location = f"/v1/jobs/{submitted.job_id}"
    if submitted.replayed:
        resp.set_header("Idempotent-Replayed", "true")


def check_idempotency_key(key: str | None) -> str:
    """The request's ``Idempotency-Key``, or the 400 problem that refuses it."""
    if key is None or not IDEMPOTENCY_KEY_RE.fullmatch(key):
        raise Problem(
            400, "idempotency-key-invalid", "Idempotency-Key required",
            "send an Idempotency-Key header of 1 to 255 characters from A-Za-z0-9_.:-",
        )
    return key


class Jobs:
    def __init__(self, admitter: Admitter, store: Store, waiter: Waiter | None = None) -> None:
        self.admitter, self.store, self.waiter = admitter, store, waiter

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        key = check_idempotency_key(req.get_header("Idempotency-Key"))
        body = read_json(req, self.admitter.settings.max_body_bytes)
        submitted = self.admitter.submit(req.context.tenant, key, body)
        answer_submitted(resp, submitted)
        if self.waiter is not None:  # Prefer: wait
            self._wait(req, resp, submitted.job_id)

    def _wait(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        if self.waiter is not None and self.waiter.hold(req, resp, job_id, None):
            answer_after_wait(resp, current_view(self.store, req.context.tenant, job_id), resp.status)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        state = req.get_param("state")
        if state is not None and state not in {s.value for s in State}:
            raise Problem(400, "invalid-parameter", "Invalid query parameter", "unknown state", field="state")
        before = _int_param(req, "cursor", 0, MAX_CURSOR)
        limit = _int_param(req, "limit", 1, MAX_PAGE) or DEFAULT_PAGE
        jobs: list[dict[str, Any]] = []
        rows = self.store.job_page(req.context.tenant, before=before, limit=limit if state is None else MAX_SCAN)
        sequence = {job_id: seq for job_id, seq in rows}
        for record, outputs in views.jobs_with_outputs(self.store.redis, [job_id for job_id, _ in rows]):
            before = sequence[record["id"]]
            if state is None or record["state"] == state:
                jobs.append(job_view(record, outputs))
                if len(jobs) == limit:
                    break
        exhausted = len(rows) < (limit if state is None else MAX_SCAN) and len(jobs) < limit
        resp.media = {"jobs": jobs, "next_cursor": None if exhausted or before is None else str(before)}


class Job:
    def __init__(self, store: Store, waiter: Waiter | None = None) -> None:
        self.store, self.waiter = store, waiter

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        resp.vary = ["Prefer"]
        view = current_view(self.store, req.context.tenant, job_id)
        if self.waiter is not None and self.waiter.hold(req, resp, job_id, view["state"]):
            view = current_view(self.store, req.context.tenant, job_id)
        resp.media = view


class Cancel:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        owned_job(self.store, req.context.tenant, job_id)
        state, _ = self.store.cancel(job_id)
        if state in (State.COMPLETED, State.FAILED):
            raise Problem(409, "job-finished", "Job already finished", f"the job is {state}", state=state)
        record = owned_job(self.store, req.context.tenant, job_id)
        resp.status = falcon.HTTP_200 if state == State.CANCELLED else falcon.HTTP_202
        resp.media = job_view(record, self.store.outputs(job_id))


class Attempts:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        owned_job(self.store, req.context.tenant, job_id)
        attempts = self.store.attempts(job_id)
        if not attempts and views.job_record(self.store.redis, job_id) is None:  # purged since the first read
            raise Problem(404, "job-not-found", "Job not found")
        for attempt in attempts:
            for moment in ("started_at", "submitted_at", "ended_at"):
                attempt[moment] = iso(attempt.get(moment))
        resp.media = {"attempts": attempts}


class Events:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        owned_job(self.store, req.context.tenant, job_id)
        after = _int_param(req, "after", 0, MAX_CURSOR) or 0
        state, events = progress.snapshot(self.store.redis, job_id, after)
        if state is None:  # purged since the first read
            raise Problem(404, "job-not-found", "Job not found")
        resp.media = {"events": [sse.public(e) for e in events]}


class EventStream:
    """The job's events as Server-Sent Events from ``Last-Event-ID`` (else ``?after=``), bounded in
    time and in number per process; 204 once the job is terminal and nothing is left to send; a final
    ``end`` event once ``refusal(key sha256, tenant)`` says why the stream's key is refused."""

    def __init__(self, store: Store, *, max_seconds: float, slots: sse.StreamSlots,
                 refusal: Callable[[str, str], str | None] = lambda digest, tenant: None) -> None:
        self.store, self.max_seconds, self.slots, self.refusal = store, max_seconds, slots, refusal

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str) -> None:
        owned_job(self.store, req.context.tenant, job_id)
        refusal = functools.partial(self.refusal, req.context.key_hash, req.context.tenant)
        after = resume_after(req)
        read = functools.partial(progress.snapshot, self.store.redis, job_id)
        state, events = read(after)
        if state is None:  # purged since owned_job read it
            raise Problem(404, "job-not-found", "Job not found")
        if state in progress.TERMINAL and not events:
            resp.status = falcon.HTTP_204  # an EventSource does not reconnect after a 204
            return
        body = self.slots.open(sse.stream(read, after, max_seconds=self.max_seconds, refusal=refusal))
        if body is None:
            raise Problem(503, "too-many-streams", "Too many event streams",
                          "every event stream of this server is taken; retry, or poll the events with ?after=",
                          headers={"Retry-After": "1"})
        resp.content_type = "text/event-stream"
        resp.cache_control = ["no-store"]
        resp.set_header("X-Accel-Buffering", "no")  # proxies that buffer (nginx) pass each event on at once
        resp.stream = body


class Output:
    def __init__(self, store: Store, blobs: Blobs) -> None:
        self.store, self.blobs = store, blobs

    def on_get(self, req: falcon.Request, resp: falcon.Response, job_id: str, index: int) -> None:
        owned_job(self.store, req.context.tenant, job_id)
        output = self.store.outputs(job_id).get(index)
        if output is None:
            raise Problem(404, "output-not-found", "Output not found", f"no stored output {index}")
        etag = f'"{output["sha256"]}"'
        resp.set_header("ETag", etag)
        if req.get_header("If-None-Match") == etag:
            resp.status = falcon.HTTP_304
            return
        try:
            data = self.blobs.read(output["sha256"])
        except BlobMissing:
            log.error("output %d of job %s is missing from blob storage", index, job_id)
            raise Problem(410, "output-missing", "Output missing",
                          f"output {index} was stored but its bytes are gone") from None
        except BlobUnreadable:
            log.error("output %d of job %s cannot be read from blob storage", index, job_id)
            raise Problem(503, "output-unavailable", "Output unavailable", f"output {index} cannot be read now",
                          headers={"Retry-After": "5"}) from None
        resp.content_type = output["content_type"]
        resp.data = data


class Usage:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = self.store.ledger(req.context.tenant)


class Health:
    public = True

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.media = {"status": "ok"}


class Ready:
    public = True

    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        try:
            self.store.redis.ping()
            self.store.scripts.load()
            self.store.check_shards()
        except redis.RedisError:
            raise Problem(503, "not-ready", "Not ready", "Redis is not reachable") from None
        except WrongShards as exc:  # this process was given another shard count than the deployment's
            raise Problem(503, "not-ready", "Not ready", str(exc)) from None
        resp.media = {"status": "ready", "scripts": self.store.scripts.verbs,
                      "paused_classes": sorted(self.store.class_pauses())}


class Document:
    """Serves a fixed document (the OpenAPI spec)."""

    public = True

    def __init__(self, document: dict[str, Any]) -> None:
        self.data = orjson.dumps(document)

    def on_get(self, req: falcon.Request, resp: falcon.Response) -> None:
        resp.content_type = falcon.MEDIA_JSON
        resp.data = self.data
