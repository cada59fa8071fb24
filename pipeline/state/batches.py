"""A batch's state: the claim its Idempotency-Key makes, and its record of what each item became.

Admission claims the key first (``claim``: ``SET NX GET``, one command): a different body under a key
already claimed is refused before anything else is written. Each item is then admitted as a job of
its own (pipeline/state/batching.py), and the record (``record``: each item's job id or problem) is
written once, by the first request that gets that far (``HSETNX``): a retry replays it, so an item
refused once stays refused. A request that stopped between the two (a crash) leaves a claim without a
record: its retry admits the items again under their own keys, which replay the jobs already made.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from pipeline.errors import IdempotencyKeyReused
from pipeline.state import archive, views
from pipeline.state.jobs import ADMISSION_FIELDS, State, first_response
from pipeline.state.keys import JobKeys, TenantKeys

#: At most this many jobs in one batch (docs/api.md "Batches").
MAX_ITEMS = 1000


def item_key(batch_key: str, index: int) -> str:
    """The Idempotency-Key of a batch's item ``index`` (from 0): ``<batch key>.<index>``."""
    return f"{batch_key}.{index}"


def new_batch_id() -> str:
    return f"bat_{secrets.token_hex(10)}"


def batch_fingerprint(item_fingerprints: Sequence[str]) -> str:
    return hashlib.sha256("\n".join(item_fingerprints).encode()).hexdigest()


@dataclass(frozen=True)
class Claim:
    batch_id: str
    #: Each item's result if the batch's record is written (a replay), else None.
    items: list[Any] | None
    #: The key was claimed before (by an earlier request with the same body): its items' keys are its own.
    retried: bool = False


def claim(client: Any, tenant: str, key: str, fingerprint: str, *, ttl_s: int,
          new_id: str | None = None) -> Claim:
    """The batch ``key`` names: a new one, or the one it made before with the same fingerprint (its
    record, if written); IdempotencyKeyReused, with nothing written, for another fingerprint."""
    t = TenantKeys(tenant)
    batch_id = new_id or new_batch_id()
    earlier = client.set(t.batch_claim(key), f"{batch_id} {fingerprint}", nx=True, ex=ttl_s, get=True)
    if earlier is None:
        return Claim(batch_id, None)
    batch_id, _, claimed = earlier.partition(" ")
    if claimed != fingerprint:
        raise IdempotencyKeyReused(batch_id)
    return Claim(batch_id, items(client, tenant, batch_id), retried=True)


def record(client: Any, tenant: str, batch_id: str, results: list[Any], *, ttl_ms: int) -> list[Any]:
    """Write the batch's record unless a request with the same key wrote it first; the record as kept."""
    key = TenantKeys(tenant).batch(batch_id)
    pipe = client.pipeline(transaction=True)
    pipe.hsetnx(key, "items", orjson.dumps(results))
    pipe.pexpire(key, ttl_ms, nx=True)
    pipe.hget(key, "items")
    kept: list[Any] = orjson.loads(pipe.execute()[-1])
    return kept


def items(client: Any, tenant: str, batch_id: str) -> list[Any] | None:
    """Each item's result (a job id, or its problem object), or None when there is no such batch."""
    raw = client.hget(TenantKeys(tenant).batch(batch_id), "items")
    return None if raw is None else orjson.loads(raw)


def first_responses(client: Any, job_ids: Sequence[str]) -> dict[str, bytes]:
    """Each job's first response (``first_response``), rebuilt from its admission fields in one round trip."""
    names = (*ADMISSION_FIELDS, "inputs")
    pipe = client.pipeline(transaction=False)
    for job_id in job_ids:
        pipe.hmget(JobKeys(job_id).record, archive.hmget_fields(names))
    rebuilt = {}
    for job_id, reply in zip(job_ids, pipe.execute(), strict=True):
        fields = {n: v for n, v in zip(names, archive.values(job_id, names, reply), strict=True) if v is not None}
        if "created_at" in fields:  # purged: impossible while retention outlasts the batch's claim
            rebuilt[job_id] = first_response(fields)
    return rebuilt


def counts(client: Any, items: Sequence[Any]) -> tuple[dict[str, int], dict[str, dict[str, str]]]:
    """A batch's jobs per state (every state) and ``refused`` (its items that made no job), and each job's
    view fields by id, read in one round trip."""
    job_ids = [item for item in items if isinstance(item, str)]
    records = {record["id"]: record for record, _ in views.jobs_with_outputs(client, job_ids)}
    tally = {state.value: 0 for state in State} | {"refused": len(items) - len(job_ids)}
    for record in records.values():
        tally[record["state"]] += 1
    return tally, records
