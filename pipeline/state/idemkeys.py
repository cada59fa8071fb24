"""A tenant's keys of its idempotency records and batches (a part of ``keys.TenantKeys``, kept apart for its
size)."""

from __future__ import annotations

import time


class IdempotencyKeys:
    """Mixed into ``keys.TenantKeys``: every key carries the tenant's shard's hash tag (``_k``)."""

    def _k(self, suffix: str) -> str:
        raise NotImplementedError

    def batch(self, batch_id: str) -> str:
        """Hash: a batch (pipeline/state/batches.py): ``items``: JSON, each item's job id or problem."""
        return self._k(f"batch:{batch_id}")

    def batch_claim(self, key: str) -> str:
        """String: ``<batch id> <fingerprint>`` of the batch an Idempotency-Key made, for the idempotency TTL."""
        return self._k(f"batchkey:{key}")

    def idempotency(self, key: str) -> str:
        """String: the idempotency record of ``key`` as earlier versions wrote it (``idem_read`` in
        lua/_idem.lua; a hash of its fields before that), read until it expires; records are now
        fields of ``idempotency_window``."""
        return self._k(f"idem:{key}")

    def idempotency_window(self, window: int) -> str:
        """Hash: Idempotency-Key -> its record and when it expires (``idem_text`` in lua/_idem.lua), for
        the requests admitted in ``window`` (seconds since the epoch // the idempotency TTL); the hash
        expires two TTLs after its last write."""
        return self._k(f"idems:{window}")

    def idempotency_windows(self, now_ms: int | None, ttl_s: int) -> tuple[list[str], int]:
        """The windows a script may find a record of a key in at ``now_ms`` (None: this host's clock), the
        one two before it to the one after, and the first one's number (``idem_windows`` in lua/_idem.lua:
        Redis's clock picks the current one and the one before)."""
        window = (int(time.time() * 1000) if now_ms is None else now_ms) // 1000 // max(1, ttl_s)
        return [self.idempotency_window(window + d) for d in (-2, -1, 0, 1)], window - 2
