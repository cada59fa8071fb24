"""Every command of ops/RUNBOOK.md runs against a live stack, so the runbook cannot rot.

Which text of the runbook is a command (``runbook_commands``):

- every line of a fenced ``sh`` (or ``bash``, ``shell``) block: ``reckon ...``, ``redis-cli ...``, ``curl ...``,
  or a shell variable (``now=$(...)``) that the later lines of the same block use; a trailing ``# comment`` is
  not part of it. Blocks in another language (sample output, say) hold no commands;
- every inline code span (joined across a line break) that starts with ``reckon ``, ``redis-cli `` or
  ``python -m ``. A word made of choices (``--class interactive|batch``) makes one command per choice. A span
  that is, word for word, the beginning of another command (``reckon job show``, ``redis-cli -p 6390``) only
  names that command and is not run on its own.

``JOB_ID``, ``TENANT``, ``SERVER``, ``FILE`` (a statement), ``ID`` (a booking id), the numbers ``N`` and ``B``
are what an operator fills in; the test substitutes real ones from the live stack (for each command, a job
in the state its section is about). The deployment's addresses (``-p 6390``, ``127.0.0.1:8000``) become the
test's. Each command runs under bash with the stack's environment and ``.venv/bin`` first on ``PATH`` (so
``reckon`` is the installed entry point); ``python -m`` spans are compared with the stack's watcher and sweeper.

The docs' runnable blocks run too: every line of a fenced block marked ``sh run`` in ``README.md`` or ``docs/``
(``docs_commands``), with the same placeholders and substitutions (``DOCS_KNOWN``). The test fails if the
runbook holds a command it has no state for, if a command it knows is gone from the runbook, or if a command
exits otherwise than expected or shows other than what the runbook says.
"""

from __future__ import annotations

import dataclasses
import os
import re
import socket
import subprocess
from typing import Any, cast

import orjson

from pipeline.settings import Settings
from pipeline.state import keys
from pipeline.state.redisconn import connect_url
from pipeline.state.store import Store
from pipeline.state.submit import Admitter
from pipeline.state.tenants import create_key, create_tenant
from pipeline.work.broker import Publisher, build_broker
from tests.conftest import REDIS_PORT, free_port, wait_until
from tests.faults.conftest import BIN, ROOT, Stack
from tests.faults.runbook import DOCS_KNOWN, KNOWN, NOW, PLACEHOLDER, RUNBOOK, docs_commands, runbook_commands
from tests.faults.runbook_slots import kept_slots
from tests.faults.runbook_statement import statement

TENANT, SERVER = "acme", "comfyui"


class Runbook:
    """Runs the runbook's commands, as written, against one stack, and remembers which ran."""

    def __init__(self, stack: Stack) -> None:
        self.commands = docs_commands() | runbook_commands(RUNBOOK.read_text())
        self.stack = stack
        self.ran: set[str] = set()

    def run(self, command: str, *, code: int = 0, then: str = "", **values: Any) -> str:
        """The command's stdout, once it exited with ``code``; ``then`` is shell run after it."""
        assert command in self.commands, f"not in ops/RUNBOOK.md or a runnable block of docs/: {command}"
        stdout = self._bash(self._fill(self.commands[command] + command, values) + then, code)
        self.ran.add(command)
        return stdout

    def json(self, command: str, **values: Any) -> Any:
        return orjson.loads(self.run(command, **values))

    def lines(self, command: str, **values: Any) -> list[str]:
        return self.run(command, **values).splitlines()

    def started(self, command: str, process: subprocess.Popen[bytes]) -> None:
        """A ``python -m`` command of the runbook is what the stack runs (after the interpreter's path)."""
        assert command in self.commands, f"not in ops/RUNBOOK.md: {command}"
        argv = [str(arg) for arg in cast("list[str]", process.args)]
        assert command.split()[1:] == argv[1:], (command, argv)
        self.ran.add(command)

    def status(self) -> dict[str, Any]:
        """``reckon status --json`` (not a runbook command: how the test checks what one did)."""
        return orjson.loads(self._bash("reckon status --json", 0))

    def _bash(self, script: str, code: int) -> str:
        env = self.stack.env | {"PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
        assert done.returncode == code, f"{script}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def _fill(self, script: str, values: dict[str, Any]) -> str:
        script = script.replace("-p 6390", f"-p {REDIS_PORT}").replace("127.0.0.1:8000",
                                                                       f"127.0.0.1:{self.stack.web_port}")
        assert "6390" not in script and ":8000" not in script, script

        def value(match: re.Match[str]) -> str:
            assert match.group(0) in values, f"no value for {match.group(0)} in {script}"
            return str(values[match.group(0)])

        return PLACEHOLDER.sub(value, script)


@dataclasses.dataclass
class Live:
    """The stack, its state and the runbook runner, shared by the steps below."""

    stack: Stack
    store: Store
    rb: Runbook
    api_key: str
    sent: int = 0

    def post(self, priority: str = "interactive", **extra: Any) -> tuple[int, dict[str, Any], str]:
        self.sent += 1
        body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": self.sent}}},
                "outputs": 2, "priority": priority, **extra}
        sent = {"Authorization": f"Bearer {self.api_key}", "Idempotency-Key": f"runbook-{self.sent}"}
        status, headers, raw = self.stack.api("POST", "/v1/jobs", body, 10, **sent)
        return status, orjson.loads(raw), headers.get("location", "").rsplit("/", 1)[-1]

    def submit(self, priority: str = "interactive", **extra: Any) -> str:
        status, body, job_id = self.post(priority, **extra)
        assert status == 202, body
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        return self.store.job(job_id) or {}

    def wait(self, state: str, *job_ids: str, timeout: float = 20) -> None:
        wait_until(lambda: all(self.job(job_id).get("state") == state for job_id in job_ids), timeout=timeout,
                   what=lambda: {j: (self.job(j).get("state"), self.job(j).get("error_class")) for j in job_ids})


def test_the_runbook_holds_exactly_the_commands_this_test_runs() -> None:
    found = set(runbook_commands(RUNBOOK.read_text()))
    assert sorted(found - KNOWN) == [], "commands in ops/RUNBOOK.md that no test makes state for"
    assert sorted(KNOWN - found) == [], "commands gone from ops/RUNBOOK.md: drop them from KNOWN"
    documented = set(docs_commands())
    assert sorted(documented - DOCS_KNOWN) == [], "commands in a runnable block of docs/ that no test runs"
    assert sorted(DOCS_KNOWN - documented) == [], "commands gone from the docs' runnable blocks"


def test_every_runbook_command_against_a_live_stack(stack: Stack, redis_client, store: Store) -> None:
    create_tenant(redis_client, TENANT, 10_000)
    live = Live(stack, store, Runbook(stack), create_key(redis_client, TENANT))
    stack.env["RECKON_PROVIDER_CAP"] = "8"  # the three unknown outcomes below hold slots meanwhile
    stack.start_provider(delay=0.2)
    stack.start_web()
    stack.start_sweeper()
    stack.start_worker(watcher_at="after_outputs")  # the watcher collects: the first job's collect stops there
    needs_review(live, *unknown_outcomes(live))
    completed_and_dead(live)
    class_pause_and_admission(live)
    server_pause_and_credentials(live)
    outbox(live)
    processes_and_tenant(live)
    webhooks_behind(live)
    kept_slots(live.rb, live.store, live.store.redis.zrange(keys.TenantKeys(TENANT).dead, 0, 0)[0])
    statement(live.rb, store, TENANT, stack.logs.parent)
    redis_layout(live)
    assert sorted(set(live.rb.commands) - live.rb.ran) == []


def unknown_outcomes(live: Live) -> tuple[str, str, str]:
    """Three jobs whose outcome reckon cannot learn while the provider's history cannot be read: one whose
    collect (the watcher's) died after storing every output, two whose submissions got no answer (an
    interactive and a batch one, a 4 s deadline each: overdue later, claimed before it on a loaded machine)."""
    stack, rb = live.stack, live.rb
    stored = live.submit()
    stack.kill_when_paused("watcher")
    stack.sim_post("/sim/faults", {"faults": [{"kind": "drop", "times": 2},
                                              {"kind": "read_error", "path": "/history", "times": 100_000}]})
    stack.start_watcher()
    failed, retried = live.submit(deadline_s=4), live.submit("batch", deadline_s=4)
    live.wait("reconciling", stored, failed, retried, timeout=30)
    rows = rb.json("reckon jobs --state reconciling")
    assert sorted((row["id"], row["tenant"]) for row in rows) == sorted((j, TENANT) for j in (stored, failed, retried))
    # reachable; nobody watches; the stored job's slot was given back when its prompt ended (fleet.md)
    assert rb.json("reckon provider status")["servers"] == {SERVER: {"busy": 2, "cap": 8, "stopped": {}, "watched": 0}}
    asks = rb.lines("redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:reconcile' 0 -1 WITHSCORES", TENANT=TENANT)
    assert sorted(asks[0::2]) == sorted([stored, failed, retried])
    assert all(int(at) > int(live.job(job_id)["updated_at"]) for job_id, at in zip(asks[0::2], asks[1::2], strict=True))
    return stored, failed, retried


def needs_review(live: Live, stored: str, failed: str, retried: str) -> None:
    """The provider restarts and forgets them: each goes to review; the overdue ones are found; each
    decision of the runbook is taken on one of them."""
    stack, rb, store = live.stack, live.rb, live.store
    stack.sim_post("/sim/restart", {})
    stack.sim_post("/sim/faults", {"faults": []})
    live.wait("needs_review", stored, failed, retried)
    reviews = {row["id"]: (row["state"], row["error"]["reason"], row["uncertain"])
               for row in rb.json("reckon review list")}
    assert reviews == {stored: ("needs_review", "outcome_unknowable", 0),  # charged before its outputs were stored
                       failed: ("needs_review", "outcome_unknowable", 20),
                       retried: ("needs_review", "outcome_unknowable", 20)}
    wait_until(lambda: store.server_ms() // 1000 * 1000 > int(live.job(retried)["deadline"]), timeout=10)
    before = store.server_ms()
    now = int(rb.run(NOW, then='\necho "$now"'))
    assert before // 1000 * 1000 <= now <= store.server_ms()
    assert rb.lines("redis-cli -p 6390 ZRANGEBYSCORE reckon:{s0}:due -inf $now LIMIT 0 20") == [failed]
    assert rb.lines("redis-cli -p 6390 ZRANGEBYSCORE reckon:{s0}:due 1e13 $(( 10**13 + now )) LIMIT 0 20") == [retried]
    shown = rb.json("reckon job show JOB_ID", JOB_ID=failed)
    assert shown["job"]["state"] == "needs_review" and "workflow" not in shown["job"]
    assert [a["operation_id"] for a in shown["attempts"]] == [shown["job"]["operation_id"]]
    assert [e["to"] for e in shown["events"]] == ["queued", "running", "reconciling", "needs_review"]
    assert rb.json("reckon review resolve JOB_ID --completed", JOB_ID=stored) == {"id": stored, "state": "completed"}
    assert rb.json("reckon review resolve JOB_ID --failed", JOB_ID=failed) == {"id": failed, "state": "failed"}
    assert rb.json("reckon review resolve JOB_ID --retry", JOB_ID=retried) == {"id": retried, "state": "queued"}
    assert live.job(failed)["settled"] == "20"  # the uncertain cost settled as charged
    live.wait("failed", retried)  # its deadline passed: failed by the sweeper, its reservation given back
    assert (live.job(retried)["attempts_allowed"], live.job(retried)["error_class"]) == ("4", "deadline_exceeded")
    assert store.ledger(TENANT) == {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 40,
                                    "available": 9_960}


def completed_and_dead(live: Live) -> None:
    """A completed job; a job the provider refuses on policy, dead-lettered, then replayed."""
    stack, rb = live.stack, live.rb
    done = live.submit()
    live.wait("completed", done)
    shown = rb.json("reckon job show JOB_ID", JOB_ID=done)
    assert shown["job"]["state"] == "completed" and "workflow" not in shown["job"]
    assert sorted(shown["outputs"]) == ["0", "1"] and len(shown["attempts"]) == 1
    assert rb.lines("redis-cli -p 6390 HGETALL 'reckon:{p:comfyui}:budget'") == ["tokens", "100"]  # refilled
    stack.sim_post("/sim/faults", {"faults": [{"kind": "policy", "times": 1}]})
    dead = live.submit()
    live.wait("failed", dead)
    letters = {row["id"]: row["error"]["reason"] for row in rb.json("reckon dlq list")}
    assert letters[dead] == "policy_rejected" and len(letters) == 3  # and the two resolved reviews above
    ids = rb.lines("redis-cli -p 6390 -n 1 ZRANGE dramatiq:reckon-interactive.XQ 0 -1")
    with connect_url(stack.env["RECKON_BROKER_URL"]) as dramatiq_db:
        messages = dramatiq_db.hmget("dramatiq:reckon-interactive.XQ.msgs", ids)
    assert [orjson.loads(message)["args"] for message in messages] == [[dead]]
    assert rb.json("reckon dlq replay JOB_ID", JOB_ID=dead) == {"id": dead, "state": "queued"}
    live.wait("completed", dead)


def class_pause_and_admission(live: Live) -> None:
    """Both classes paused: jobs wait queued, admission goes on up to a queue cap; resumed, they run."""
    rb, store = live.rb, live.store
    for cls in ("interactive", "batch"):
        assert rb.json(f"reckon pause --class {cls}") == {"paused": {"class": cls}, "changed": True}
    assert {cls: row["paused"] for cls, row in rb.status()["classes"].items()} == {"interactive": True, "batch": True}
    waiting = live.submit(), live.submit("batch")
    rows = [line.split() for line in rb.lines("reckon status")[1:3]]
    assert [(row[0], row[1], row[-1]) for row in rows] == [("interactive", "1", "PAUSED"), ("batch", "1", "PAUSED")]
    ready = orjson.loads(rb.run("curl -s 127.0.0.1:8000/readyz"))
    assert (ready["status"], ready["paused_classes"]) == ("ready", ["batch", "interactive"])
    metrics = rb.lines("curl -s 127.0.0.1:8000/metrics | grep ^reckon_")
    assert all(line.startswith("reckon_") for line in metrics)
    assert {'reckon_class_paused{class="interactive"} 1.0', 'reckon_class_paused{class="batch"} 1.0'} <= set(metrics)
    created = [int(live.job(job_id)["created_at"]) for job_id in waiting]
    oldest = rb.lines("redis-cli -p 6390 ZRANGE reckon:{s0}:queue 0 0 WITHSCORES")
    assert oldest == [waiting[0], str(created[0])]
    oldest = rb.lines("redis-cli -p 6390 ZRANGEBYSCORE reckon:{s0}:queue 1e13 +inf WITHSCORES LIMIT 0 1")
    assert oldest == [waiting[1], str(10**13 + created[1])]
    assert rb.lines("redis-cli -p 6390 HSET reckon:{s0}:admission queue_cap:batch N", N=1) == ["1"]
    assert rb.lines("redis-cli -p 6390 HGETALL reckon:{s0}:admission") == ["queue_cap:batch", "1"]
    status, problem, _ = live.post("batch")
    assert (status, problem["limit"]) == (503, "queue_full")
    refusals = rb.lines("redis-cli -p 6390 HGETALL reckon:{s0}:stats | paste - - | grep refused:")
    assert refusals == ["refused:queue_full\t1"]
    store.redis.hdel(keys.ShardKeys(0).admission, "queue_cap:batch")
    for cls in ("interactive", "batch"):
        assert rb.json(f"reckon resume --class {cls}") == {"resumed": {"class": cls}, "changed": True}
    assert {cls: row["paused"] for cls, row in rb.status()["classes"].items()} == {"interactive": False, "batch": False}
    live.wait("completed", *waiting)


def server_pause_and_credentials(live: Live) -> None:
    """The server drained: a job parks, then runs once cleared; the server refuses our credentials:
    marked, the job parks, then runs once the mark is deleted."""
    stack, rb, store = live.stack, live.rb, live.store
    assert rb.json("reckon pause --provider SERVER", SERVER=SERVER) == {"paused": {"provider": SERVER}, "changed": True}
    assert rb.json("reckon provider pause SERVER", SERVER=SERVER) == {"provider": SERVER, "blocked": "dispatch_paused"}
    since = int(rb.run("redis-cli -p 6390 HGET reckon:{s0}:fleet dispatch_paused:SERVER", SERVER=SERVER))
    assert store.server_ms() - 10_000 < since <= store.server_ms()
    parked = live.submit()
    wait_until(lambda: store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [parked])
    fleet = rb.json("reckon provider status")
    assert (fleet["parked"], fleet["servers"][SERVER]["stopped"]) == (1, {"dispatch_paused": since})
    text, _, json_part = rb.run("reckon status; reckon provider status").partition("\n{")
    assert f"server {SERVER}: busy 0/8  watched 0  watcher up  stopped dispatch_paused" in text.splitlines()
    assert orjson.loads("{" + json_part) == fleet
    assert rb.json("reckon provider clear SERVER", SERVER=SERVER) == {"provider": SERVER, "cleared": True}
    live.wait("completed", parked)
    stack.sim_post("/sim/faults", {"faults": [{"kind": "auth", "times": 1}]})
    refused = live.submit()
    wait_until(lambda: store.redis.zrange(keys.ShardKeys(0).parked, 0, -1) == [refused])  # its attempt given back
    assert (store.provider_block(SERVER), live.job(refused)["state"]) == ("provider_credentials", "queued")
    assert rb.lines("redis-cli -p 6390 HDEL reckon:{s0}:fleet provider_credentials:SERVER", SERVER=SERVER) == ["1"]
    live.wait("completed", refused)
    job = live.job(refused)  # the refused attempt did not count against the job: one more allowed
    assert (job["attempt_count"], job["attempts_allowed"], job["settled"]) == ("2", "4", "20")


def outbox(live: Live) -> None:
    """A job admitted while the broker cannot be reached waits in the outbox; the sweeper publishes it."""
    settings = Settings.from_env(live.stack.env | {"RECKON_BROKER_URL": f"redis://127.0.0.1:{free_port()}/1"})
    admitter = Admitter(live.store, Publisher(build_broker(settings)), settings)
    job_id = admitter.submit(TENANT, "runbook-outbox", {"kind": "image", "outputs": 1,
                                                         "workflow": {"3": {"class_type": "KSampler"}}}).job_id
    entries = live.rb.lines("redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:outbox' 0 -1 WITHSCORES", TENANT=TENANT)
    assert entries == [job_id, str(int(live.job(job_id)["created_at"]) + 1_000)]  # RECKON_OUTBOX_GRACE_SECONDS
    live.wait("completed", job_id)
    wait_until(lambda: live.store.redis.zcard(keys.TenantKeys(TENANT).outbox) == 0)


def processes_and_tenant(live: Live) -> None:
    """The sweeper's heartbeat names the running sweeper; the stack runs the runbook's process commands;
    the tenant's ledger balances, its limits change, and disabled, its key is refused."""
    stack, rb, store = live.stack, live.rb, live.store
    beat = rb.lines("redis-cli -p 6390 HGETALL reckon:sweeper")
    sweeper = f"{socket.gethostname()}/{stack.procs['sweeper'].pid}"
    assert dict(zip(beat[0::2], beat[1::2], strict=True)).keys() == {"at", "by", f"at:{sweeper}"}
    assert beat[beat.index("by") + 1] == sweeper
    assert store.server_ms() - 5_000 < int(beat[beat.index("at") + 1]) <= store.server_ms()
    for name in ("watcher", "sweeper"):
        rb.started(f"python -m pipeline.work.{name}", stack.procs[name])
    lines = rb.lines("reckon status")
    rows = [line.split() for line in lines[1:3]]  # class, depth, oldest, running, ..., dead, overdue, paused
    assert [row[:2] + row[3:] for row in rows] == [[cls, "0", "0", "0", "0", "0", "1", "0", "-"]
                                                   for cls in ("interactive", "batch")]
    assert lines[3].startswith("exposure: reserved 0  uncertain 0  (settled 170)   parked 0")
    ledger = {"allowance": 10_000, "reserved": 0, "uncertain": 0, "settled": 170, "available": 9_830}
    shown = rb.json("reckon tenant show TENANT", TENANT=TENANT)
    assert shown == {"tenant": TENANT, "ledger": ledger, "jobs": {"completed": 8, "failed": 2}, "limits": {},
                     "disabled": False}
    assert ledger["allowance"] == sum(ledger[kind] for kind in ("available", "reserved", "uncertain", "settled"))
    limits = {"max_inflight": "4", "rate": "5.0", "burst": "8"}
    assert rb.json("reckon tenant set TENANT --max-inflight N --rate 5/s --burst B", TENANT=TENANT, N=4,
                   B=8) == {"tenant": TENANT, "limits": limits}
    assert rb.json("reckon tenant show TENANT", TENANT=TENANT)["limits"] == limits
    assert rb.json("reckon tenant disable TENANT", TENANT=TENANT) == {"tenant": TENANT, "disabled": True}
    # refused once each web process's trust in the key lapses (RECKON_AUTH_CACHE_SECONDS, 1 s)
    wait_until(lambda: stack.api("GET", "/v1/usage", Authorization=f"Bearer {live.api_key}")[0] == 401, timeout=5)


def webhooks_behind(live: Live) -> None:
    """A delivery due to a tenant's endpoint (no webhooks process runs here: it stays due) is listed oldest
    first; the tenant's endpoints are listed, never their secrets. The endpoint goes again afterwards."""
    from pipeline.webhooks.deliveries import Deliveries
    from pipeline.webhooks.endpoints import Endpoints

    endpoints, shard = Endpoints(live.store), keys.ShardKeys(0)
    endpoint, secret = endpoints.add(TENANT, "https://hooks.example.com/reckon", ["job.failed"])
    job_id = live.store.redis.zrange(keys.TenantKeys(TENANT).dead, 0, 0)[0]
    live.store.redis.rpush(shard.webhook_taking, orjson.dumps(
        {"job": job_id, "tenant": TENANT, "type": "job.failed", "seq": 9, "at": 1, "attempt": 1}))
    assert Deliveries(live.store).fan_out(shard, endpoints.all) == 1
    due = live.rb.lines("redis-cli -p 6390 ZRANGE 'reckon:{s0}:webhooks:ready' 0 9 WITHSCORES")
    assert due[0] == endpoint["id"] and abs(int(due[1]) - live.store.server_ms()) < 60_000
    listed = live.rb.json("reckon tenant webhook list TENANT", TENANT=TENANT)
    assert listed == {"tenant": TENANT, "webhooks": [{"id": endpoint["id"], "url": "https://hooks.example.com/reckon",
                                                      "types": ["job.failed"], "created_at": endpoint["created_at"],
                                                      "previous_secret_valid_until": None}]}
    assert secret not in orjson.dumps(listed).decode()
    endpoints.remove(TENANT, endpoint["id"])


def redis_layout(live: Live) -> None:
    """docs/redis.md's redis-cli block, once every job has come to rest: each command reads the key
    the docs say, and shows what the state holds."""
    rb, store = live.rb, live.store
    t = keys.TenantKeys(TENANT)
    dead = store.redis.zrange(t.dead, 0, -1)
    failed = dead[0]
    assert live.job(failed)["state"] == "failed"
    cmd = "redis-cli -p 6390 "

    def read(command: str, **values: Any) -> list[str]:  # redis-cli prints an empty reply as one empty line
        lines = rb.lines(command, **values)
        return [] if lines == [""] else lines

    assert read(cmd + "SMEMBERS 'reckon:{s0}:tenants'") == [TENANT]
    stats = read(cmd + "HGETALL 'reckon:{s0}:stats'")
    assert dict(zip(stats[0::2], stats[1::2], strict=True)) == store.redis.hgetall(keys.ShardKeys(0).stats)
    assert read(cmd + "ZRANGE 'reckon:{s0}:queue' 0 0 WITHSCORES") == []
    assert read(cmd + """ZCOUNT 'reckon:{s0}:due' 0 "($(date +%s%3N)\"""") == ["0"]
    ledger = read(cmd + "HGETALL 'reckon:{s0}:t:TENANT:ledger'", TENANT=TENANT)
    assert dict(zip(ledger[0::2], ledger[1::2], strict=True))["allowance"] == "10000"
    counts = read(cmd + "HGETALL 'reckon:{s0}:t:TENANT:counts'", TENANT=TENANT)
    assert {k: int(v) for k, v in zip(counts[0::2], counts[1::2], strict=True) if int(v)} == {
        "completed": len(store.redis.zrange(t.done, 0, -1)) - len(dead), "failed": len(dead)}
    for index in ("leases", "outbox", "retry"):
        assert read(cmd + f"ZRANGE 'reckon:{{s0}}:t:TENANT:{index}' 0 -1 WITHSCORES", TENANT=TENANT) == []
    assert read(cmd + "ZRANGE 'reckon:{s0}:t:TENANT:dead' 0 -1 WITHSCORES", TENANT=TENANT)[0::2] == dead
    fleet = read(cmd + "HGETALL 'reckon:{s0}:fleet'")
    assert dict(zip(fleet[0::2], fleet[1::2], strict=True)).get(f"busy:{SERVER}") == "0"
    assert read(cmd + "ZRANGE 'reckon:{s0}:fleet:parked' 0 -1 WITHSCORES") == []
    assert read(cmd + "ZRANGE 'reckon:{s0}:wake' 0 -1 WITHSCORES")[0::2] == [TENANT]
    record = read(cmd + "HGETALL 'reckon:{s0}:job:JOB_ID'", JOB_ID=failed)
    assert dict(zip(record[0::2], record[1::2], strict=True))["state"] == "failed"
    events = [orjson.loads(line)["to"] for line in read(cmd + "LRANGE 'reckon:{s0}:job:JOB_ID:events' 0 -1",
                                                             JOB_ID=failed)]
    assert events[-1] == "failed"
    assert read(cmd + "HGETALL 'reckon:{p:comfyui}:budget'") == ["tokens", "100"]
    assert read(cmd + "HGETALL reckon:sweeper")[0] == "at"
    assert read(cmd + "-n 1 LLEN dramatiq:reckon-interactive") == ["0"]
