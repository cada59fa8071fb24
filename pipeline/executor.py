"""One attempt of one job: claim, submit, wait, store outputs, finish. Every write is fenced."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable

import orjson
import redis

from .blobs import BlobStore
from .errors import OperationFailed, ProviderError, StaleLease, UnknownOutcome
from .providers.base import OperationStatus, OutputRef, Provider
from .store import Claim, Store

log = logging.getLogger(__name__)


def worker_name() -> str:
    return f"{socket.gethostname()}/{os.getpid()}/{threading.get_ident()}"


class Heartbeat:
    """Renews a claim's lease every third of its length until stopped or fenced out."""

    def __init__(self, store: Store, claim: Claim, *, lease_ms: int, clock: Callable[[], float]) -> None:
        self.store, self.claim, self.lease_ms, self.clock = store, claim, lease_ms, clock
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{claim.job_id}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def check(self) -> None:
        if self.lost.is_set():
            raise StaleLease("lease lost while running")

    def _run(self) -> None:
        while not self._stop.wait(self.lease_ms / 3000):
            try:
                self.store.heartbeat(self.claim, now_ms=int(self.clock() * 1000), lease_ms=self.lease_ms)
            except StaleLease:
                self.lost.set()
                return
            except redis.RedisError:
                log.warning("heartbeat failed for %s; retrying", self.claim.job_id)


class Executor:
    def __init__(
        self, store: Store, provider: Provider, blobs: BlobStore, *, lease_seconds: float,
        poll_interval: float, clock: Callable[[], float] = time.time,
        new_operation_id: Callable[[], str] = lambda: str(uuid.uuid4()),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.store, self.provider, self.blobs = store, provider, blobs
        self.lease_ms = int(lease_seconds * 1000)
        self.poll_interval = poll_interval
        self.clock, self.new_operation_id, self.sleep = clock, new_operation_id, sleep

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    def run(self, job_id: str, worker: str | None = None) -> bool:
        """Run one attempt if the job is claimable; False for a duplicate or finished job."""
        claim = self.store.claim(
            job_id, worker=worker or worker_name(), now_ms=self.now_ms(), lease_ms=self.lease_ms,
            operation_id=self.new_operation_id(), provider=self.provider.name,
        )
        if claim is None:
            return False
        with Heartbeat(self.store, claim, lease_ms=self.lease_ms, clock=self.clock) as heartbeat:
            try:
                cost = self._attempt(claim, heartbeat)
            except ProviderError as exc:
                self.store.finish(
                    claim, "failed", cost=0, now_ms=self.now_ms(), error_class=exc.error_class, reason=exc.reason
                )
                return True
            self.store.finish(claim, "completed", cost=cost, now_ms=self.now_ms())
        return True

    def _attempt(self, claim: Claim, heartbeat: Heartbeat) -> int:
        """Produce and store every missing output; return the cost to settle."""
        job = self.store.job(claim.job_id)
        assert job is not None, "a claimed job exists"
        requested = int(job["outputs_requested"])
        stored = self.store.outputs(claim.job_id)
        missing = [index for index in range(requested) if index not in stored]
        if missing:
            self.provider.submit(claim.operation_id, orjson.loads(job["workflow"]), missing)
            status = self._wait(claim, heartbeat, int(job["deadline"]))
            if len(status.outputs) < len(missing):
                raise OperationFailed("provider_outputs_missing")
            for ref in status.outputs:
                heartbeat.check()
                self._store_output(claim, ref)
        return requested * self.provider.price_per_output

    def _wait(self, claim: Claim, heartbeat: Heartbeat, deadline_ms: int) -> OperationStatus:
        while True:
            heartbeat.check()
            status = self.provider.status(claim.operation_id)
            if status.state == "completed":
                return status
            if status.state == "failed":
                raise OperationFailed(status.error or "provider_failed")
            if status.state == "unknown":
                raise UnknownOutcome("operation_not_found")
            if self.now_ms() >= deadline_ms:
                raise UnknownOutcome("deadline_exceeded")
            self.sleep(self.poll_interval)

    def _store_output(self, claim: Claim, ref: OutputRef) -> None:
        data = self.provider.fetch(ref)
        digest = self.blobs.put(data)
        record: dict[str, Any] = {"sha256": digest, "bytes": len(data), "content_type": ref.content_type}
        self.store.store_output(claim, ref.index, record, now_ms=self.now_ms())
