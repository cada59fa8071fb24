"""Tenants and API keys: plain Redis commands, no scripts, so fakeredis stands in for the server."""

from __future__ import annotations

import fakeredis
import pytest

from pipeline.state import keys
from pipeline.state.tenants import (
    TenantError,
    create_key,
    create_tenant,
    hash_key,
    is_disabled,
    list_keys,
    revoke_key,
    set_disabled,
    set_limits,
    tenant_for_key,
)


@pytest.fixture
def fake() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis(decode_responses=True)


def test_a_key_maps_to_its_tenant_and_only_its_hash_is_stored(fake) -> None:
    create_tenant(fake, "acme", 500)
    api_key = create_key(fake, "acme")
    assert api_key.startswith("rk_") and len(api_key) > 30
    assert tenant_for_key(fake, api_key) == "acme"
    assert tenant_for_key(fake, api_key + "x") is None
    assert fake.keys("reckon:apikey:*") == [keys.api_key(hash_key(api_key))]
    assert fake.hgetall("reckon:{s0}:t:acme:ledger") == {"allowance": "500"}
    assert fake.smembers(keys.ShardKeys(0).tenants) == {"acme"}


@pytest.mark.parametrize(("name", "allowance"),
                         [("Acme", 1), ("a" * 41, 1), ("a.b", 1), ("acme", -1), ("acme\n", 1), ("ａcme", 1)])
def test_bad_tenants_are_refused(fake, name: str, allowance: int) -> None:
    with pytest.raises(TenantError):
        create_tenant(fake, name, allowance)
    assert fake.smembers(keys.ShardKeys(0).tenants) == set()


def test_a_tenant_is_created_once_and_keys_need_a_tenant(fake) -> None:
    create_tenant(fake, "acme", 500)
    with pytest.raises(TenantError):
        create_tenant(fake, "acme", 900)
    assert fake.hget("reckon:{s0}:t:acme:ledger", "allowance") == "500"
    with pytest.raises(TenantError):
        create_key(fake, "globex")


def test_a_key_is_revoked_given_itself_or_its_hash(fake) -> None:
    create_tenant(fake, "acme", 500)
    first, second, third = (create_key(fake, "acme") for _ in range(3))
    assert list_keys(fake, "acme") == sorted(hash_key(k) for k in (first, second, third))
    assert revoke_key(fake, first) == "acme"
    assert revoke_key(fake, hash_key(second)) == "acme"
    assert (tenant_for_key(fake, first), tenant_for_key(fake, second), tenant_for_key(fake, third)) == (
        None, None, "acme")
    assert list_keys(fake, "acme") == [hash_key(third)]
    with pytest.raises(TenantError):
        revoke_key(fake, first)
    with pytest.raises(TenantError):
        list_keys(fake, "globex")


def test_a_disabled_tenant_authenticates_no_key_until_enabled(fake) -> None:
    create_tenant(fake, "acme", 500)
    create_tenant(fake, "globex", 500)
    acme, globex = create_key(fake, "acme"), create_key(fake, "globex")
    set_disabled(fake, "acme", True)
    assert (tenant_for_key(fake, acme), tenant_for_key(fake, globex)) == (None, "globex")
    assert is_disabled(fake, "acme") and fake.exists(keys.tenant_disabled("acme"))
    set_disabled(fake, "acme", False)
    assert tenant_for_key(fake, acme) == "acme" and not is_disabled(fake, "acme")
    with pytest.raises(TenantError):
        set_disabled(fake, "nobody", True)
    assert not fake.exists(keys.tenant_disabled("nobody"))


def test_a_weight_is_stored_for_fair_dispatch_and_a_bad_one_changes_nothing(fake) -> None:
    create_tenant(fake, "acme", 500)
    assert set_limits(fake, "acme", weight=3) == {"weight": "3"}
    assert set_limits(fake, "acme", max_inflight=5, weight=0.5) == {"max_inflight": "5", "weight": "0.5"}
    for bad in (0, -1, 1e-10, 0.0009, 1001, float("nan")):
        with pytest.raises(TenantError):
            set_limits(fake, "acme", weight=bad)
    assert fake.hgetall(keys.TenantKeys("acme").limits) == {"max_inflight": "5", "weight": "0.5"}
