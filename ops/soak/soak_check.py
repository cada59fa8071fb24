"""The promises ops/soak/soak.py checks: ledger snapshots during the run, then every job once drained.

Each check returns the items that break it (an empty list passes); a job item carries its record,
events, attempts and the provider's charges for it, enough to reproduce the finding.
"""

from __future__ import annotations

import bisect
import hashlib
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import redis

from pipeline.blobs.local import BlobStore
from pipeline.state import archive
from pipeline.state.keys import JobKeys, TenantKeys, shards
from pipeline.state.status import audit, merge_stats

TERMINAL = {"completed", "failed", "cancelled"}
AT_REST = TERMINAL | {"needs_review"}
MONEY = ("reserved", "charged", "uncertain", "settled")
#: A client made with ``decode_responses=True``: replies are str, which redis-py's stubs cannot express.
Client = Any


def snapshot(client: Client, tenant: str) -> tuple[dict[str, int], list[dict[str, int]]]:
    """The tenant ledger and every job's buckets, read atomically (MULTI, retried if a job was admitted)."""
    t = TenantKeys(tenant)
    with client.pipeline() as pipe:
        while True:
            try:
                pipe.watch(t.jobs)
                ids = pipe.zrange(t.jobs, 0, -1)
                pipe.multi()
                pipe.hgetall(t.ledger)
                for job_id in ids:
                    pipe.hmget(JobKeys(job_id).record, archive.hmget_fields(MONEY))
                ledger, *replies = pipe.execute()
                rows = [archive.values(job_id, MONEY, reply) for job_id, reply in zip(ids, replies, strict=True)]
                return ({k: int(v) for k, v in ledger.items()},
                        [{k: int(v or 0) for k, v in zip(MONEY, row, strict=True)} for row in rows])
            except redis.WatchError:
                continue


def ledger_problems(ledger: dict[str, int], rows: list[dict[str, int]]) -> list[str]:
    """What is wrong with one snapshot: negative buckets, overspending, ledger != sum of its jobs."""
    problems = [f"{k} < 0: {ledger.get(k, 0)}" for k in ("reserved", "uncertain", "settled") if ledger.get(k, 0) < 0]
    available = ledger["allowance"] - sum(ledger.get(k, 0) for k in ("reserved", "uncertain", "settled"))
    if available < 0:
        problems.append(f"available < 0: {available}")
    sums = {"reserved": sum(r["reserved"] + r["charged"] for r in rows),
            "uncertain": sum(r["uncertain"] for r in rows), "settled": sum(r["settled"] for r in rows)}
    problems += [f"ledger {k} {ledger.get(k, 0)} != jobs {v}" for k, v in sums.items() if ledger.get(k, 0) != v]
    problems += [f"a job holds {k} < 0" for k in MONEY if any(r[k] < 0 for r in rows)]
    return problems


class LedgerSampler(threading.Thread):
    """Snapshots every tenant's ledger each ``interval`` seconds and keeps the broken ones."""

    def __init__(self, client: Client, tenants: list[str], interval: float = 1.0) -> None:
        super().__init__(name="ledger-sampler", daemon=True)
        self.client, self.tenants, self.interval = client, tenants, interval
        self.stop = threading.Event()
        self.samples = self.skipped = 0
        self.violations: list[dict[str, Any]] = []

    def run(self) -> None:
        while not self.stop.wait(self.interval):
            for tenant in self.tenants:
                try:
                    problems = ledger_problems(*snapshot(self.client, tenant))
                except redis.RedisError:
                    self.skipped += 1  # Redis is being restarted
                    continue
                self.samples += 1
                if problems:
                    self.violations.append({"at": time.time(), "tenant": tenant, "problems": problems})


def collect(client: Client, tenants: list[str]) -> dict[str, dict[str, Any]]:
    """Every job of every tenant: record (without the workflow), attempts, events, outputs."""
    jobs: dict[str, dict[str, Any]] = {}
    for tenant in tenants:
        ids = client.zrange(TenantKeys(tenant).jobs, 0, -1)
        pipe = client.pipeline(transaction=False)
        for job_id in ids:
            k = JobKeys(job_id)
            pipe.hgetall(k.record).hgetall(k.attempts).lrange(k.events, 0, -1).hgetall(k.outputs)
        replies = pipe.execute()
        for i, job_id in enumerate(ids):
            record, attempts, events, outputs = replies[4 * i:4 * i + 4]
            packed = record.get(archive.FIELD)  # a finished job: its fields and parts packed in its record
            jobs[job_id] = {"tenant": tenant, "record": archive.record(job_id, record),
                            "attempts": archive.attempts(attempts, packed),
                            "events": archive.events(events, packed),
                            "outputs": archive.outputs(outputs, packed)}
    return jobs


def dump(job_id: str, job: dict[str, Any] | None, charges: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """A finding's reproduction: the job's state, money, events, attempts and provider charges
    (times in seconds since the job's admission; ``admitted_ms`` places them on the chaos log)."""
    if job is None:
        return {"job_id": job_id, "exists": False}
    r, t0 = job["record"], job["events"][0]["at"] if job["events"] else 0
    return {"job_id": job_id, "state": r.get("state"), "outputs_requested": r.get("outputs_requested"),
            "stored_outputs": sorted(job["outputs"]), "error": [r.get("error_class"), r.get("error_reason")],
            "cancel_requested": r.get("cancel_requested"), "money": {k: int(r.get(k, 0)) for k in MONEY},
            "admitted_ms": t0,
            "events": compact([f"+{(e['at'] - t0) / 1000:.2f} {e.get('from')}>{e['to']}:{e['reason']}"
                               for e in job["events"]]),
            "attempts": [[a["number"], a["operation_id"], a["state"], a.get("error_class"),
                          "pid " + a["worker"].split("/")[1],
                          a.get("submitted_at") and round((a["submitted_at"] - t0) / 1000, 2)]
                         for a in job["attempts"]],
            "charges": [[c["prompt_id"], c["outputs"], c["units"]] for c in charges]}


def compact(events: list[str]) -> list[str]:
    """Repeated pairs of events (a job deferred while the provider's credentials await repair) as one line."""
    out, i = [], 0
    while i < len(events):
        pair, n = [e.split(" ", 1)[1] for e in events[i:i + 2]], 1
        while len(pair) == 2 and [e.split(" ", 1)[1] for e in events[i + 2 * n:i + 2 * n + 2]] == pair:
            n += 1
        out += [f"{events[i]} | {pair[1]} (x{n}, until {events[i + 2 * n - 1].split()[0]})"] if n > 1 else [events[i]]
        i += 2 * n if n > 1 else 1
    return out


def unknowable(job: dict[str, Any], restarts_ms: list[int]) -> str | None:
    """Why the job's cost may legitimately differ from the provider's: a review, a provider restart while an
    attempt was unresolved (its history is gone: the allowance may retry it, its cost taken as charged), or a
    job that ended while reconciling (uncertain settled as charged)."""
    if any(e["to"] == "needs_review" for e in job["events"]) or job["record"].get("state") == "needs_review":
        return "needs_review"
    for a in job["attempts"]:
        if a.get("submitted_at") and any(a["submitted_at"] <= r <= (a.get("ended_at") or r) for r in restarts_ms):
            return f"provider restarted while attempt {a['number']} was unresolved: outcome unknowable"
    if any(e.get("from") == "reconciling" and e["to"] in ("failed", "cancelled") for e in job["events"]):
        return "ended failed/cancelled while reconciling: uncertain settled as charged"
    return None


def money(jobs: dict[str, dict[str, Any]], charges: list[dict[str, Any]], restarts_ms: list[int]) -> dict[str, Any]:
    """Provider charges against what reckon booked, per job and per tenant; duplicates; orphan charges."""
    owner = {a["operation_id"]: job_id for job_id, job in jobs.items() for a in job["attempts"]}
    by_job: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for c in charges:
        by_job[owner.get(c["prompt_id"], "")].append(c)
    tenants: dict[str, Counter[str]] = defaultdict(Counter)
    mismatched, excused, duplicated = [], [], []
    for job_id, job in jobs.items():
        mine, r = by_job.get(job_id, []), job["record"]
        paid, booked = sum(c["units"] for c in mine), sum(int(r.get(k, 0)) for k in ("charged", "uncertain", "settled"))
        why, figures = unknowable(job, restarts_ms), tenants[job["tenant"]]
        figures.update(provider=paid, booked=booked)
        if paid != booked and (why == "needs_review" or (why and booked > paid)):
            figures.update(excused_provider=paid, excused_booked=booked)
            excused.append({**dump(job_id, job, mine), "why": why, "provider": paid, "booked": booked})
        elif paid != booked:
            mismatched.append({**dump(job_id, job, mine), "provider": paid, "booked": booked})
        ops = Counter(c["prompt_id"] for c in mine)
        if not why and (max(ops.values(), default=0) > 1
                        or sum(c["outputs"] for c in mine) > int(r.get("outputs_requested", 0))):
            duplicated.append(dump(job_id, job, mine))
    return {"tenants": {t: dict(f) for t, f in tenants.items()}, "mismatched": mismatched, "excused": excused,
            "duplicated": duplicated, "orphan_charges": by_job.get("", [])}


def tenant_totals(ledgers: dict[str, dict[str, int]], jobs: dict[str, dict[str, Any]],
                  figures: dict[str, dict[str, int]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per tenant: provider charged vs ledger settled + uncertain (+ charged, not yet settled), and the
    final ledger: nothing reserved or uncertain except what jobs in review still hold."""
    report, broken = {}, []
    for tenant, ledger in ledgers.items():
        mine = [j["record"] for j in jobs.values() if j["tenant"] == tenant]
        held = sum(int(r.get(k, 0)) for r in mine if r.get("state") not in TERMINAL for k in MONEY[:3])
        f = figures.get(tenant, {})
        booked = ledger.get("settled", 0) + ledger.get("uncertain", 0) + sum(int(r.get("charged", 0)) for r in mine)
        row: dict[str, Any] = {"provider_charged": f.get("provider", 0), "settled": ledger.get("settled", 0),
                               "uncertain": ledger.get("uncertain", 0), "booked": booked,
                               "excused_provider": f.get("excused_provider", 0),
                               "excused_booked": f.get("excused_booked", 0),
                               "ledger": ledger, "held_by_unfinished_jobs": held}
        report[tenant] = row
        if row["provider_charged"] - row["excused_provider"] != booked - row["excused_booked"]:
            broken.append({"tenant": tenant, "problem": "provider charged != settled + uncertain", **row})
        if ledger.get("reserved", 0) + ledger.get("uncertain", 0) != held:
            broken.append({"tenant": tenant, "problem": "reserved + uncertain != what unfinished jobs hold", **row})
        problems = ledger_problems(ledger, [{k: int(r.get(k, 0)) for k in MONEY} for r in mine])
        broken += [{"tenant": tenant, "problem": p} for p in problems]
    return report, broken


def job_checks(jobs: dict[str, dict[str, Any]], accepted: dict[str, str], cancelled: set[str],
               counts: dict[str, dict[str, int]], blob_dir: Path, margin_s: float) -> dict[str, list[Any]]:
    """Lost and stuck jobs, unhonoured cancels, missing outputs, per-state counts out of step."""
    state = {job_id: job["record"].get("state") for job_id, job in jobs.items()}
    lost = [dict(dump(j, jobs.get(j)), idempotency_key=key) for key, j in accepted.items()
            if state.get(j) not in AT_REST]
    stuck = [dump(j, job) for j, job in jobs.items() if state[j] not in AT_REST]
    cancels = [dump(j, jobs.get(j)) for j in cancelled if state.get(j) not in ("cancelled", "needs_review")]
    blobs, missing = BlobStore(blob_dir), []
    for job_id, job in jobs.items():
        if state[job_id] == "completed" and not all(
                _stored(blobs, job["outputs"].get(i)) for i in range(int(job["record"]["outputs_requested"]))):
            missing.append(dump(job_id, job))
    drift = []
    for tenant, hash_counts in counts.items():
        actual = Counter(s for j, s in state.items() if jobs[j]["tenant"] == tenant)
        if {k: v for k, v in hash_counts.items() if v} != dict(actual):
            drift.append({"tenant": tenant, "counts_hash": hash_counts, "actual": dict(actual)})
    return {"lost": lost, "stuck": stuck, "cancel_not_honoured": cancels, "outputs_missing": missing,
            "counts_drift": drift,
            "stalled": stalled(jobs, margin_s, {"running": 3 * margin_s, "reconciling": 3 * margin_s})}


def slots_left(client: Client) -> list[dict[str, Any]]:
    """Dispatch slots still taken once every job is at rest: each shard's ``busy:<server>`` must equal the
    slots its reviews keep there (``k:`` fields, for a prompt that may still occupy the server), never
    less, never more (a slot given back twice, or never)."""
    left = []
    for shard in shards():
        fleet = client.hgetall(shard.fleet)
        kept = Counter(orjson.loads(raw)["server"] for field, raw in fleet.items() if field.startswith("k:"))
        for field, busy in fleet.items():
            server = field.removeprefix("busy:")
            if field.startswith("busy:") and int(busy) != kept[server]:
                left.append({"shard": shard.n, "server": server, "busy": int(busy), "kept": kept[server]})
    return left


def stalled(jobs: dict[str, dict[str, Any]], margin_s: float, limits: dict[str, float]) -> list[dict[str, Any]]:
    """Jobs that sat in a state without cause: ``queued`` while a job of the same priority admitted more
    than ``margin_s`` later was claimed (not cancelled) during that wait, more than ``margin_s`` before it
    did (its message was stranded, or it was overtaken: dispatch ranks by priority, then admission time),
    or ``running``/``reconciling`` longer than ``limits`` (a livelock)."""
    stints: dict[str, list[tuple[float, float, float, str, bool]]] = defaultdict(list)
    found: dict[str, dict[str, Any]] = {}
    for job_id, job in jobs.items():
        events = job["events"]
        for i, e in enumerate(events):
            left: float = events[i + 1]["at"] if i + 1 < len(events) else float("inf")
            claimed = i + 1 < len(events) and events[i + 1]["to"] == "running"  # not a cancel or an expiry
            if e["to"] == "queued":
                stints[job["record"].get("priority", "")].append((events[0]["at"], e["at"], left, job_id, claimed))
            elif e["to"] in limits and left - e["at"] > limits[e["to"]] * 1000:
                found.setdefault(job_id, dict(dump(job_id, job), why=f"{e['to']} for {(left - e['at']) / 1000:.1f} s"))
    margin = margin_s * 1000
    for rows in stints.values():
        rows.sort()
        admitted_at = [row[0] for row in rows]
        for admitted, entered, left, job_id, _ in rows:
            later = rows[bisect.bisect_right(admitted_at, admitted + margin):]
            other = next((o for _, _, exit_, o, claimed in later if claimed and entered < exit_ < left - margin), None)
            if other is not None and job_id not in found:
                t0, waited = jobs[job_id]["events"][0]["at"], (left - entered) / 1000
                found[job_id] = dict(dump(job_id, jobs[job_id]), why=(
                    f"queued at +{(entered - t0) / 1000:.2f} s, "
                    f"{'still queued' if left == float('inf') else f'for {waited:.1f} s'}: "
                    f"overtaken by {other}, admitted over {margin_s} s later and claimed over {margin_s} s earlier"))
    return list(found.values())


def whereabouts(broker: Client, job_ids: set[str]) -> dict[str, list[str]]:
    """Where each job's messages are in the broker (lua/broker.lua: a queue's list, a worker's held hash,
    dead letters), with that worker's last heartbeat: a message a dead worker holds is stranded. SCAN:
    diagnostics only."""
    beats, now = dict(broker.zrange("dramatiq:__heartbeats__", 0, -1, withscores=True)), time.time() * 1000
    found: dict[str, list[str]] = defaultdict(list)

    def note(message_id: str, raw: str, where: str) -> None:
        args = orjson.loads(raw).get("args") or [None]
        if args[0] in job_ids:
            found[args[0]].append(f"message {message_id} in {where}")

    for key in broker.scan_iter("dramatiq:*"):
        kind = broker.type(key)
        if kind == "list":
            for item in broker.lrange(key, 0, -1):
                message_id, _, raw = item.partition(" ")
                if raw:
                    note(message_id, raw, key)
        elif kind == "hash" and (key.startswith("dramatiq:__held__.") or key.endswith(".XQ.msgs")):
            worker = key.split(".")[1] if key.startswith("dramatiq:__held__.") else None
            beat = f" (worker's last heartbeat {(now - beats[worker]) / 1000:.0f} s ago)" if worker in beats else ""
            for message_id, raw in broker.hscan_iter(key):
                note(message_id, raw, f"{key}{beat}")
    return found


def _stored(blobs: BlobStore, output: dict[str, Any] | None) -> bool:
    if not output:
        return False
    path = blobs.path(output["sha256"])
    return path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() == output["sha256"]


def turnaround(jobs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Seconds from admission to rest: percentiles and the slowest jobs (stranding and livelock show here)."""
    spans = sorted(((j["events"][-1]["at"] - j["events"][0]["at"]) / 1000, job_id) for job_id, j in jobs.items()
                   if j["events"] and j["record"].get("state") in AT_REST)
    if not spans:
        return {}
    at = [round(spans[min(len(spans) - 1, int(q * len(spans)))][0], 2) for q in (0.5, 0.99, 1.0)]
    return {"p50_s": at[0], "p99_s": at[1], "max_s": at[2],
            "slowest": [[job_id, round(s, 2)] for s, job_id in spans[-5:]]}


def report(client: Client, broker: Client, tenants: list[str], charges: list[dict[str, Any]], load: Any,
           sampler: LedgerSampler, blob_dir: Path, margin_s: float, restarts_ms: list[int]) -> dict[str, Any]:
    """Every check over the drained stack; ``load`` holds what clients saw (accepted keys, cancels, replays)."""
    jobs = collect(client, tenants)
    ledgers = {t: {k: int(v) for k, v in client.hgetall(TenantKeys(t).ledger).items()} for t in tenants}
    counts = {t: {k: int(v) for k, v in client.hgetall(TenantKeys(t).counts).items()} for t in tenants}
    paid = money(jobs, charges, restarts_ms)
    totals, ledger_broken = tenant_totals(ledgers, jobs, paid["tenants"])
    found = job_checks(jobs, load.accepted, load.cancelled, counts, blob_dir, margin_s) | {
        "not_accepted": [key for _, key, _ in load.jobs if key not in load.accepted],
        "replay_mismatch": load.mismatched, "charge_mismatch": paid["mismatched"],
        "duplicated_execution": paid["duplicated"], "orphan_charges": paid["orphan_charges"],
        "ledger_final": ledger_broken, "ledger_samples": sampler.violations,
        "global_figures": audit(client, tenants), "slots_left": slots_left(client)}
    where = whereabouts(broker, {item["job_id"] for item in found["stuck"] + found["stalled"]})
    for item in found["stuck"] + found["stalled"]:
        item["broker"] = where.get(item["job_id"], [])
    records = [j["record"] for j in jobs.values()]
    stats = merge_stats([client.hgetall(shard.stats) for shard in shards()])
    return {
        "ok": not any(found.values()),
        "jobs": {"submitted": len(load.jobs), "accepted": len(load.accepted), "in_redis": len(jobs),
                 "states": Counter(r.get("state") for r in records),
                 "error_classes": Counter(r.get("error_class") for r in records if r.get("error_class")),
                 "cancel_accepted": len(load.cancelled), "turnaround": turnaround(jobs)},
        "provider": {"executions": len(charges), "units": sum(c["units"] for c in charges)},
        "stale_writes_rejected": int(stats.get("stale_writes_rejected", 0)),
        "admission_refused": {field.removeprefix("refused:"): int(n) for field, n in
                              sorted(stats.items()) if field.startswith("refused:")},
        "tenants": totals, "clients": dict(load.stats), "excused": paid["excused"],
        "ledger_samples": {"taken": sampler.samples, "skipped_during_outage": sampler.skipped},
        "checks": {name: {"ok": not items, "count": len(items), "items": items[:50]} for name, items in found.items()},
    }


def summary(rep: dict[str, Any]) -> str:
    """The report, readable: figures, per-tenant money, each check with its first findings."""
    c, j, t = rep["config"], rep["jobs"], rep["timing"]
    actions = Counter(f"{e['action']} {e.get('process', '').split('-')[0]}".strip() for e in rep["chaos"])
    lines = [(f"soak ({c['code']}): {j['submitted']} jobs ({j['accepted']} accepted), {c['tenants']} tenants, "
              f"{c['workers']} workers x {c['threads']} threads, fault rate {c['fault_rate']}, seed {c['seed']}"),
             (f"time: admission {t['admission_s']} s, until at rest {t['until_at_rest_s']} s (all at rest: "
              f"{t['all_at_rest']}); turnaround {j['turnaround']}"),
             f"states: {dict(j['states'])}; error classes: {dict(j['error_classes'])}",
             f"faults injected: {rep['faults']}",
             f"chaos: {dict(actions)}; exited on their own: {[e['process'] for e in rep['unexpected_exits']]}",
             (f"provider: {rep['provider']['executions']} executions, {rep['provider']['units']} units; stale "
              f"writes rejected: {rep['stale_writes_rejected']}; ledger samples: {rep['ledger_samples']}"),
             f"admission refused (clients retried): {rep['admission_refused']}; client calls: {dict(rep['clients'])}",
             "tenant  provider   settled  uncertain  excused provider/booked"]
    lines += [f"{name:6} {f['provider_charged']:9} {f['settled']:9} {f['uncertain']:10}  "
              f"{f['excused_provider']}/{f['excused_booked']}" for name, f in rep["tenants"].items()]
    lines += [f"excused ({e['why']}): {e['job_id']} provider {e['provider']}, booked {e['booked']}"
              for e in rep["excused"][:10]]
    for name, check in rep["checks"].items():
        lines.append(f"  {'ok  ' if check['ok'] else 'FAIL'} {name}: {check['count']}")
        lines += [f"       {orjson.dumps(item).decode()[:900]}" for item in check["items"][:3]]
    lines.append("PASS" if rep["ok"] else f"FAIL (report: {c.get('json') or 'use --json'}, logs: {rep['workdir']})")
    return "\n".join(lines)
