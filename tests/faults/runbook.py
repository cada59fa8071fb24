"""Which text of ops/RUNBOOK.md and of the docs' ``sh run`` blocks is a command (the rule is in
tests/faults/test_runbook.py's docstring), and the commands that test makes state for and runs."""

from __future__ import annotations

import re

from tests.faults.conftest import ROOT

RUNBOOK = ROOT / "ops" / "RUNBOOK.md"
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = "sh run"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELLS = ("sh", "bash", "shell")
SPAN = re.compile(r"`([^`]+)`")
COMMENT = re.compile(r"\s+#\s.*$")
ASSIGNMENT = re.compile(r"^[a-z_]+=")
CHOICES = re.compile(r"[\w-]+(?:\|[\w-]+)+")
PLACEHOLDER = re.compile(r"\b(?:JOB_ID|TENANT|SERVER|FILE|ID)\b|(?<!\S)[NB](?!\S)")
INLINE_STARTS = ("reckon ", "redis-cli ", "python -m ")

# The commands this test makes state for and runs, as the runbook writes them.
NOW = "now=$(( $(redis-cli -p 6390 TIME | head -1) * 1000 ))"
KNOWN = frozenset({
    "reckon status",
    "reckon status; reckon provider status",
    "reckon provider status",
    "reckon job show JOB_ID",
    "reckon jobs --state reconciling",
    "reckon review list",
    "reckon review resolve JOB_ID --completed",
    "reckon review resolve JOB_ID --failed",
    "reckon review resolve JOB_ID --retry",
    "reckon dlq list",
    "reckon dlq replay JOB_ID",
    "reckon pause --class interactive",
    "reckon pause --class batch",
    "reckon resume --class interactive",
    "reckon resume --class batch",
    "reckon pause --provider SERVER",
    "reckon provider pause SERVER",
    "reckon provider clear SERVER",
    "reckon provider forget SERVER",
    "reckon tenant show TENANT",
    "reckon tenant webhook list TENANT",
    "reckon tenant disable TENANT",
    "reckon tenant set TENANT --max-inflight N --rate 5/s --burst B",
    "reckon invoice reconcile FILE",
    "reckon invoice reconcile FILE --apply",
    "reckon usage export TENANT --format jsonl",
    "reckon cost adjust JOB_ID --units N --id ID --reason 'agreed with the provider'",
    "curl -s 127.0.0.1:8000/readyz",
    "curl -s 127.0.0.1:8000/metrics | grep ^reckon_",
    NOW,
    "redis-cli -p 6390 ZRANGEBYSCORE reckon:{s0}:due -inf $now LIMIT 0 20",
    "redis-cli -p 6390 ZRANGEBYSCORE reckon:{s0}:due 1e13 $(( 10**13 + now )) LIMIT 0 20",
    "redis-cli -p 6390 ZRANGE reckon:{s0}:queue 0 0 WITHSCORES",
    "redis-cli -p 6390 ZRANGEBYSCORE reckon:{s0}:queue 1e13 +inf WITHSCORES LIMIT 0 1",
    "redis-cli -p 6390 HGETALL reckon:{s0}:stats | paste - - | grep refused:",
    "redis-cli -p 6390 HGETALL reckon:{s0}:admission",
    "redis-cli -p 6390 HSET reckon:{s0}:admission queue_cap:batch N",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:reconcile' 0 -1 WITHSCORES",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:outbox' 0 -1 WITHSCORES",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:webhooks:ready' 0 9 WITHSCORES",
    "redis-cli -p 6390 HDEL reckon:{s0}:fleet provider_credentials:SERVER",
    "redis-cli -p 6390 HGET reckon:{s0}:fleet dispatch_paused:SERVER",
    "redis-cli -p 6390 HKEYS reckon:{s0}:fleet",
    "redis-cli -p 6390 HGETALL reckon:sweeper",
    "redis-cli -p 6390 HGETALL 'reckon:{p:comfyui}:budget'",
    "redis-cli -p 6390 -n 1 ZRANGE dramatiq:reckon-interactive.XQ 0 -1",
    "python -m pipeline.work.watcher",
    "python -m pipeline.work.sweeper",
})


# The commands of the docs' runnable blocks (docs/redis.md), run after the runbook's.
DOCS_KNOWN = frozenset({
    "redis-cli -p 6390 SMEMBERS 'reckon:{s0}:tenants'",
    "redis-cli -p 6390 HGETALL 'reckon:{s0}:stats'",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:queue' 0 0 WITHSCORES",
    """redis-cli -p 6390 ZCOUNT 'reckon:{s0}:due' 0 "($(date +%s%3N)\"""",
    "redis-cli -p 6390 HGETALL 'reckon:{s0}:t:TENANT:ledger'",
    "redis-cli -p 6390 HGETALL 'reckon:{s0}:t:TENANT:counts'",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:leases' 0 -1 WITHSCORES",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:outbox' 0 -1 WITHSCORES",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:retry' 0 -1 WITHSCORES",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:t:TENANT:dead' 0 -1 WITHSCORES",
    "redis-cli -p 6390 HGETALL 'reckon:{s0}:fleet'",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:fleet:parked' 0 -1 WITHSCORES",
    "redis-cli -p 6390 ZRANGE 'reckon:{s0}:wake' 0 -1 WITHSCORES",
    "redis-cli -p 6390 HGETALL 'reckon:{s0}:job:JOB_ID'",
    "redis-cli -p 6390 LRANGE 'reckon:{s0}:job:JOB_ID:events' 0 -1",
    "redis-cli -p 6390 HGETALL 'reckon:{p:comfyui}:budget'",
    "redis-cli -p 6390 HGETALL reckon:sweeper",
    "redis-cli -p 6390 -n 1 LLEN dramatiq:reckon-interactive",
})


def block_commands(text: str, languages: tuple[str, ...]) -> dict[str, str]:
    """Each line of the fenced blocks in ``languages`` -> the shell lines its block set before it."""
    found: dict[str, str] = {}
    for language, block in FENCE.findall(text):
        if language.strip() not in languages:
            continue
        prelude = ""
        for line in block.splitlines():
            command = COMMENT.sub("", line).strip()
            if command:
                found.setdefault(command, prelude)
                prelude += command + "\n" if ASSIGNMENT.match(command) else ""
    return found


def docs_commands() -> dict[str, str]:
    """Each line of a fenced ``sh run`` block of the docs -> the shell lines its block set before it."""
    found: dict[str, str] = {}
    for doc in DOCS:
        for command, prelude in block_commands(doc.read_text(), (RUNNABLE,)).items():
            found.setdefault(command, prelude)
    return found


def runbook_commands(text: str) -> dict[str, str]:
    """Each command of the runbook (the rule is in the module's docstring) -> the shell lines it needs
    before it (the variables its block set)."""
    found = block_commands(text, SHELLS)
    spans = (" ".join(span.split()) for span in SPAN.findall(FENCE.sub("", text)))
    inline = {choice for span in spans if span.startswith(INLINE_STARTS) for choice in _choices(span.split())}
    every = inline | set(found)
    for span in inline:
        words = span.split()
        if not any(other != span and other.split()[:len(words)] == words for other in every):
            found.setdefault(span, "")
    return found


def _choices(words: list[str]) -> list[str]:
    """One command per choice of the first word made of choices (``interactive|batch``), recursively."""
    for i, word in enumerate(words):
        if CHOICES.fullmatch(word):
            return [command for choice in word.split("|") for command in _choices([*words[:i], choice, *words[i + 1:]])]
    return [" ".join(words)]
