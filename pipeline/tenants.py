"""Tenants and their API keys. Redis keeps only the sha256 of a key."""

from __future__ import annotations

import hashlib
import secrets

import redis

from . import keys
from .errors import ReckonError
from .keys import TenantKeys


class TenantError(ReckonError):
    pass


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def create_tenant(client: redis.Redis, name: str, allowance: int) -> None:
    """Create a tenant with ``allowance`` cost units; refuses bad names and existing tenants."""
    if not keys.TENANT_RE.fullmatch(name):
        raise TenantError("tenant names are 1-40 characters of a-z, 0-9 and _")
    if allowance < 0:
        raise TenantError("allowance must not be negative")
    if not client.hsetnx(TenantKeys(name).ledger, "allowance", allowance):
        raise TenantError(f"tenant {name} exists")
    client.sadd(keys.TENANTS, name)


def create_key(client: redis.Redis, tenant: str) -> str:
    """A new API key for ``tenant``; the only time the key itself is seen."""
    if not client.exists(TenantKeys(tenant).ledger):
        raise TenantError(f"no tenant {tenant}")
    api_key = "rk_" + secrets.token_urlsafe(24)
    client.set(keys.api_key(hash_key(api_key)), tenant)
    return api_key


def tenant_for_key(client: redis.Redis, api_key: str) -> str | None:
    tenant = client.get(keys.api_key(hash_key(api_key)))
    return tenant.decode() if isinstance(tenant, bytes) else tenant
