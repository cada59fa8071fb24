"""Reads of reckon's Redis state (no script, no write): the mixin ``Store`` inherits."""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.errors import UnknownTenant
from pipeline.state import archive, keys, redisconn
from pipeline.state.inputs import TOTAL
from pipeline.state.keys import SERVER_BLOCKS, JobKeys, TenantKeys


class Reads:
    """Plain reads; ``redis`` is the client of reckon's state database (text replies)."""

    redis: Any

    def server_ms(self, shard: keys.ShardKeys | None = None) -> int:
        """Redis's clock (ms): the one clock that decides leases and due times. On a Cluster each
        primary's clock judges its own shards (their leases were stamped by it): ``shard`` asks
        the primary that holds that shard."""
        if shard is None:
            seconds, micros = self.redis.time()
        else:
            seconds, micros = redisconn.on_node(self.redis, shard.wake, lambda node: node.time())
        return int(seconds) * 1000 + int(micros) // 1000

    def job(self, job_id: str) -> dict[str, str] | None:
        """The job's record (a finished job's fields unpacked, its parts left out: pipeline/state/archive.py), or None."""
        return archive.record(job_id, self.redis.hgetall(JobKeys(job_id).record)) or None

    def _with_archive(self, job_id: str, read: Any) -> tuple[Any, str | None]:
        """``read(pipe, keys)``'s reply and the job's packed value, in one round trip: the live key first, so
        a job packed between the two reads is found packed."""
        j = JobKeys(job_id)
        pipe = self.redis.pipeline(transaction=False)
        read(pipe, j)
        pipe.hget(j.record, archive.FIELD)
        live, packed = pipe.execute()
        return live, packed

    def outputs(self, job_id: str) -> dict[int, dict[str, Any]]:
        return archive.outputs(*self._with_archive(job_id, lambda pipe, j: pipe.hgetall(j.outputs)))

    def jobs_with_outputs(self, job_ids: list[str]) -> list[tuple[dict[str, str], dict[int, dict[str, Any]]]]:
        """(record, outputs) of each existing job, in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for job_id in job_ids:  # outputs first: a job packed between the two reads is found packed
            pipe.hgetall(JobKeys(job_id).outputs)
            pipe.hgetall(JobKeys(job_id).record)
        replies = pipe.execute()
        pairs = [(archive.outputs(live, record.get(archive.FIELD)), archive.record(job_id, record))
                 for job_id, live, record in zip(job_ids, replies[::2], replies[1::2], strict=True)]
        return [(record, outputs) for outputs, record in pairs if record]

    def workflow(self, job_id: str) -> Any:
        """The job's workflow (decoded); None once the job has ended (it is dropped then)."""
        raw = self.redis.get(JobKeys(job_id).workflow)
        return None if raw is None else orjson.loads(raw)

    def referenced_blobs(self) -> set[str]:
        """The sha256 of every output any job still on record holds, and of every uploaded input (one round
        trip per tenant)."""
        digests: set[str] = set()
        for tenant in self.tenants():
            job_ids = self.redis.zrange(TenantKeys(tenant).jobs, 0, -1)
            pipe = self.redis.pipeline(transaction=False)
            pipe.hkeys(TenantKeys(tenant).inputs)  # field `total` aside, each one an input's sha256
            for job_id in job_ids:
                pipe.hgetall(JobKeys(job_id).outputs)
                pipe.hget(JobKeys(job_id).record, archive.FIELD)
            inputs, *replies = pipe.execute()
            digests.update(field for field in inputs if field != TOTAL)
            for live, packed in zip(replies[::2], replies[1::2], strict=True):
                digests.update(output["sha256"] for output in archive.outputs(live, packed).values())
        return digests

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        return archive.attempts(*self._with_archive(job_id, lambda pipe, j: pipe.hgetall(j.attempts)))

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return archive.events(*self._with_archive(job_id, lambda pipe, j: pipe.lrange(j.events, 0, -1)))

    def index(self, key: str, *, until_ms: float = float("inf"), limit: int = 500) -> list[str]:
        """Job ids in a sorted-set index scored up to ``until_ms`` (due first)."""
        return self.redis.zrangebyscore(key, "-inf", until_ms, start=0, num=limit)

    def ledger(self, tenant: str) -> dict[str, int]:
        raw = self.redis.hgetall(TenantKeys(tenant).ledger)
        if not raw:
            raise UnknownTenant(tenant)
        figures = {name: int(raw.get(name, 0)) for name in ("allowance", "reserved", "uncertain", "settled")}
        figures["available"] = figures["allowance"] - figures["reserved"] - figures["uncertain"] - figures["settled"]
        return figures

    def job_page(self, tenant: str, *, before: int | None, limit: int) -> list[tuple[str, int]]:
        """Up to ``limit`` (job id, sequence) pairs, newest first, older than sequence ``before``."""
        top = f"({before}" if before is not None else "+inf"
        rows = self.redis.zrevrangebyscore(TenantKeys(tenant).jobs, top, "-inf", start=0, num=limit, withscores=True)
        return [(job_id, int(score)) for job_id, score in rows]

    def tenants(self) -> list[str]:
        return sorted(set().union(*self._each_shard(lambda pipe, shard: pipe.smembers(shard.tenants))))

    def state_counts(self, tenant: str) -> dict[str, int]:
        return {state: int(n) for state, n in self.redis.hgetall(TenantKeys(tenant).counts).items()}

    def refusal(self, job_id: str) -> dict[str, str] | None:
        """What the server refused of the prompt when it took it (output nodes), or None."""
        reply = self.redis.hmget(JobKeys(job_id).record, archive.hmget_fields(["refusal"]))
        raw = archive.values(job_id, ["refusal"], reply)[0]
        return orjson.loads(raw) if raw else None

    def class_pauses(self) -> dict[str, int]:
        """Paused workload classes (in any shard) -> since when (ms)."""
        return class_pauses(self.fleet_hash())

    def watched(self) -> dict[str, dict[str, Any]]:
        """Job id -> {server, gen, op, attempt} of every prompt waiting at a server (the watch list)."""
        return self.prompts()[0]

    def prompts(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        """The watch list (``watched``) and, from the same read, the prompts reviews left at their servers
        holding a slot: ``<job id>/<operation id>`` -> {server, since} (``k:``, lua/_slots.lua ``keep_slot``)."""
        raw = self.fleet_hash()
        found = {prefix: {field[2:]: orjson.loads(value) for field, value in raw.items() if field.startswith(prefix)}
                 for prefix in ("w:", "k:")}
        return found["w:"], found["k:"]

    def watch_entry(self, job_id: str) -> dict[str, Any] | None:
        """The job's entry in the watch list ({server, gen, op, attempt}), or None if it is not watched."""
        raw = self.redis.hget(JobKeys(job_id).shard.fleet, f"w:{job_id}")
        return orjson.loads(raw) if raw else None

    def fleet(self, caps: dict[str, int]) -> dict[str, dict[str, Any]]:
        """Each server's slots in use, cap, stops (reason -> since, ms) and watched prompts."""
        return fleet_view(self.fleet_hash(), caps)

    def fleet_hash(self) -> dict[str, str]:
        """The fleet hashes of all shards as one (``merge_fleet``)."""
        return merge_fleet(self._each_shard(lambda pipe, shard: pipe.hgetall(shard.fleet)))

    def _each_shard(self, read: Any) -> list[Any]:
        """``read(pipe, shard)`` for every shard, in one pipelined round trip; the replies in shard order."""
        pipe = self.redis.pipeline(transaction=False)
        for shard in keys.shards():
            read(pipe, shard)
        return pipe.execute()


def merge_fleet(hashes: list[dict[str, str]]) -> dict[str, str]:
    """Shards' fleet hashes as one: slots in use (``busy:``) summed; a stop or pause set in any shard
    is set (written to every shard, it may be half-written by a writer that died), since the earliest;
    watched prompts (``w:``) of all shards."""
    merged = dict(hashes[0])
    for raw in hashes[1:]:
        for field, value in raw.items():
            if field.startswith("busy:"):
                merged[field] = str(int(merged.get(field, 0)) + int(value))
            elif field.startswith("w:") or field not in merged:
                merged[field] = value
            elif field.partition(":")[0] in (*SERVER_BLOCKS, "pause_class"):
                merged[field] = str(min(int(merged[field]), int(value)))
    return merged


def class_pauses(raw: dict[str, str]) -> dict[str, int]:
    """Paused workload classes -> since when (ms), from the fleet hash's fields."""
    return {field.removeprefix("pause_class:"): int(since) for field, since in raw.items()
            if field.startswith("pause_class:")}


def fleet_view(raw: dict[str, str], caps: dict[str, int]) -> dict[str, dict[str, Any]]:
    """Each server's slots in use, cap, stops and watched prompts, from the fleet hash's fields."""
    watched = [orjson.loads(value)["server"] for field, value in raw.items() if field.startswith("w:")]
    view: dict[str, dict[str, Any]] = {}
    for name, cap in caps.items():
        stops = {reason: int(since) for reason, since in
                 ((field.partition(":")[0], since) for field, since in raw.items()
                  if field.partition(":")[2] == name) if reason in SERVER_BLOCKS}
        view[name] = {"busy": int(raw.get(f"busy:{name}", 0)), "cap": cap, "stopped": stops,  # across shards too
                      "watched": watched.count(name)}
    return view
