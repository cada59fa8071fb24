"""A tenant's uploaded inputs in Redis: each one's record held against the tenant's quota
(lua/input-put.lua), its removal once no unfinished job uses it (lua/input-delete.lua), by the
tenant or by the retention pass, which also prunes large sets of jobs (lua/input-prune.lua), and the
keys admission is given for the inputs a workflow names (lua/admit.lua). The bytes live in the blob store, put by the API before the record is written.
docs/api.md "Inputs" says what a client sees, docs/operations.md "Inputs" what an operator sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import orjson

from pipeline.errors import InputInUse, OverQuota
from pipeline.inputs import InputName
from pipeline.mediatypes import EXTENSIONS, kind_of
from pipeline.settings import DEFAULT_INPUT_MAX_COUNT
from pipeline.state import keys
from pipeline.state.keys import JobKeys, TenantKeys
from pipeline.state.scripts import Code, Scripts

#: What ComfyUI's loaders read (``pipeline.inputs.LOADERS``): every image, audio and video type reckon
#: knows by its bytes (``pipeline.mediatypes.sniff``), SVG aside (no loader takes it).
ACCEPTED = frozenset(t for t in EXTENSIONS if kind_of(t) in ("image", "audio", "video") and t != "image/svg+xml")
#: Inputs the retention pass looks at per shard and pass, at most; the rest wait for the next pass.
EXPIRE_BATCH = 100
#: An input past its retention that an unfinished job still uses is looked at again this much later (ms).
RECHECK_MS = 600_000
#: The retention pass also prunes the sets of jobs of the shard's inputs named since its last pass that hold
#: more than PRUNE_ABOVE jobs, PRUNE_SAMPLE of their members at a time (an input named without pause is never
#: due for expiry, and its set would otherwise grow by every job that names it): their sizes PRUNE_BATCH inputs
#: a round trip, at most PRUNE_BATCHES round trips a pass (the rest from there the next pass).
PRUNE_BATCH = 500
PRUNE_BATCHES = 10
PRUNE_ABOVE = 1000
PRUNE_SAMPLE = 200
#: Times the delete step is tried when jobs keep being admitted naming the input between read and step.
DELETE_TRIES = 5
#: The field of a tenant's inputs hash that holds their bytes (every other field is a sha256).
TOTAL = "total"


@dataclass(frozen=True)
class Input:
    """One uploaded input: what ``POST /v1/inputs`` and ``GET /v1/inputs/{sha256}`` answer."""

    name: str
    sha256: str
    bytes: int
    content_type: str

    @classmethod
    def of(cls, raw: str | bytes) -> Input:
        fields = orjson.loads(raw)
        return cls(fields["name"], fields["sha256"], int(fields["bytes"]), fields["content_type"])

    def view(self) -> dict[str, Any]:
        return {"name": self.name, "sha256": self.sha256, "bytes": self.bytes, "content_type": self.content_type}


def admission_keys(tenant: str, named: Sequence[InputName]) -> tuple[list[str], list[Any]]:
    """The keys and ARGV lua/admit.lua takes beyond its own for a workflow naming ``named`` (none for none)."""
    if not named:
        return [], []
    t = TenantKeys(tenant)
    return ([t.inputs, t.shard.inputs_used, *(t.input_jobs(i.sha256) for i in named)],
            [len(named), *(part for i in named for part in (i.sha256, i.name))])


class InputStore:
    """The inputs of every tenant; one script per write, Redis's clock unless ``now_ms`` is given."""

    def __init__(self, client: Any, scripts: Scripts) -> None:
        self.redis, self.scripts = client, scripts

    def get(self, tenant: str, sha256: str) -> Input | None:
        raw = self.redis.hget(TenantKeys(tenant).inputs, sha256)
        return None if raw is None else Input.of(raw)

    def held(self, tenant: str, default_quota: int) -> tuple[int, int, int]:
        """(bytes the tenant keeps, its quota, inputs it keeps): a read before the blob is put, so that an
        upload the quota refuses anyway writes no blob (the put step checks again, atomically)."""
        t = TenantKeys(tenant)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hget(t.inputs, TOTAL)
        pipe.hget(t.limits, "input_quota")
        pipe.hlen(t.inputs)
        total, quota, fields = pipe.execute()
        return int(total or 0), int(quota) if quota else default_quota, max(0, fields - 1)

    def put(self, tenant: str, item: Input, *, default_quota: int, max_inputs: int = DEFAULT_INPUT_MAX_COUNT,
            now_ms: int | None = None) -> tuple[Input, bool]:
        """Record ``item`` (its bytes are stored already); (the input, whether it is new). OverQuota if the
        tenant's inputs would then hold more bytes than its quota, or it keeps ``max_inputs`` already."""
        t = TenantKeys(tenant)
        reply = self.scripts("input-put", [t.inputs, t.limits, t.shard.inputs_used],
                             ["" if now_ms is None else now_ms, tenant, item.sha256, item.name, item.bytes, item.content_type,
                              default_quota, max_inputs], durable=True)
        code = Code(reply[0])
        if code is Code.OVER_QUOTA:
            raise OverQuota(int(reply[1]), int(reply[2]), item.bytes, int(reply[3]), max_inputs)
        return Input.of(reply[1]), code is Code.CREATED

    def delete(self, tenant: str, sha256: str) -> Input | None:
        """Remove the input; None if the tenant has none of that sha256. InputInUse (naming the jobs) while
        an unfinished job uses it."""
        return self._delete(tenant, sha256, unused_since="", recheck_at="")

    def _delete(self, tenant: str, sha256: str, *, unused_since: int | str, recheck_at: int | str) -> Input | None:
        t = TenantKeys(tenant)
        for _ in range(DELETE_TRIES):
            job_ids = sorted(self.redis.smembers(t.input_jobs(sha256)))
            reply = self.scripts(
                "input-delete", [t.inputs, t.shard.inputs_used, t.input_jobs(sha256),
                                 *(JobKeys(job_id).record for job_id in job_ids)],
                [tenant, sha256, len(job_ids), ",".join(job_ids), unused_since, recheck_at], durable=True)
            code = Code(reply[0])
            if code is Code.OK:
                return Input.of(reply[1])
            if code is Code.IN_USE:
                raise InputInUse(tuple(reply[1:]))
            if code in (Code.NOT_FOUND, Code.NOT_DUE):
                return None
        raise InputInUse(())  # admitted faster than it could be read: in use

    def expire(self, shard: keys.ShardKeys, *, retention_ms: int, now_ms: int,
               limit: int = EXPIRE_BATCH) -> list[str]:
        """Remove the shard's inputs no job has named (nor upload repeated) for ``retention_ms`` and no unfinished
        job uses; ``<tenant>/<sha256>`` of each one removed. One still in use is looked at again RECHECK_MS later."""
        cutoff = now_ms - retention_ms
        due = self.redis.zrangebyscore(shard.inputs_used, "-inf", cutoff, start=0, num=limit)
        removed = []
        for member in due:
            tenant, _, sha256 = member.partition("/")
            try:
                if self._delete(tenant, sha256, unused_since=cutoff, recheck_at=cutoff + RECHECK_MS) is not None:
                    removed.append(member)
            except InputInUse:
                continue
        return removed

    def prune(self, shard: keys.ShardKeys, *, since_ms: int, above: int = PRUNE_ABOVE,
              sample: int = PRUNE_SAMPLE) -> tuple[int, int]:
        """Drop finished jobs from the large sets of the shard's inputs named since ``since_ms``: (how many,
        where the next pass starts). A set grows only when its input is named, and that is the input's last
        use, so these are all the sets that grew. One range read a pass when none was named, then one round
        trip of sizes per PRUNE_BATCH inputs named."""
        removed = 0
        for _ in range(PRUNE_BATCHES):
            named = self.redis.zrangebyscore(shard.inputs_used, since_ms, "+inf", start=0, num=PRUNE_BATCH,
                                             withscores=True)
            if not named:
                break
            sets = [TenantKeys(tenant).input_jobs(sha256)
                    for tenant, _, sha256 in (member.partition("/") for member, _ in named)]
            pipe = self.redis.pipeline(transaction=False)
            for key in sets:
                pipe.scard(key)
            for key, size in zip(sets, pipe.execute(), strict=True):
                if size > above:
                    job_ids = self.redis.srandmember(key, sample)
                    reply = self.scripts("input-prune", [key, *(JobKeys(job_id).record for job_id in job_ids)], job_ids)
                    removed += int(reply[1])
            since_ms = int(named[-1][1]) + 1  # an input named again since has a later last use: not missed
            if len(named) < PRUNE_BATCH:
                break
        return removed, since_ms
