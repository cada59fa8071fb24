"""Each input a job's workflow names, put on the server that runs the attempt before its prompt.

For every ``reckon/<sha256>.<ext>`` the workflow names (``pipeline.inputs.names_in``), the server is
asked whether it has the file at that size (``Provider.input_size``: ComfyUI's ``HEAD /view``); if
not, the bytes are read from the blob store and uploaded (``Provider.upload_input``). The check is
the memory: ComfyUI shows no epoch, and an operator may empty its input folder at any moment, so
what a process remembers of a server could be wrong without a sign; the server's own folder cannot
be. A job whose inputs the server has costs one cheap check per input and no Redis command. The only
thing kept per process is each input's size (fixed by its content), so a check needs no blob read.

Everything here happens before the submit mark, under the attempt's lease (checked before each
input, progress reported after). What fails gives the attempt back as ``not_sent`` (nothing was sent
that could run, nothing is charged: ``give_back``), a few times at most; an input whose bytes are
not in the blob store fails the job at once (``input_missing``), uncharged. A prompt ComfyUI refuses
because an input vanished between the check and the prompt (a wiped folder, a restart onto another
disk) gives the attempt back too, never fails the job as invalid input (``submit``).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Any

from pipeline import faultpoints
from pipeline.blobs import Blobs
from pipeline.claims import Claim
from pipeline.errors import (
    BlobMissing,
    BlobUnreadable,
    InputMissing,
    InputNotStaged,
    InvalidInput,
    ProviderAuthFailed,
    ProviderError,
    Unreachable,
)
from pipeline.inputs import InputName, names_in
from pipeline.providers.base import Provider
from pipeline.state.store import Store
from pipeline.work.leases import Held

log = logging.getLogger(__name__)
#: Attempts of one job given back for its inputs (upload refused, input vanished) after which the
#: next such failure fails the job (``input_not_staged``): a server that always refuses uploads does
#: not bounce it for ever.
MAX_GIVEN_BACK = 5
#: How long (ms) an attempt given back for its inputs waits before it is claimed again.
RETRY_MS = 1_000
#: Input sizes a process remembers (sha256 -> bytes), least recently used dropped first.
SIZES_KEPT = 4096


class Staging:
    """Puts a job's inputs on its attempt's server; one per worker process."""

    def __init__(self, store: Store, blobs: Blobs, *, kept: int = SIZES_KEPT) -> None:
        self.store, self.blobs, self.kept = store, blobs, kept
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()  # the process's worker threads share the sizes

    def stage(self, claim: Claim, provider: Provider, heartbeat: Held) -> None:
        """Make sure the server has every input the attempt's workflow names."""
        assert claim.inputs is not None, "an attempt's claim carries its inputs"
        for name in names_in(claim.inputs.workflow).inputs:
            heartbeat.check()
            try:
                self._put(provider, name)
            except (Unreachable, ProviderAuthFailed):  # the server's fault, not the job's: routed as for a prompt
                raise
            except ProviderError as exc:
                raise InputNotStaged(f"input_upload_{exc.reason}") from exc
            heartbeat.progress()

    def submit(self, claim: Claim, provider: Provider, indices: list[int], *, front: bool) -> dict[str, str] | None:
        """``provider.submit``; a refusal (400) while an input is missing from the server is that
        input vanishing since it was checked: nothing was queued, the attempt goes back."""
        assert claim.inputs is not None, "an attempt's claim carries its inputs"
        workflow: dict[str, Any] = claim.inputs.workflow
        try:
            return provider.submit(claim.operation_id, workflow, indices, front=front)
        except InvalidInput as exc:
            try:
                present = all(self._has(provider, name) for name in names_in(workflow).inputs)
            except ProviderError:  # cannot tell: the refusal stands as ComfyUI gave it
                present = True
            if not present:
                raise InputNotStaged("input_vanished") from exc
            raise

    def give_back(self, claim: Claim, exc: InputNotStaged) -> None:
        """End the attempt that could not stage its inputs: not sent and given back (``retry``, free),
        or the job failed, uncharged, when its input is gone or it was given back too often."""
        log.warning("job %s: inputs not on server %s (%s)", claim.job_id, claim.server, exc.reason)
        if isinstance(exc, InputMissing):
            self.store.finish(claim, "failed", error_class=exc.error_class, reason=exc.reason)
            return
        given = sum(1 for a in self.store.attempts(claim.job_id) if a.get("error_class") == exc.error_class)
        if given >= MAX_GIVEN_BACK:
            self.store.finish(claim, "failed", error_class=exc.error_class, reason=exc.reason)
            return
        self.store.retry(claim, delay_ms=RETRY_MS, error_class=exc.error_class, free=True)

    def _put(self, provider: Provider, name: InputName) -> None:
        """Upload ``name`` unless the server has it at its size; a file of another size is ours
        holding other bytes (a truncated upload): replaced."""
        held = provider.input_size(name.filename)
        if held is not None and held == self._size(name.sha256):
            return
        data = self._read(name)
        if held == len(data):
            return
        provider.upload_input(name.filename, data, overwrite=held is not None)
        faultpoints.reached("input_uploaded")

    def _size(self, sha256: str) -> int | None:
        """The input's size if this process read it lately (marked as used now), else None."""
        with self._lock:
            size = self._sizes.get(sha256)
            if size is not None:
                self._sizes.move_to_end(sha256)
            return size

    def _has(self, provider: Provider, name: InputName) -> bool:
        held = provider.input_size(name.filename)
        return held is not None and held == (self._size(name.sha256) or held)

    def _read(self, name: InputName) -> bytes:
        """The input's bytes from the blob store (its size remembered); InputMissing if not there."""
        try:
            data = self.blobs.read(name.sha256)
        except BlobMissing as exc:
            raise InputMissing("input_blob_missing") from exc
        except BlobUnreadable as exc:  # the store failing now: another attempt may read it
            raise InputNotStaged("input_blob_unreadable") from exc
        with self._lock:
            self._sizes[name.sha256] = len(data)
            self._sizes.move_to_end(name.sha256)
            while len(self._sizes) > self.kept:
                self._sizes.popitem(last=False)
        return data
