"""The keys of a shard's webhook deliveries (a part of ``keys.ShardKeys``, kept apart for its size)."""

from __future__ import annotations


class WebhookKeys:
    """Mixed into ``keys.ShardKeys``: every key carries the shard's hash tag (``_k``)."""

    def _k(self, suffix: str) -> str:
        raise NotImplementedError

    @property
    def webhook_outbox(self) -> str:
        """List: JSON webhook events (job, tenant, type, seq, at, attempt, and the job event's own fields), pushed
        by the script that makes the state change (``hook_event`` in lua/_lib.lua), in order."""
        return self._k("webhooks:outbox")

    @property
    def webhook_taking(self) -> str:
        """List: outbox events a webhooks process has moved out (BLMOVE) and not yet fanned out to deliveries."""
        return self._k("webhooks:taking")

    @property
    def webhook_deliveries(self) -> str:
        """Hash: ``<endpoint id>/<message id>`` -> JSON delivery (tenant, job, type, body, attempts, first and
        next try, last error, lease, state pending | exhausted)."""
        return self._k("webhooks:deliveries")

    @property
    def webhook_ready(self) -> str:
        """Sorted set: endpoint id -> when its earliest pending delivery is due (ms; no later than that: a take
        sets it exactly), or when its open circuit lets it be tried again: what a take looks at first."""
        return self._k("webhooks:ready")

    def webhook_due(self, endpoint: str) -> str:
        """Sorted set: ``<endpoint id>/<message id>`` of each of ``endpoint``'s deliveries to try -> when (ms; a
        taken one: when its lease ends); one per endpoint, so one endpoint's backlog never hides another's."""
        return self._k(f"webhooks:due:{endpoint}")

    @property
    def webhook_order(self) -> str:
        """Hash: ``<endpoint id>/<job id>`` -> JSON list of the job's later deliveries to that endpoint, waiting
        behind the one being tried (the field exists while one is): events reach an endpoint in order per job.
        A progress delivery waiting last is replaced by a newer one (``p|`` before its member)."""
        return self._k("webhooks:order")

    def webhook_exhausted(self, endpoint: str) -> str:
        """Sorted set: message id of each delivery to ``endpoint`` whose retries ran out -> when (ms); its
        delivery stays in ``webhook_deliveries`` until redelivered or dropped (the newest 10,000 are kept)."""
        return self._k(f"webhooks:exhausted:{endpoint}")
