"""Submitting a job: one admission script makes exactly one job per idempotency key, then the
job's message is published (or left to the sweeper's outbox when the broker does not answer)."""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import Any, Callable

from pipeline import faultpoints
from pipeline.errors import (
    IdempotencyConflict,
    IdempotencyKeyReused,
    InputUnknown,
    InsufficientAllowance,
    InvalidRequest,
    UnsupportedWorkflow,
)
from pipeline.fleet import attempt_ceiling, highest_per_second, highest_price
from pipeline.inputs import names_in
from pipeline.needs import needs_of
from pipeline.settings import Settings
from pipeline.state import ids
from pipeline.state.jobs import State, cost_plan, fingerprint, first_response, parse_request
from pipeline.state.offers import Routes
from pipeline.state.scripts import Code, ReplicationTimeout
from pipeline.state.admission import FleetLimits
from pipeline.state.store import Admission, Store
from pipeline.state.workflows import Workflows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """A checked job request, ready for the admission script (``Store.admit(tenant, key, job_id, **admit)``)."""

    job_id: str
    priority: str
    record: dict[str, Any]
    lacking_nodes: tuple[str, ...]
    lacking_models: tuple[str, ...]
    admit: dict[str, Any]


@dataclass(frozen=True)
class Submitted:
    job_id: str
    status: int
    body: bytes
    replayed: bool


class Admitter:
    """Turns an authenticated job request into exactly one job per idempotency key."""

    def __init__(
        self, store: Store, publish: Callable[[str, str], None], settings: Settings, *,
        new_job_id: Callable[[str], str] = ids.new_job_id,
    ) -> None:
        self.store = store
        self.publish = publish
        self.settings = settings
        self.new_job_id = new_job_id
        self.limits = FleetLimits.of(settings)
        self.servers = settings.servers()
        #: Which servers can run a workflow (docs/fleet.md "Routing by what a server can run").
        self.routes = Routes(store.redis, [server.name for server in self.servers])
        #: Saved workflows a job names by ``workflow_ref`` (versions kept in this process once read).
        self.workflows = Workflows(store.redis, store.scripts, settings)

    def submit(self, tenant: str, idem_key: str, body: Any) -> Submitted:
        item = self.prepare(tenant, idem_key, body)
        try:
            admission = self.store.admit(tenant, idem_key, item.job_id, **item.admit)
        except ReplicationTimeout as lagging:  # written on the primary, not known to survive it: 503
            if lagging.reply and Code(lagging.reply[0]) is Code.CREATED:
                self._publish(item.job_id, item.priority, idem_key)  # so a retry replays it at once
            raise
        submitted = self.conclude(item, admission)
        if not submitted.replayed:
            faultpoints.reached("after_admit")
            self._publish(item.job_id, item.priority, idem_key)
        return submitted

    def prepare(self, tenant: str, idem_key: str, body: Any) -> Prepared:
        """Everything admission needs, checked before anything is written: a refusal raises here."""
        saved, fingerprinted = None, body
        if isinstance(body, dict) and "workflow_ref" in body:  # a saved workflow: its graph, its needs
            expanded = self.workflows.expand(tenant, body)
            body, fingerprinted, saved = expanded.body, expanded.fingerprinted, expanded.version
        request = parse_request(body, self.settings)
        if request.supersedes and ids.tenant_of(request.supersedes) != tenant:
            raise InvalidRequest("supersedes", "no such job")
        named = names_in(request.workflow)  # checked before anything is written (docs/api.md "Inputs")
        if named.refused:
            raise InputUnknown(named.refused, problem="input-not-allowed")
        needs = saved.needs if saved else needs_of(request.workflow)  # a saved one's: computed when it was saved
        route = self.routes.route(needs)
        # reserved at the highest price of the servers that may run it (docs/costs.md "The reservation")
        able = [s for s in self.servers if route.every or s.name in route.servers] or self.servers
        price, per_second = highest_price(able), highest_per_second(able)
        max_seconds = request.max_seconds or self._class_max_seconds(request.priority)
        if per_second and not max_seconds:  # no bound on what it may cost: refused (docs/costs.md)
            raise InvalidRequest("max_seconds", "required: a server this job may run on charges by the second",
                                 problem="max-seconds-required")
        per_attempt, attempts, ceiling = cost_plan(request, self.settings, price,
                                                   per_attempt=attempt_ceiling(able, request.outputs, max_seconds))
        job_id = self.new_job_id(tenant)
        record = {
            "id": job_id, "tenant": tenant, "state": State.QUEUED.value, "kind": request.kind,
            "priority": request.priority,
            "outputs_requested": request.outputs, "price": price, "ceiling": ceiling,
            "reserved": ceiling, "charged": 0, "uncertain": 0, "settled": 0, "per_attempt": per_attempt,
            "attempts_allowed": attempts, "attempt_count": 0, "lease_gen": 0, "deadline_s": request.deadline_s,
            "idem_key": idem_key, "supersedes": request.supersedes or "",
        }  # created_at, updated_at and deadline: the admission script stamps them on Redis's clock
        if max_seconds:  # bounded seconds: the watcher interrupts an attempt past them; priced when per_second
            record |= {"max_seconds": max_seconds, **({"price_per_second": per_second} if per_second else {})}
        if not route.every:  # only these servers can run it: a claim takes a slot on one of them
            record["servers"] = ",".join(route.servers)
        if named.inputs:  # the job's view lists them; the worker puts each on its server
            record["inputs"] = ",".join(i.sha256 for i in named.inputs)
        if saved:  # for the operator (`reckon job show`): which version it ran, never its parameters
            record["workflow_ref"] = saved.ref
        if needs.checkpoint:  # a claim prefers a server that last loaded it (lua/_slots.lua `take_slot`): a
            record["ckpt"] = hashlib.sha256(needs.checkpoint.encode()).hexdigest()[:16]  # digest, not the name
        admit = dict(
            fingerprint=fingerprint(fingerprinted), ceiling=ceiling,
            fields={k: str(v) for k, v in record.items()}, workflow=request.workflow_json, status=202,
            idem_ttl_s=self.settings.idempotency_ttl_seconds, supersedes=request.supersedes or "",
            outbox_delay_ms=int(self.settings.outbox_grace_seconds * 1000), limits=self.limits,
            replay_only=not route.servers,  # no server can run it: a retry of an admitted request replays
            inputs=named.inputs,
        )
        return Prepared(job_id, request.priority, record, route.lacking.nodes, route.lacking.models, admit)

    def conclude(self, item: Prepared, admission: Admission) -> Submitted:
        """The answer to an admission: the job's first response, or the refusal raised. Nothing published."""
        if admission.code is Code.UNSUPPORTED:  # nothing was written
            raise UnsupportedWorkflow(item.lacking_nodes, item.lacking_models)
        if admission.code is Code.REPLAYED:
            return self._replay(admission)
        if admission.code is Code.IN_PROGRESS:
            raise IdempotencyConflict(admission.job_id)
        if admission.code is Code.FINGERPRINT_MISMATCH:
            raise IdempotencyKeyReused(admission.job_id)
        if admission.code is Code.INSUFFICIENT_ALLOWANCE:
            raise InsufficientAllowance(admission.available, admission.ceiling)
        return Submitted(item.job_id, 202, first_response(item.record | {"created_at": admission.created_ms}), False)

    def _class_max_seconds(self, priority: str) -> int:
        """The class's default ``max_seconds`` (0: none)."""
        return self.settings.max_seconds_interactive if priority == "interactive" else self.settings.max_seconds_batch

    def _publish(self, job_id: str, priority: str, idem_key: str) -> None:
        try:
            self.publish(job_id, priority)
            self.store.confirm_published(job_id, idem_key)
        except Exception:  # the job is admitted and in the outbox: the sweeper publishes it
            log.warning("job %s admitted; publishing left to the sweeper", job_id, exc_info=True)

    def _replay(self, admission: Admission) -> Submitted:
        """The first response again, rebuilt from the job's admission fields (never changed since)."""
        record = self.store.job(admission.job_id)
        if record is None:  # purged: impossible while retention outlasts idempotency records
            raise IdempotencyConflict(admission.job_id)
        return Submitted(admission.job_id, admission.status, first_response(record), True)
