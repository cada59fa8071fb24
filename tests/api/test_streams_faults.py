"""The streams process when things go wrong: Redis out of reach while streams are open, a process
given another shard count than the deployment's, and a shard reader that fell behind the trimming
of its stream of changes."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.streams import hub as hubs
from api.streams.hub import Hub, Trimmed
from pipeline.state.keys import ShardKeys
from pipeline.state.store import Store
from tests.client.proxy import Proxy
from tests.conftest import REDIS_PORT, REDIS_URL, wait_until

from .conftest import BIN, ROOT, Streams, auth
from .test_streams import Reader, report, running  # noqa: F401 (a fixture, used by name)


def test_open_streams_outlast_a_network_split_from_redis_and_miss_nothing(
        running, store: Store, tmp_path: Path) -> None:  # noqa: F811 (the fixture imported above)
    held, key = running()
    split = Proxy(REDIS_PORT)  # the streams process reaches Redis only through this
    streams = Streams(tmp_path, RECKON_REDIS_URL=f"redis://127.0.0.1:{split.port}/0",
                      RECKON_STREAMS_PING_SECONDS="1")
    try:
        streams.start()
        job = Reader(streams, f"/v1/jobs/{held.job_id}/events/stream", auth(key))
        tenant = Reader(streams, "/v1/events/stream", auth(key))
        assert [i for i, _, _ in job.take(2)] == ["1", "2"]  # queued, running
        split.split()
        wait_until(lambda: "unreadable" in streams.log.read_text(), timeout=10)  # the reader lost Redis
        report(store, held, 1)  # seq 3, written while the streams process cannot see it
        store.finish(held, "failed", error_class="invalid_input")  # seq 4
        split.heal()
        after = job.rest()  # ends with the job
        assert [(i, e) for i, e, _ in after] == [("3", "progress"), ("4", "state")] and after[1][2]["to"] == "failed"
        assert [(d["job"], d["seq"]) for _, _, d in tenant.take(2)] == [(held.job_id, 3), (held.job_id, 4)]
        job.close()
        tenant.close()
    finally:
        streams.stop(graceful=False)
        split.stop()


def test_a_streams_process_with_another_shard_count_refuses_to_start(store: Store, tmp_path: Path) -> None:
    store.check_shards()  # the deployment records its count: 1
    streams = Streams(tmp_path, RECKON_SHARDS="2")
    with open(streams.log, "ab") as log:
        proc = subprocess.Popen([str(BIN / "gunicorn"), *streams.argv], cwd=ROOT, env=streams.env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        assert proc.wait(timeout=60) != 0
    finally:
        streams.proc = proc
        streams.stop()
    assert "RECKON_SHARDS is 2 but this Redis holds 1 shards" in streams.log.read_text()


class Gated:
    """A reader client whose XREADs wait while ``go`` is clear (a process whose loop stalled)."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.go = inner, asyncio.Event()
        self.go.set()

    async def xread(self, *args: Any, **kwargs: Any) -> Any:
        await self.go.wait()
        return await self.inner.xread(*args, **kwargs)


def test_a_reader_overtaken_by_the_trimming_sends_its_tenant_streams_a_resync(
        redis_client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hubs, "PAGE", 4)  # a page of 4 entries: trimming overtakes a reader 4 behind
    key = ShardKeys(0).changes

    def entry(seq: int) -> dict[str, str]:
        return {"job": "acme.x", "tenant": "acme", "event": f'{{"seq":{seq},"at":1}}'}

    async def main() -> tuple[list[str], list[str]]:
        client = aioredis.from_url(REDIS_URL, decode_responses=True)
        gated = Gated(aioredis.from_url(REDIS_URL, decode_responses=True))
        hub = Hub(client, gated, block_ms=100)
        try:
            await client.xadd(key, entry(1))
            await hub.join(hub.tenants, "acme", 0)
            reader = hub.shards[0]
            cursor = reader.floor
            await client.xadd(key, entry(2))
            while not reader.recent:  # the reader holds entry 2
                await asyncio.sleep(0.01)
            gated.go.clear()
            for seq in range(3, 10):
                await client.xadd(key, entry(seq))
            await client.xtrim(key, maxlen=5, approximate=False)  # 2, 3 and 4 go before the reader reads them
            gated.go.set()
            while reader.recent[-1].raw != entry(9)["event"]:
                await asyncio.sleep(0.01)
            try:
                await hub.changes_after(0, cursor)  # from entry 1: 2, 3 and 4 are lost to it
                lost = []
            except Trimmed:
                lost = ["resync"]
            newer = await hub.changes_after(0, reader.recent[0].id)  # from entry 5, which the reader holds
            return lost, [change.raw for change in newer]
        finally:
            await hub.close()
            await client.aclose()
            await gated.inner.aclose()

    lost, newer = asyncio.run(main())
    assert lost == ["resync"]
    assert newer == [entry(seq)["event"] for seq in (6, 7, 8, 9)]
