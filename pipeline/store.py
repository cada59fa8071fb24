"""Typed access to reckon's Redis state: one method per Lua script, plus reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import redis

from . import keys
from .errors import UnknownTenant
from .keys import JobKeys, TenantKeys
from .scripts import Code, Scripts, raise_for


def connect(url: str) -> redis.Redis:
    """A client for reckon's state database (text replies, hiredis parser when installed)."""
    return redis.Redis.from_url(url, decode_responses=True, health_check_interval=30)


@dataclass(frozen=True)
class Admission:
    code: Code
    job_id: str
    status: int = 0
    body: str = ""
    available: int = 0
    ceiling: int = 0


@dataclass(frozen=True)
class Claim:
    """What a worker holds while it runs one attempt of a job."""

    job_id: str
    generation: int
    attempt: int
    operation_id: str


class Store:
    def __init__(self, client: redis.Redis, scripts: Scripts | None = None) -> None:
        self.redis = client
        self.scripts = scripts or Scripts(client)

    # -- writes (each one Lua script) ---------------------------------------------

    def admit(
        self, tenant: str, idem_key: str, job_id: str, *, fingerprint: str, ceiling: int,
        fields: dict[str, str], body: bytes, status: int, now_ms: int, idem_ttl_s: int,
        outbox_due_ms: int,
    ) -> Admission:
        t, j = TenantKeys(tenant), JobKeys(job_id)
        reply = self.scripts(
            "admit",
            [t.idempotency(idem_key), t.ledger, j.record, t.jobs, t.queued, t.outbox, j.events, t.counts],
            [now_ms, job_id, fingerprint, ceiling, idem_ttl_s, outbox_due_ms,
             orjson.dumps(fields), body, status],
        )
        code = Code(reply[0])
        if code is Code.UNKNOWN_TENANT:
            raise UnknownTenant(tenant)
        if code is Code.INSUFFICIENT_ALLOWANCE:
            return Admission(code, "", available=reply[1], ceiling=reply[2])
        if code is Code.REPLAYED:
            return Admission(code, reply[1], status=reply[2], body=reply[3])
        return Admission(code, reply[1])

    def confirm_published(self, job_id: str, idem_key: str) -> None:
        t = JobKeys(job_id).tenant
        self.scripts("confirm-publish", [t.outbox, t.idempotency(idem_key)], [job_id])

    def claim(
        self, job_id: str, *, worker: str, now_ms: int, lease_ms: int, operation_id: str, provider: str,
    ) -> Claim | None:
        """Claim a queued job; None when it is not claimable (running, terminal, unknown)."""
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts(
            "claim",
            [j.record, t.leases, t.queued, t.outbox, j.attempts, j.events, t.counts],
            [now_ms, worker, lease_ms, operation_id, provider],
        )
        if Code(reply[0]) is not Code.OK:
            return None
        return Claim(job_id, int(reply[1]), int(reply[2]), operation_id)

    def heartbeat(self, claim: Claim, *, now_ms: int, lease_ms: int) -> int:
        j = JobKeys(claim.job_id)
        reply = self._fenced("heartbeat", [j.record, j.tenant.leases], [claim.generation, now_ms, lease_ms])
        return int(reply[1])

    def store_output(self, claim: Claim, index: int, record: dict[str, Any], *, now_ms: int) -> bool:
        j = JobKeys(claim.job_id)
        reply = self._fenced(
            "store-output", [j.record, j.outputs], [claim.generation, now_ms, index, orjson.dumps(record)]
        )
        return bool(reply[1])

    def finish(
        self, claim: Claim, outcome: str, *, cost: int, now_ms: int, error_class: str = "", reason: str = "",
    ) -> None:
        j = JobKeys(claim.job_id)
        t = j.tenant
        self._fenced(
            "finish",
            [j.record, t.ledger, t.leases, j.attempts, j.events, j.outputs, t.counts],
            [claim.generation, now_ms, outcome, cost, error_class, reason or outcome],
        )

    def expire_lease(self, job_id: str, *, now_ms: int) -> str | None:
        """Requeue (or fail) a job whose lease expired; the new state, or None if nothing changed."""
        j = JobKeys(job_id)
        t = j.tenant
        reply = self.scripts(
            "expire-lease",
            [j.record, t.ledger, t.leases, t.queued, t.outbox, j.attempts, j.events, t.counts],
            [now_ms, job_id],
        )
        return reply[1] if Code(reply[0]) is Code.OK else None

    def _fenced(self, verb: str, keys_: list[str], args: list[Any]) -> list[Any]:
        reply = self.scripts(verb, keys_, args)
        code = Code(reply[0])
        if code is not Code.OK:
            if code is Code.STALE_LEASE:
                self.redis.hincrby(keys.STATS, "stale_writes_rejected", 1)
            raise_for(code, reply)
        return reply

    # -- reads --------------------------------------------------------------------

    def job(self, job_id: str) -> dict[str, str] | None:
        record = self.redis.hgetall(JobKeys(job_id).record)
        return record or None

    def outputs(self, job_id: str) -> dict[int, dict[str, Any]]:
        raw = self.redis.hgetall(JobKeys(job_id).outputs)
        return {int(index): orjson.loads(value) for index, value in sorted(raw.items(), key=lambda kv: int(kv[0]))}

    def attempts(self, job_id: str) -> list[dict[str, Any]]:
        raw = self.redis.hgetall(JobKeys(job_id).attempts)
        return [orjson.loads(raw[n]) for n in sorted(raw, key=int)]

    def events(self, job_id: str) -> list[dict[str, Any]]:
        return [orjson.loads(item) for item in self.redis.lrange(JobKeys(job_id).events, 0, -1)]

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
        return sorted(self.redis.smembers(keys.TENANTS))

    def state_counts(self, tenant: str) -> dict[str, int]:
        return {state: int(n) for state, n in self.redis.hgetall(TenantKeys(tenant).counts).items()}
