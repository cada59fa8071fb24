"""``reckon keys migrate``: bring a Redis written by an older reckon to today's layout.

Two steps, each safe to repeat. First, a Redis written before shards has its keys renamed into the
shard layout (below). Then every finished job (completed or cancelled) still kept in its several
keys is packed into one, its record (``lua/pack.lua``, as a job that ends now is packed:
pipeline/state/archive.py); dead letters keep their keys, as they do now. A job an earlier version packed
(its parts as JSON in the record's field ``archive``) is put back in its keys first, in one MULTI,
each item's text as it was, and then packed the same way.

Before shards a tenant's keys were ``reckon:{t:<tenant>}:<suffix>`` (its jobs'
``reckon:{t:<tenant>}:job:<id>...``), and the figures, indexes, wake set, fleet hash and admission
settings were single keys (``reckon:stats``...). Run it on the one server that holds them, with
every reckon process stopped: it works by ``RENAME``, key by key, and refuses a Redis that holds
keys of the new layout already, unless told to resume one that was interrupted (every step is
safe to repeat: a key renamed is not found again, the shards' sets and figures are written whole).
With one shard each old key has exactly one new name, so
everything (counters, slots in use, leases) carries over. With more shards the fleet's slots in
use cannot be split between shards: it refuses unless no prompt is in flight, then splits the
tenants, wake entries and parked jobs by shard, copies stops and admission settings to every
shard, and rebuilds each shard's figures from its jobs (``status.rebuild``; counters and
histograms start from zero).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import orjson
import redis

from pipeline.state import archive, keys, status
from pipeline.state.keys import JobKeys, ShardKeys, TenantKeys
from pipeline.state.scripts import Scripts

_OLD_TENANT_KEY = re.compile(r"reckon:\{t:([a-z0-9_]{1,40})\}:(.+)", re.S)
#: The old single keys, by the ``ShardKeys`` name each became.
OLD_GLOBALS = {"tenants": "reckon:tenants", "stats": "reckon:stats", "queue": "reckon:queue", "due": "reckon:due",
               "admission": "reckon:admission", "wake": "reckon:wake", "fleet": "reckon:fleet",
               "parked": "reckon:fleet:parked", "called": "reckon:fleet:called"}


class MigrationRefused(Exception):
    pass


def new_name(old: str) -> str:
    """The shard-layout name of a tenant's or job's pre-shard key."""
    match = _OLD_TENANT_KEY.fullmatch(old)
    if match is None:
        raise ValueError("not a pre-shard tenant key")
    tenant, rest = match.groups()
    if rest.startswith("job:"):
        job_id, colon, suffix = rest.removeprefix("job:").partition(":")
        return JobKeys(job_id)._k(colon + suffix)
    return TenantKeys(tenant)._k(rest)


def migrate(client: Any, *, dry_run: bool = False, resume: bool = False) -> dict[str, int]:
    """Both steps (see the module's text); returns what was (or would be) moved and packed.
    ``resume``: finish a renaming that was interrupted (the shard layout exists in part)."""
    moved = _to_shards(client, dry_run=dry_run, resume=resume)
    moved["packed"] = pack_finished(client, dry_run=dry_run)
    return moved


def pack_finished(client: Any, *, dry_run: bool = False) -> int:
    """Pack each finished job still in several keys; how many were (or would be) packed. A dry run
    counts those of a Redis before shards too (not renamed yet: the real run renames them first)."""
    scripts, packed = Scripts(client), 0
    for record, archived in _unpacked(client, old_layout=dry_run):
        parts = [f"{record}:{part}" for part in ("attempts", "events", "outputs", "progress", "progress_seen")]
        if dry_run:
            packed += 1
        elif archived is None or _unarchive(client, record):
            reply = scripts("pack", [record, *parts, f"{record}:workflow"], [])
            packed += reply[1] if reply[0] == 0 else 0  # else purged since it was listed
    return packed


def _unarchive(client: Any, record: str) -> bool:
    """A job packed in the earlier form back in its keys (attempts, events, outputs) and without its
    field ``archive``, in one MULTI under WATCH of its record: died after it, the job is found
    unpacked and packed anew; purged meanwhile (False), nothing is written."""
    with client.pipeline(transaction=True) as pipe:
        while True:
            try:
                pipe.watch(record)
                archived = pipe.hget(record, "archive")
                if archived is None:
                    return bool(pipe.exists(record))  # put back already, or purged
                old = orjson.loads(archived)
                pipe.multi()
                pipe.delete(f"{record}:attempts", f"{record}:events", f"{record}:outputs")
                if old["a"]:
                    pipe.hset(f"{record}:attempts", mapping={str(n): orjson.dumps(a) for n, a in enumerate(old["a"], 1)})
                if old["e"]:
                    pipe.rpush(f"{record}:events", *(orjson.dumps(e) for e in old["e"]))
                if old["o"]:
                    pipe.hset(f"{record}:outputs", mapping={index: orjson.dumps(o) for index, o in old["o"].items()})
                pipe.hdel(record, "archive")
                pipe.execute()
                return True
            except redis.WatchError:
                continue


def _unpacked(client: Any, *, old_layout: bool) -> list[tuple[str, str | None]]:
    """(record key, its earlier packed form or None) of the finished jobs (completed, cancelled) not packed
    in today's form yet."""
    indexes = [(TenantKeys(tenant).done, lambda job_id: JobKeys(job_id).record)
               for shard in keys.shards() for tenant in sorted(client.smembers(shard.tenants))]
    if old_layout:
        for key in client.scan_iter(match="reckon:{t:*}:done", count=1000):
            tag = key.removesuffix(":done")
            indexes.append((key, lambda job_id, tag=tag: f"{tag}:job:{job_id}"))
    found = []
    for index, record_of in indexes:
        records = [record_of(job_id) for job_id in client.zrange(index, 0, -1)]
        pipe = client.pipeline(transaction=False)
        for record in records:
            pipe.hmget(record, "state", archive.FIELD, "archive")
        found += [(record, archived) for record, (state, packed, archived) in zip(records, pipe.execute(), strict=True)
                  if state in ("completed", "cancelled") and packed is None]
    return found


def _to_shards(client: Any, *, dry_run: bool, resume: bool) -> dict[str, int]:
    """Rename every pre-shard key, if there are any; what was (or would be) moved."""
    renames = [(old, new_name(old)) for old in client.scan_iter(match="reckon:{t:*", count=1000)]
    found = {name: key for name, key in OLD_GLOBALS.items() if client.exists(key)}
    if not renames and not found:
        return dict(Counter(tenant_keys=0, shared_keys=0, expired=0))
    if not resume and any(key != ShardKeys(0).meta for key in client.scan_iter(match="reckon:{s*", count=1000)):
        raise MigrationRefused("this Redis holds keys of the shard layout already (--resume finishes a migration)")
    if keys.shard_count() > 1:
        fleet = client.hgetall(OLD_GLOBALS["fleet"])
        if any(field.startswith("w:") or (field.startswith("busy:") and int(value)) for field, value in fleet.items()):
            raise MigrationRefused("prompts are in flight: with more than one shard, let them end first")
    moved = Counter(tenant_keys=len(renames), shared_keys=len(found), expired=0)
    if dry_run:
        return dict(moved)
    for old, new in renames:
        moved["expired"] += not _rename(client, old, new)
    if keys.shard_count() == 1:
        for name, old in found.items():
            _rename(client, old, getattr(ShardKeys(0), name))
    else:
        _split(client, found)
    moved["tenant_keys"] -= moved["expired"]
    return dict(moved)


def _rename(client: Any, old: str, new: str) -> bool:
    """RENAME; False if the key is gone (an idempotency record that expired since the SCAN)."""
    try:
        client.rename(old, new)
    except redis.ResponseError as exc:
        if "no such key" not in str(exc).lower():
            raise
        return False
    return True


def _split(client: Any, found: dict[str, str]) -> None:
    """The old single keys over several shards (their tenants' keys are renamed already)."""
    tenants = sorted(client.smembers(found["tenants"])) if "tenants" in found else []
    for tenant in tenants:
        client.sadd(TenantKeys(tenant).shard.tenants, tenant)
    for tenant, due in client.zrange(found["wake"], 0, -1, withscores=True) if "wake" in found else []:
        client.zadd(TenantKeys(tenant).shard.wake, {tenant: due})
    for name in ("parked", "called"):
        for job_id, score in client.zrange(found[name], 0, -1, withscores=True) if name in found else []:
            client.zadd(getattr(JobKeys(job_id).shard, name), {job_id: score})
    stops = {field: value for field, value in client.hgetall(found.get("fleet", "-")).items()
             if field.partition(":")[0] in (*keys.SERVER_BLOCKS, "pause_class")}
    settings = client.hgetall(found.get("admission", "-"))
    for shard in keys.shards():
        if stops:
            client.hset(shard.fleet, mapping=stops)
        if settings:
            client.hset(shard.admission, mapping=settings)
    status.rebuild(client, tenants)
    client.delete(*found.values())
