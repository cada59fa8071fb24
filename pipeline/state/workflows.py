"""Saved workflows: immutable numbered versions of a graph with declared parameters, and the job body a
reference to one builds (docs/api.md "Saved workflows").

A workflow is saved for every tenant (owner ``*``, by an operator) or for one tenant (by the operator or the
tenant itself); a name is one or the other, never both (``lua/workflow-save.lua``). A job names one as
``name@version`` or ``name`` (the latest). What a server must have to run a version (node classes, model
files, its checkpoint) is computed when it is saved and kept with it, so a job that uses it is routed
without looking at its graph. Versions never change, so each process keeps those it read: a job naming
``name@version`` read before costs no Redis command; ``name`` costs one (the latest version's number).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import orjson

from pipeline.errors import InvalidRequest, NotAllowed
from pipeline.needs import Needs, needs_of
from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.jobs import parse_request
from pipeline.state.scripts import Code, Scripts
from pipeline.templates import Param, declare, fill

#: A saved workflow's name.
NAME_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
#: ``name`` or ``name@version``.
REF_RE = re.compile(rf"({NAME_RE.pattern})(?:@([1-9][0-9]{{0,5}}))?")
SHARED = "*"
#: Versions an owner keeps of one name at most.
MAX_VERSIONS = 1000
#: Versions a process keeps read (immutable: never stale, only dropped oldest first).
CACHE_SIZE = 512
#: Names a listing shows at most.
MAX_LISTED = 1000


@dataclass(frozen=True)
class Version:
    """One saved version: its graph, parameters and needs."""

    name: str
    owner: str
    version: int
    saved_at: int
    graph: dict[str, Any]
    params: dict[str, Param]
    needs: Needs

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.version}"

    def view(self, *, with_graph: bool) -> dict[str, Any]:
        """What the API and the CLI show; the graph only to its owner (a shared graph is the operator's)."""
        out = {"name": self.name, "version": self.version, "ref": self.ref,
               "owner": "shared" if self.owner == SHARED else "tenant", "saved_at": self.saved_at,
               "params": {name: p.to_json() for name, p in self.params.items()},
               "needs": {"node_classes": sorted(self.needs.nodes),
                         "models": sorted(f"{folder}/{file}" for folder, file in self.needs.models)}}
        return out | ({"workflow": self.graph} if with_graph else {})

    @classmethod
    def of(cls, name: str, owner: str, raw: str | bytes) -> Version:
        data = orjson.loads(raw)
        needs = data["needs"]
        return cls(name, owner, data["version"], data["saved_at"], data["graph"],
                   {n: Param(n, **p) for n, p in data["params"].items()},
                   Needs(frozenset(needs["nodes"]), frozenset(tuple(m) for m in needs["models"]), needs["checkpoint"]))


@dataclass(frozen=True)
class Expanded:
    """A job body with ``workflow_ref`` and ``params`` replaced by the graph they build; ``fingerprinted``: the
    body as sent with the reference resolved to its version (what idempotency compares)."""

    body: dict[str, Any]
    fingerprinted: dict[str, Any]
    version: Version


class NameTaken(NotAllowed):
    """The name is the other kind's: a shared name for a tenant's own workflow, or the reverse."""


class TooManyVersions(NotAllowed):
    """The owner keeps ``MAX_VERSIONS`` of the name already."""


class Workflows:
    """Saves, reads and lists saved workflows; keeps the versions it read."""

    def __init__(self, client: Any, scripts: Scripts, settings: Settings, *, cache_size: int = CACHE_SIZE) -> None:
        self.client, self.scripts, self.settings, self.cache_size = client, scripts, settings, cache_size
        self._cache: OrderedDict[tuple[str, str, int], Version] = OrderedDict()

    def save(self, owner: str, name: str, graph: Any, params: Any) -> tuple[Version, bool]:
        """Save the next version of ``name`` for ``owner`` (``SHARED`` or a tenant); (the version, whether it is
        new: the latest version when it holds the same graph and parameters already). InvalidRequest
        (``invalid-workflow``) for a bad name, graph or parameter; NotAllowed when the name is the other kind's."""
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise InvalidRequest("name", f"must match {NAME_RE.pattern}", problem="invalid-workflow")
        try:  # the graph as admission takes it
            request = parse_request({"kind": "image", "workflow": graph, "outputs": 1}, self.settings)
        except InvalidRequest as exc:
            raise InvalidRequest(exc.field, exc.detail, problem="invalid-workflow") from None
        declared = declare(params, request.workflow)
        needs = needs_of(request.workflow)
        body = orjson.dumps({
            "graph": request.workflow, "params": {n: _stored(p) for n, p in declared.items()},
            "needs": {"nodes": sorted(needs.nodes), "models": sorted(needs.models), "checkpoint": needs.checkpoint}})
        reply = self.scripts("workflow-save", [keys.workflow(name), keys.WORKFLOWS], [owner, name, body, MAX_VERSIONS, hashlib.sha256(body).hexdigest()])
        code = Code(reply[0])
        if code is Code.IN_USE:
            kind = "a shared workflow" if _text(reply[1]) == "shared" else "tenants' own workflows"
            raise NameTaken(f"the name {name} is taken by {kind}")
        if code is Code.LIMITED:
            raise TooManyVersions(f"{name} has {MAX_VERSIONS} versions already: save it under another name")
        if code is Code.REPLAYED:
            return Version.of(name, owner, reply[2]), False
        return Version(name, owner, int(reply[1]), int(reply[2]), request.workflow, declared, needs), True

    def resolve(self, tenant: str, ref: Any) -> Version | None:
        """The version ``ref`` names for ``tenant`` (its own or a shared one), or None. InvalidRequest for a
        malformed reference."""
        match = REF_RE.fullmatch(ref) if isinstance(ref, str) else None
        if match is None:
            raise InvalidRequest("workflow_ref", "must be name or name@version", problem="workflow-not-found")
        name, number = match.group(1), int(match.group(2) or 0)
        key = keys.workflow(name)
        if not number:  # the latest: one command
            mine, shared = self.client.hmget(key, f"{tenant}:latest", f"{SHARED}:latest")
            if not (mine or shared):
                return None
            number = int(mine or shared)
        for owner in (tenant, SHARED):  # get: another thread may drop an entry meanwhile
            if kept := self._cache.get((owner, name, number)):
                return kept
        mine, shared = self.client.hmget(key, f"{tenant}:{number}", f"{SHARED}:{number}")
        if not (mine or shared):
            return None
        version = Version.of(name, tenant if mine else SHARED, mine or shared)
        self._cache[(version.owner, name, number)] = version
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return version

    def expand(self, tenant: str, body: Mapping[str, Any]) -> Expanded:
        """The job body a reference and its parameters build. InvalidRequest (``workflow-not-found``) for a
        reference to nothing the tenant may use; InvalidParams naming each bad parameter."""
        if "workflow" in body:
            raise InvalidRequest("workflow", "send workflow or workflow_ref, not both")
        version = self.resolve(tenant, body["workflow_ref"])
        if version is None:
            raise InvalidRequest("workflow_ref", "no saved workflow of that name and version",
                                 problem="workflow-not-found")
        graph = fill(version.graph, version.params, body.get("params", {}))
        rest = {k: v for k, v in body.items() if k not in ("workflow_ref", "params")}
        return Expanded(rest | {"workflow": graph}, dict(body) | {"workflow_ref": version.ref}, version)

    def listing(self, tenant: str | None) -> list[dict[str, Any]]:
        """Each name ``tenant`` may use (every owner's for None: the operator) with its latest version."""
        names = sorted(_text(n) for n in self.client.smembers(keys.WORKFLOWS))[:MAX_LISTED]
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            pipe.hkeys(keys.workflow(name))
        latest = [(name, field.rpartition(":")[0]) for name, fields in zip(names, pipe.execute())
                  for field in sorted(map(_text, fields)) if field.endswith(":latest")
                  and (tenant is None or field.rpartition(":")[0] in (tenant, SHARED))]
        for name, owner in latest:
            pipe.hget(keys.workflow(name), f"{owner}:latest")
        return [{"name": name, "owner": "shared" if owner == SHARED else "tenant" if tenant else owner,
                 "latest": int(number)} for (name, owner), number in zip(latest, pipe.execute())]


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value

def _stored(param: Param) -> dict[str, Any]:
    return {"node": param.node, "input": param.input, "type": param.type, "low": param.low, "high": param.high,
            "default": param.default, "required": param.required, "description": param.description}
