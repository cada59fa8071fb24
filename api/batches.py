"""Batches (docs/api.md "Batches"): up to ``MAX_ITEMS`` jobs in one request, each admitted as if
posted alone under its own key; a batch's counts per state and its jobs; cancelling its jobs."""

from __future__ import annotations

import re
from typing import Any, Callable

import falcon
import orjson

from api.body import read_json
from api.problems import Problem
from api.resources import DEFAULT_PAGE, MAX_CURSOR, MAX_PAGE, _int_param
from pipeline.errors import IdempotencyKeyReused, JobNotFound, NotAllowed
from pipeline.state import batches, views
from pipeline.state.batching import BatchAdmitter
from pipeline.state.jobs import MAX_DEPTH, State, fingerprint, job_view
from pipeline.state.progress import TERMINAL
from pipeline.state.store import Store

#: A batch's key leaves room for its items' (``<key>.<index>``) within the 255 characters of a job's.
BATCH_KEY_RE = re.compile(r"[A-Za-z0-9_.:-]{1,250}")
BATCH_ID_RE = re.compile(r"bat_[0-9a-f]{20}")
#: The largest batch body (bytes): 1,000 jobs of 32 KiB each.
MAX_BATCH_BYTES = 32 * 1024 * 1024

ProblemOf = Callable[[Exception], dict[str, Any]]


def _invalid(detail: str) -> Problem:
    return Problem(422, "invalid-batch", "Invalid batch", detail, field="jobs")


def _bodies(body: Any) -> list[Any]:
    """The batch's job bodies, or 422 ``invalid-batch`` (nothing written)."""
    if not isinstance(body, dict) or set(body) != {"jobs"}:
        raise _invalid('the body must be {"jobs": [job, ...]} and nothing else')
    jobs = body["jobs"]
    if not isinstance(jobs, list) or not 1 <= len(jobs) <= batches.MAX_ITEMS:
        raise _invalid(f"jobs must be a list of 1 to {batches.MAX_ITEMS} job requests")
    return jobs


def owned_items(store: Store, tenant: str, batch_id: str) -> list[Any]:
    """The batch's items if it is the tenant's; otherwise 404 (another tenant's batch is not found)."""
    found = batches.items(store.redis, tenant, batch_id) if BATCH_ID_RE.fullmatch(batch_id) else None
    if found is None:
        raise Problem(404, "batch-not-found", "Batch not found")
    return found


class Batches:
    def __init__(self, admitter: BatchAdmitter, store: Store, problem_of: ProblemOf) -> None:
        self.admitter, self.store, self.problem_of = admitter, store, problem_of
        self.settings = admitter.admitter.settings

    def on_post(self, req: falcon.Request, resp: falcon.Response) -> None:
        key = req.get_header("Idempotency-Key")
        if key is None or not BATCH_KEY_RE.fullmatch(key):
            raise Problem(
                400, "idempotency-key-invalid", "Idempotency-Key required",
                "send an Idempotency-Key header of 1 to 250 characters from A-Za-z0-9_.:-",
            )
        bodies = _bodies(read_json(req, MAX_BATCH_BYTES, max_depth=MAX_DEPTH + 2))
        tenant = req.context.tenant
        claim = batches.claim(self.store.redis, tenant, key,
                              batches.batch_fingerprint([fingerprint(b) for b in bodies]),
                              ttl_s=self.settings.idempotency_ttl_seconds)
        fresh: dict[str, bytes] = {}
        items = claim.items
        if items is None:
            results: list[Any] = []
            for outcome in self.admitter.admit(tenant, key, bodies):
                if outcome.submitted is not None:
                    fresh[outcome.submitted.job_id] = outcome.submitted.body
                    results.append(outcome.submitted.job_id)
                elif claim.retried and isinstance(outcome.refused, IdempotencyKeyReused):
                    # an earlier request with this key made the item's job, before a saved workflow named
                    # by its name alone got a new version: the job its own key made is the item's
                    results.append(outcome.refused.args[0])
                else:
                    results.append(self.problem_of(outcome.refused))  # type: ignore[arg-type]
            ttl_ms = max(self.settings.retention_seconds, self.settings.idempotency_ttl_seconds) * 1000
            items = batches.record(self.store.redis, tenant, claim.batch_id, results, ttl_ms=ttl_ms)
            self._cancel_unrecorded(fresh, items)
        else:
            resp.set_header("Idempotent-Replayed", "true")
        job_ids = [item for item in items if isinstance(item, str)]
        responses = fresh if set(job_ids) <= set(fresh) else batches.first_responses(self.store.redis, job_ids)
        resp.status = falcon.HTTP_202
        resp.location = f"/v1/batches/{claim.batch_id}"
        resp.content_type = falcon.MEDIA_JSON
        resp.data = orjson.dumps({"id": claim.batch_id, "items": [
            {"index": index, "job": orjson.Fragment(responses[item]) if item in responses else {"id": item}}
            if isinstance(item, str)
            else {"index": index, "problem": item} for index, item in enumerate(items)]})

    def _cancel_unrecorded(self, fresh: dict[str, bytes], kept: list[Any]) -> None:
        """A request that raced another with the same key made jobs the record kept does not name (an item
        the other found refused, admitted here): cancelled, their reservations released, so the batch's
        record, GET and cancel account for every job its keys made."""
        unrecorded = list(set(fresh) - {item for item in kept if isinstance(item, str)})
        for outcome in self.store.cancel_many(unrecorded) if unrecorded else ():
            if isinstance(outcome, Exception) and not isinstance(outcome, (JobNotFound, NotAllowed)):
                raise outcome


class Batch:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_get(self, req: falcon.Request, resp: falcon.Response, batch_id: str) -> None:
        items = owned_items(self.store, req.context.tenant, batch_id)
        start = _int_param(req, "cursor", 0, MAX_CURSOR) or 0
        limit = _int_param(req, "limit", 1, MAX_PAGE) or DEFAULT_PAGE
        counts, _ = batches.counts(self.store.redis, items)
        page = list(enumerate(items))[start:start + limit]
        views_of = {record["id"]: job_view(record, outputs) for record, outputs
                    in views.jobs_with_outputs(self.store.redis, [i for _, i in page if isinstance(i, str)])}
        resp.media = {
            "id": batch_id, "size": len(items), "counts": counts,
            "items": [{"index": index, "job": views_of.get(item, {"id": item})} if isinstance(item, str)
                      else {"index": index, "problem": item} for index, item in page],
            "next_cursor": str(start + limit) if start + limit < len(items) else None,
        }


class BatchCancel:
    def __init__(self, store: Store) -> None:
        self.store = store

    def on_post(self, req: falcon.Request, resp: falcon.Response, batch_id: str) -> None:
        items = owned_items(self.store, req.context.tenant, batch_id)
        _, records = batches.counts(self.store.redis, items)
        unfinished = [job_id for job_id, record in records.items() if record["state"] not in TERMINAL]
        # each cancelled at once, or asked of the server running it; one that finished since it was read
        # (NotAllowed) or was purged (JobNotFound) is left as it is
        outcomes = self.store.cancel_many(unfinished)
        for outcome in outcomes:
            if isinstance(outcome, Exception) and not isinstance(outcome, (JobNotFound, NotAllowed)):
                raise outcome
        asked = sum(not isinstance(outcome, Exception) and outcome[0] not in (State.COMPLETED, State.FAILED)
                    for outcome in outcomes)
        counts, _ = batches.counts(self.store.redis, items)
        resp.media = {"id": batch_id, "cancel_requested": asked, "counts": counts}
