"""The lease keeper's give-up rule, on an injected clock: a claim past its job's deadline plus the
grace, or whose thread made no progress for the stall time, is no longer renewed and is marked lost.

The keeper's thread runs for real; the tests move its clock and wait for what must follow (a
renewal, a claim marked lost), never sleeping on the chance that a pass ran.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import Counter

import pytest

from pipeline.claims import Claim
from pipeline.errors import StaleLease, Transient
from pipeline.providers import sim as simulated
from pipeline.providers.base import OutputRef
from pipeline.providers.comfyui import ComfyUI
from pipeline.providers.http import HttpTransport
from pipeline.settings import Settings
from pipeline.state.keys import JobKeys
from pipeline.state.store import Store
from pipeline.work.leases import Held, Keeper
from tests.conftest import wait_until
from tests.pipeline.conftest import WORKFLOW

LEASE_MS = 300  # a claim is due for renewal every 0.1 s of the keeper's clock


class Clock:
    """Monotonic seconds that move only when the test says so (far from any host clock)."""

    def __init__(self) -> None:
        self.now = 5_000.0

    def __call__(self) -> float:
        return self.now


class Counting:
    """The store, counting the renewals of each job."""

    def __init__(self, store: Store) -> None:
        self.store, self.renewals = store, Counter[str]()

    def heartbeat(self, claim: Claim, *, lease_ms: int) -> int:
        expires = self.store.heartbeat(claim, lease_ms=lease_ms)
        self.renewals[claim.job_id] += 1
        return expires


def claimed(store: Store, admit, key: str, **body) -> Claim:
    claim = store.claim(admit(key, **body), worker="w", lease_ms=60_000, operation_id=f"op-{key}",
                        servers={"sim": 10})
    assert claim is not None and claim.inputs is not None
    return claim


def renewed(keeper: Keeper, clock: Clock, counting: Counting, held: Held) -> None:
    """Move the clock a renewal on and wait for the keeper to renew ``held``: a pass has run at the new time."""
    before = counting.renewals[held.claim.job_id]
    clock.now += LEASE_MS / 1000
    wait_until(lambda: counting.renewals[held.claim.job_id] > before and not held.renewing, timeout=10)


def keeper_for(store: Store, clock: Clock, **options) -> tuple[Keeper, Counting]:
    counting = Counting(store)
    return Keeper(counting, lease_ms=LEASE_MS, refund=lambda n: None, flush_s=0.02, clock=clock,  # type: ignore[arg-type]
                  **options), counting


def test_a_claim_past_its_deadline_plus_the_grace_is_given_up_and_the_others_kept(store, admit, caplog) -> None:
    clock = Clock()
    keeper, counting = keeper_for(store, clock, grace_s=30, stall_s=10**6)
    late, other = claimed(store, admit, "late", deadline_s=60), claimed(store, admit, "other", deadline_s=3600)
    # the deadline on this host's clock: from Redis's, as the claim saw it (not far from 60 s)
    left = (late.inputs.deadline_ms - late.claimed_ms) / 1000
    assert 58 < left <= 60
    with keeper.hold(late, deadline_ms=late.inputs.deadline_ms) as held, \
            keeper.hold(other, deadline_ms=other.inputs.deadline_ms) as kept:
        assert held.deadline == clock.now + left
        clock.now = held.deadline + 30 - 0.3 - 0.001  # the next pass is still inside the grace
        renewed(keeper, clock, counting, held)
        assert not held.lost.is_set()
        held.check()
        with caplog.at_level(logging.WARNING, logger="pipeline.work.leases"):
            clock.now += 0.002  # past it
            wait_until(held.lost.is_set, timeout=10)
            with pytest.raises(StaleLease):
                held.check()
            renewals, expiry = counting.renewals[late.job_id], store.redis.hget(JobKeys(late.job_id).record,
                                                                                  "lease_expires")
            for _ in range(3):  # passes go on for the other claim; none renews the one given up
                renewed(keeper, clock, counting, kept)
            assert counting.renewals[late.job_id] == renewals
            assert store.redis.hget(JobKeys(late.job_id).record, "lease_expires") == expiry
            assert not kept.lost.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"lease of job {late.job_id} (attempt 1) no longer renewed: its deadline passed 30 s ago; "
                        "the sweeper reconciles it"]
    assert not any(str(WORKFLOW) in message or "KSampler" in message for message in warnings)


def test_a_claim_whose_thread_makes_no_progress_is_given_up(store, admit) -> None:
    clock = Clock()
    keeper, counting = keeper_for(store, clock, grace_s=30, stall_s=10)
    claim = claimed(store, admit, "stuck")
    with keeper.hold(claim) as held:  # no deadline (a reconciliation's claim): only progress counts
        assert held.deadline == float("inf")
        start = clock.now
        clock.now = start + 10 - 0.3 - 0.001  # the next pass is still inside the stall time
        renewed(keeper, clock, counting, held)
        assert not held.lost.is_set()
        held.progress()  # an output stored: the stall time counts from here
        moved = clock.now
        clock.now = moved + 10 - 0.3 - 0.001
        renewed(keeper, clock, counting, held)
        assert not held.lost.is_set()
        clock.now = moved + 10.001
        wait_until(held.lost.is_set, timeout=10)
        with pytest.raises(StaleLease):
            held.check()



@pytest.mark.parametrize("close", [False, True], ids=["keep-alive", "connection-close"])
def test_an_output_download_has_a_total_time_limit_however_steadily_its_bytes_come(sim, close) -> None:
    """One byte every 0.1 s, each inside the 5 s read timeout: cut at the 0.5 s limit, a read that
    failed (Transient, so the executor takes it for an unknown outcome); whole when it comes in time.
    An answer with ``Connection: close`` (its socket detached from the connection) is cut too."""
    sim.sim.files["out.png"] = simulated.png("out")
    comfy = ComfyUI(HttpTransport(sim.url, timeout=5), price_per_output=10, fetch_seconds=0.5)
    ref = OutputRef(0, "out.png")
    sim.sim.faults = [{"kind": "trickle", "path": "/view", "seconds": 0.1, "times": 1, "close": close}]
    began = time.monotonic()
    with pytest.raises(Transient) as caught:
        comfy.fetch(ref)
    assert caught.value.reason == "response_too_slow"
    assert 0.5 <= time.monotonic() - began < 2.0  # not the 9 s the 92 bytes would take
    sim.sim.faults = [{"kind": "trickle", "path": "/view", "seconds": 0.001, "times": 1}]
    assert comfy.fetch(ref) == simulated.png("out")  # 92 bytes in about 0.1 s: inside the limit


def test_the_bounds_come_from_the_environment_and_a_stall_time_must_outlast_a_download() -> None:
    settings = Settings.from_env({"RECKON_DEADLINE_GRACE_SECONDS": "7", "RECKON_STALL_SECONDS": "190",
                                  "RECKON_OUTPUT_FETCH_SECONDS": "30"})
    assert (settings.deadline_grace_seconds, settings.stall_seconds, settings.output_fetch_seconds) == (7, 190, 30)
    assert (Settings().deadline_grace_seconds, Settings().stall_seconds, Settings().output_fetch_seconds) == (
        120, 300, 60)
    with pytest.raises(ValueError, match="RECKON_STALL_SECONDS must be more than RECKON_OUTPUT_FETCH_SECONDS"):
        Settings.from_env({"RECKON_STALL_SECONDS": "60"})  # no more than the 60 s a download may take
    with pytest.raises(ValueError, match=r"RECKON_OUTPUT_FETCH_SECONDS \+ 115"):  # nor its put and record after
        Settings.from_env({"RECKON_OUTPUT_FETCH_SECONDS": "290", "RECKON_STALL_SECONDS": "300"})
    assert Settings.from_env({"RECKON_OUTPUT_FETCH_SECONDS": "180", "RECKON_STALL_SECONDS": "300"}).stall_seconds == 300


#: What a trickling server sends first, then a line of it every 0.1 s until the client hangs up:
#: a header that never ends, chunk trailers that never end, 100 Continue answers that never end.
TRICKLES = {
    "headers": (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nX-Slow: ", b"a"),
    "trailer": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n", b"T: 1\r\n"),
    "continue": (b"", b"HTTP/1.1 100 Continue\r\n\r\n"),
}


@pytest.mark.parametrize("kind", sorted(TRICKLES))
def test_every_read_of_an_answer_counts_against_its_total_limit(kind: str) -> None:
    """Not only the body, and not only downloads: the status line and headers, chunk framing and
    interim answers of any request are read under its total limit, however steadily they come."""
    first, again = TRICKLES[kind]
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            ends = time.monotonic() + 8  # the server's own bound: the test stops whatever the client does
            try:
                conn.sendall(first)
                while not stop.wait(0.1) and time.monotonic() < ends:
                    conn.sendall(again)
            except OSError:  # the client hung up
                pass

    server = threading.Thread(target=trickle)
    server.start()
    try:
        transport = HttpTransport(f"http://127.0.0.1:{listener.getsockname()[1]}", timeout=5, total=0.5)
        began = time.monotonic()
        with pytest.raises(Transient) as caught:
            transport.request("GET", "/history/op")  # a status read: the transport's total limit
        assert caught.value.reason == "response_too_slow"
        assert time.monotonic() - began < 5  # cut at the limit, not at the server's pleasure
    finally:
        stop.set()
        server.join(10)
        listener.close()
