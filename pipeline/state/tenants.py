"""Tenants and their API keys. Redis keeps only the sha256 of a key."""

from __future__ import annotations

import hashlib
import re
import secrets

import redis

from pipeline.errors import ReckonError
from pipeline.state import ids, keys
from pipeline.state.keys import TenantKeys

_SHA256_RE = re.compile(r"[0-9a-f]{64}")


class TenantError(ReckonError):
    pass


#: The largest weight a tenant may have in fair dispatch (the default is 1).
MAX_WEIGHT = 1000.0
#: The smallest: a job's finish tag steps by its cost over the weight, so a weight near 0 would send one
#: interactive tag past the batch band of the parked set (lua/_slots.lua ``finish_tag``).
MIN_WEIGHT = 0.001

#: The fields of a tenant's limits an operator sets (``reckon tenant set``).
LIMITS = ("max_inflight", "rate", "burst", "weight", "input_quota")


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def create_tenant(client: redis.Redis, name: str, allowance: int) -> None:
    """Create a tenant with ``allowance`` cost units; refuses bad names and existing tenants."""
    if not ids.TENANT_RE.fullmatch(name):
        raise TenantError("tenant names are 1-40 characters of a-z, 0-9 and _")
    if allowance < 0:
        raise TenantError("allowance must not be negative")
    with client.pipeline(transaction=True) as pipe:  # one slot: the ledger and its shard's list of tenants
        pipe.hsetnx(TenantKeys(name).ledger, "allowance", allowance)
        pipe.sadd(TenantKeys(name).shard.tenants, name)  # an existing tenant is listed already
        created, _ = pipe.execute()
    if not created:
        raise TenantError(f"tenant {name} exists")


def create_key(client: redis.Redis, tenant: str) -> str:
    """A new API key for ``tenant``; the only time the key itself is seen."""
    _require(client, tenant)
    api_key = "rk_" + secrets.token_urlsafe(24)
    key_hash = hash_key(api_key)
    # Two slots in a cluster: listed first, then live (a key listed but never made live is harmless).
    client.sadd(keys.tenant_api_keys(tenant), key_hash)
    client.set(keys.api_key(key_hash), tenant)
    return api_key


def list_keys(client: redis.Redis, tenant: str) -> list[str]:
    """The sha256 of each key created for ``tenant`` (keys created before this list existed are absent)."""
    _require(client, tenant)
    return sorted(_text(h) for h in client.smembers(keys.tenant_api_keys(tenant)))


def revoke_key(client: redis.Redis, key_or_hash: str) -> str:
    """Revoke an API key given as the key or as its sha256; the tenant it belonged to."""
    key_hash = key_or_hash if _SHA256_RE.fullmatch(key_or_hash) else hash_key(key_or_hash)
    tenant = client.get(keys.api_key(key_hash))
    if tenant is None:
        raise TenantError("no such API key")
    client.delete(keys.api_key(key_hash))  # dead first, then unlisted (see create_key)
    client.srem(keys.tenant_api_keys(_text(tenant)), key_hash)
    return _text(tenant)


def set_disabled(client: redis.Redis, tenant: str, disabled: bool) -> None:
    """Disable a tenant (every one of its keys is refused, reads included) or enable it again."""
    _require(client, tenant)
    if disabled:
        seconds, micros = client.time()
        client.set(keys.tenant_disabled(tenant), seconds * 1000 + micros // 1000, nx=True)
    else:
        client.delete(keys.tenant_disabled(tenant))


def set_limits(client: redis.Redis, tenant: str, *, max_inflight: int | None = None, rate: float | None = None,
               burst: int | None = None, weight: float | None = None,
               input_quota: int | None = None) -> dict[str, str]:
    """Set the tenant's admission limits (None leaves one as it is; 0 removes it): jobs in flight, and a
    submission rate (jobs per second) with its burst (default: the rate, at least 1); and its weight in
    fair dispatch (1 when unset: a tenant of weight 3 is served three times the cost of one of weight 1
    while both wait); and the bytes its uploaded inputs may hold (``input_quota``; 0: back to
    ``RECKON_INPUT_QUOTA_BYTES``). Returns them."""
    _require(client, tenant)
    key = TenantKeys(tenant).limits
    if (max_inflight or 0) < 0 or (rate or 0) < 0 or (burst is not None and burst < 1) or (input_quota or 0) < 0:
        raise TenantError("limits are non-negative (burst at least 1)")
    if weight is not None and not (MIN_WEIGHT <= weight <= MAX_WEIGHT):
        raise TenantError(f"a weight is at least {MIN_WEIGHT:g} and at most {MAX_WEIGHT:g}")
    with client.pipeline(transaction=True) as pipe:
        if max_inflight == 0:
            pipe.hdel(key, "max_inflight")
        elif max_inflight is not None:
            pipe.hset(key, "max_inflight", max_inflight)
        if rate == 0:
            pipe.hdel(key, "rate", "burst", "tokens", "at")
        elif rate is not None:  # a new rate starts with a full bucket
            size = burst or max(1, int(rate))
            pipe.hset(key, mapping={"rate": rate, "burst": size})
            pipe.hdel(key, "tokens", "at")
        elif burst is not None:
            pipe.hset(key, "burst", burst)
        if weight is not None:
            pipe.hset(key, "weight", f"{weight:g}")
        if input_quota == 0:
            pipe.hdel(key, "input_quota")
        elif input_quota is not None:
            pipe.hset(key, "input_quota", input_quota)
        pipe.execute()
    return {_text(k): _text(v) for k, v in client.hgetall(key).items()
            if _text(k) in LIMITS}


def is_disabled(client: redis.Redis, tenant: str) -> bool:
    return bool(client.exists(keys.tenant_disabled(tenant)))


def tenant_for_key(client: redis.Redis, api_key: str) -> str | None:
    """The tenant an API key authenticates, or None (unknown or revoked key, disabled tenant)."""
    return tenant_for_hash(client, hash_key(api_key))


def tenant_for_hash(client: redis.Redis, key_hash: str) -> str | None:
    """The tenant the API key with this sha256 authenticates, or None (as ``tenant_for_key``)."""
    tenant = client.get(keys.api_key(key_hash))
    if tenant is None or is_disabled(client, _text(tenant)):
        return None
    return _text(tenant)


def _require(client: redis.Redis, tenant: str) -> None:
    if not client.exists(TenantKeys(tenant).ledger):
        raise TenantError(f"no tenant {tenant}")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
