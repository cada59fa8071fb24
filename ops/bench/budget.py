"""What one job may cost in Redis on the deployed path: the budget ``tests/faults/test_budget.py``
enforces and ``make bench`` reports against (docs/performance.md "What one job costs").

Measured by ops/bench/deployed.py: the Procfile's processes with default settings, two simulated ComfyUI
servers, jobs posted over HTTP, 2 outputs each, progress on. A change that makes a job cost more
raises the figure here in the same commit, and says why in its message.
"""

#: Redis commands per job (``INFO commandstats`` delta over both databases, ``info`` and the measuring
#: tool's own left out), at most. Measured 114.2 to 117.0 in four runs (100 jobs, no job parked, under
#: MONITOR; 2 fewer since a web process trusts a key it looked up for a second); the rest is headroom
#: for the time-driven shares (broker rechecks, watcher ticks, sweeper passes: about 3 commands a
#: second in all) on a slower machine. The issue's target is 90. Raised from 125 with the stream of
#: changes (docs/api.md "Event streams"): one XADD per job event, 4.5 a job (admission, claim, finish and
#: the progress points); measured 121.0 before it (a slow run), 119.8 after (the streams process
#: started, no stream open).
COMMANDS_PER_JOB = 130

#: Commands per job of each step of a job's own path, at most (ops/bench/deployed.py ``STEPS``). These
#: are the scripts' own counts and the same for every job of a run; the rest of the total is the
#: broker's, the watcher's and the sweeper's share, which depends on how long the processes idle.
STEPS = {  # what the scripts of each step cost (FCALL included), per job
    "admission": 22,  # each of these three: one XADD to the stream of changes for its job event
    "claim": 19,
    "submit mark": 7,
    "hand-over": 5,
    "progress": 12,  # 6 a point (its XADD); the watcher writes the first at once, then at most one a second
    "collect": 6,  # 5 (the prompt's cost booked in the same step), and 2 for each duplicate collect message
    "outputs": 10,  # 5 an output, each recorded right after its copy (HGETALL of the record, HSETNX, TIME, HSET)
    "finish": 21,
    "confirm-publish": 4,
}

#: With the state split into shards (``RECKON_SHARDS`` > 1), what holding a server's cap across them
#: adds per job (pipeline/state/slots.py), measured at 9.8 and 4.1: in "server slot", the attempt's take
#: (5, FCALL included), its check before the send, which renews the slot so the sweeper cannot free it
#: on an older read (4), and the sweeper's renewals every 5 s (about 1); in "worker", the job's state and
#: its shard's stop marks and promise read before the take, and the slot's release (about 4), with the
#: shards waiting for the server read in the release's round trip (1 more: fair dispatch across shards,
#: docs/fleet.md; measured 5.12, server slot 9.75, 138.0 commands a job in all).
SHARDED_STEPS = {"server slot": 11, "worker": 6.5}

#: A job whose tenant has a webhook endpoint for ``job.completed`` (docs/webhooks.md "What a webhook costs"):
#: "webhooks" is the event's fan-out (the taking list's read, the job's view, the fan-out script), its take
#: (the ready endpoints' read with Redis's clock, then the script: each endpoint's own due set, so that one endpoint's backlog
#: never hides another's, and its place in the ready set kept) and its outcome, and the process's blocking
#: wait for events; "finish" pushes the event to the outbox (one RPUSH more than STEPS allows). Measured
#: 26.5 with one due set per shard, 29.7 and 31.1 with one per endpoint (149.4 commands a job in all), 30.3 with
#: the clock read with the ready endpoints (148.6).
WEBHOOK_COMMANDS_PER_JOB = 165
WEBHOOK_STEPS = {"webhooks": 34, "finish": 22}
