"""Which step of a job's path a Redis command belongs to: the vocabulary ops/bench/deployed.py's
``Monitor`` (commands per step) and ops/bench/slowlog.py (Redis CPU per step) both attribute by.

A script's call names its function (``FCALL reckon_<hash>_<verb>``), which names the step; any other
command counts to the process that sent it, by its connection's name (``CLIENT SETNAME``,
pipeline/state/redisconn.py); Dramatiq's ``dispatch.lua`` calls (``EVALSHA``) by their verb and queue.
"""

from __future__ import annotations

#: FCALL function (a script's verb) -> the step of a job's path it is.
SCRIPT_STEPS = {
    "admit": "admission", "claim": "claim", "mark-submit": "submit mark", "await": "hand-over",
    "progress": "progress", "collect-claim": "collect", "store-output": "outputs", "charge": "charge",
    "finish": "finish", "prompt-ended": "slot release", "heartbeat": "lease renewal", "slot-take": "server slot", "slot-keep": "server slot",
    "webhook-fanout": "webhooks", "webhook-take": "webhooks", "webhook-done": "webhooks",
}
#: (script verb, the connection's name) -> the step, where the process that calls a script says which
#: step it is: the worker's slot check before its send is a job's own, the sweeper's pass a renewal
#: that comes with time (a share of every slot held, every ``KEEP_EVERY_MS``).
SENDER_STEPS = {("slot-keep", "worker"): "server slot", ("slot-keep", "sweeper"): "slot renewal"}
#: A connection's name (``CLIENT SETNAME``, pipeline/state/redisconn.py) -> the step its other commands count to.
CLIENT_STEPS = {"web": "api", "worker": "worker", "sweeper": "sweeper share", "watcher": "watcher share",
                "webhooks": "webhooks", "streams": "streams",
                "broker-web": "broker: publish", "broker-worker": "broker: worker",
                "broker-watcher": "broker: watcher", "broker-sweeper": "broker: sweeper"}
#: The client name of the measuring tools' own connections (left out of every figure).
TOOL = "deployed-measure"


def broker_call(command: str, args: list[str]) -> str:
    """What a broker command did, from its arguments after the command: ``evalsha`` as Dramatiq's
    dispatch verb and queue (``fetch reckon-collect``), a (un)subscription or ``llen`` with its queue."""
    if command == "evalsha" and len(args) > 5:
        return f"{args[3]} {args[5]}"
    queue = args[0].rsplit(":", 1)[-1] if args else ""
    return f"{command} {queue}"


def script_verb(function: str) -> str:
    """A library function's script verb: ``reckon_<hash>_mark_submit`` -> ``mark-submit``."""
    parts = function.split("_", 2)
    return parts[2].replace("_", "-") if len(parts) == 3 else function


def step_of(verb: str, client: str) -> str:
    """The step a call of script ``verb`` sent by connection ``client`` is."""
    return SENDER_STEPS.get((verb, client), SCRIPT_STEPS.get(verb, verb))
