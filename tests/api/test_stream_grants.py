"""The streams process's re-check of its open streams' keys (api/streams/auth.py ``Grants``), against a real
Redis, one server and a Cluster: one pass finds every refused key among the held ones, and costs two
commands however many streams are open (one more per ``MGET_KEYS`` more keys)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import Any

import pytest

from api.auth import DISABLED, REVOKED
from api.streams import auth as streams_auth
from api.streams.auth import Grants
from pipeline.settings import Settings
from pipeline.state.redisconn import async_client
from pipeline.state.tenants import create_key, hash_key, revoke_key, set_disabled

BOTH_BACKENDS = True


def calls(client: Any) -> Counter:
    """Commands Redis ran so far, by name (one server)."""
    return Counter({name[len("cmdstat_"):]: stats["calls"] for name, stats in client.info("commandstats").items()})


@pytest.mark.parametrize("batch", [1000, 16])
def test_one_pass_refuses_exactly_the_revoked_keys_and_the_disabled_tenants_keys(
        redis_client, tenant, settings: Settings, backend: str, request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    monkeypatch.setattr(streams_auth, "MGET_KEYS", batch)  # 16: the 60 keys in 4 MGETs, the 12 tenants in 1
    acme = [tenant("acme")] + [create_key(redis_client, "acme") for _ in range(29)]
    globex = [tenant("globex")] + [create_key(redis_client, "globex") for _ in range(19)]
    wayne = [tenant(f"wayne{i}") for i in range(10)]
    if backend == "cluster":
        settings = dataclasses.replace(settings, redis_cluster=request.getfixturevalue("redis_cluster").spec)

    async def main() -> tuple[dict[str, str | None], Counter, Counter]:
        client = async_client(settings)
        grants = Grants(client, trust_seconds=1.0)
        woken: Counter = Counter()
        try:
            held = {key: grants.hold(hash_key(key), name, lambda key=key: woken.update([key]))
                    for keys, name in [(acme, "acme"), (globex, "globex")] for key in keys}
            held |= {key: grants.hold(hash_key(key), f"wayne{i}", lambda key=key: woken.update([key]))
                     for i, key in enumerate(wayne)}
            await grants.check()  # its connection made: the next pass is counted alone
            revoke_key(redis_client, acme[3])
            revoke_key(redis_client, wayne[7])
            set_disabled(redis_client, "globex", True)
            before = calls(redis_client) if backend == "single" else Counter()
            await grants.check()
            after = calls(redis_client) if backend == "single" else Counter()
            trusted = {key: grants.trusted.get(hash_key(key)) for key in acme + wayne}
            assert all(trusted[key] is not None for key in acme + wayne if key not in (acme[3], wayne[7])), trusted
            assert (trusted[acme[3]], trusted[wayne[7]]) == (None, None)
            return {key: grant.refused for key, grant in held.items()}, woken, after - before
        finally:
            await grants.close()
            await client.aclose()
            if backend == "single":  # a client given its pool leaves it open
                await client.connection_pool.disconnect()

    refused, woken, spent = asyncio.run(main())
    assert refused == {key: REVOKED if key in (acme[3], wayne[7]) else DISABLED if key in globex else None
                       for key in acme + globex + wayne}
    assert woken == Counter([acme[3], wayne[7], *globex])  # each refused stream once, no other
    if backend == "single":  # 60 keys of 12 tenants (and the INFO that counted them)
        assert spent == Counter({"mget": 2 if batch == 1000 else 5, "info": 1})
