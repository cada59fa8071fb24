"""Where a script's Lua time goes: the deployed path (ops/bench/deployed.py, at a cap no job waits for)
run on an instrumented copy of reckon's library, each helper of ``lua/_*.lua`` timed by Redis's clock.

The copy is reckon's library with, after the helpers, each helper replaced by a wrapper that reads
``TIME`` before and after it (a Lua local is captured as a variable, so every helper that calls it
calls the wrapper) and each script's function wrapped likewise; it is loaded under the library's own
name before any process starts, so the processes find it and call it. A helper's *self* time is its
time less the time of the helpers it called. Two TIME reads a call make the scripts about four times
slower, and the leaf helpers' self time is mostly that: read the shares, not the microseconds.
``--baseline`` measures what a call costs before any of reckon's Lua runs: a no-op function in a library
with every helper and script, and in a bare one, each call timed by SLOWLOG (docs/performance.md "Redis
CPU per step").
"""

from __future__ import annotations

import re
import statistics
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

import redis

from ops.bench.benchlib import ROOT, free_port, wait_for
from ops.bench.deployed import run
from pipeline.state.scripts import LUA_DIR, Scripts

_HELPER_RE = re.compile(r"^local function (\w+)\(", re.MULTILINE)
#: The timing, inserted after the helpers and before the library's ``run``.
_TIMING = r"""
local PROF_T, PROF_N, PROF_CUR, PROF_CHILD = {}, {}, '?', 0
local function prof_now() local t = redis.call('TIME') return tonumber(t[1]) * 1000000 + tonumber(t[2]) end
local function prof_pack(...) return select('#', ...), {...} end
local function prof_add(k, d) PROF_T[k] = (PROF_T[k] or 0) + d PROF_N[k] = (PROF_N[k] or 0) + 1 end
local function prof_wrap(name, f)
  return function(...)
    local saved = PROF_CHILD
    PROF_CHILD = 0
    local t0 = prof_now()
    local n, r = prof_pack(f(...))
    local d = prof_now() - t0
    prof_add(PROF_CUR .. ' ' .. name, d - PROF_CHILD)
    PROF_CHILD = saved + d
    return unpack(r, 1, n)
  end
end
local function prof_script(verb, f)
  return function(keys, args)
    PROF_CUR, PROF_CHILD = verb, 0
    local t0 = prof_now()
    local r = f(keys, args)
    local d = prof_now() - t0
    prof_add(verb .. ' (whole)', d)
    prof_add(verb .. ' (its body)', d - PROF_CHILD)
    return r
  end
end
"""
#: Answers every "<script> <helper> <µs> <calls>" measured so far.
_DUMP = ("redis.register_function('{library}_prof_dump', function() local out = {{}} "
         "for k, v in pairs(PROF_T) do out[#out + 1] = k .. ' ' .. v .. ' ' .. PROF_N[k] end return out end)\n")


def helper_files() -> dict[str, str]:
    """Each helper's name -> the file that defines it (``_codec.lua``)."""
    return {name: path.name for path in sorted(LUA_DIR.glob("_*.lua")) for name in _HELPER_RE.findall(path.read_text())}


def instrumented(scripts: Scripts) -> str:
    """``scripts``' library source with every helper and script function timed."""
    prelude = "".join(path.read_text() for path in sorted(LUA_DIR.glob("_*.lua")))
    wraps = "".join(f"{name} = prof_wrap('{name}', {name})\n" for name in _HELPER_RE.findall(prelude))
    source = scripts.source
    at = source.index("local function run(body)")
    source = source[:at] + _TIMING + wraps + source[at:]
    for verb, (_, function) in scripts._scripts.items():
        opening = f"redis.register_function('{function}', run(function()\n"
        start = source.index(opening)
        end = source.index("\nend))\n", start)
        source = (source[:start] + f"redis.register_function('{function}', prof_script('{verb}', run(function()\n"
                  + source[start + len(opening):end] + "\nend)))\n" + source[end + len("\nend))\n"):])
    return source + _DUMP.format(library=scripts.library)


def profile(work: Path, jobs: int) -> dict[tuple[str, str], tuple[int, int]]:
    """(script, helper) -> (self µs, calls) over a run of ``jobs`` jobs (the warm-up job's included)."""
    scripts = Scripts(redis.Redis())  # the source only: no call is made through this client
    dumped: list[str] = []
    run(work, jobs=jobs, cap=jobs, library=instrumented(scripts),
        after=lambda client: dumped.extend(client.fcall(f"{scripts.library}_prof_dump", 0)))
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for line in dumped:
        script, rest = line.split(" ", 1)
        helper, us, calls = rest.rsplit(" ", 2)
        out[(script, helper)] = (int(us), int(calls))
    return out


def baseline(calls: int = 2000, argument: int = 10_240) -> dict[str, float]:
    """Median µs (SLOWLOG) of a no-op FCALL with 9 keys: bare, in a library with all of reckon's Lua (as
    it is, and through the wrapper every script runs in: pipeline/state/scripts.py), and with an
    ``argument``-byte argument."""
    port = free_port()
    with tempfile.TemporaryDirectory() as workdir:
        server = subprocess.Popen(["redis-server", str(ROOT / "ops" / "redis.conf"), "--port", str(port), "--dir",
                                   workdir, "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port)
            wait_for(client.ping)
            scripts = Scripts(client)
            client.function_load(scripts.source.replace(scripts.library, "full")
                                 + "redis.register_function('full_noop', function() return 1 end)\n"
                                 + "redis.register_function('full_run', run(function() return 1 end))\n")
            client.function_load("#!lua name=bare\nredis.register_function('bare_noop', function() return 1 end)")
            keys = [f"k{i}" for i in range(9)]
            medians = {}
            for name, function, args in (("bare library", "bare_noop", ()), ("reckon's library", "full_noop", ()),
                                         ("reckon's library, through its run wrapper", "full_run", ()),
                                         (f"reckon's library, a {argument}-byte argument", "full_noop",
                                          ("x" * argument,))):
                client.config_set("slowlog-log-slower-than", 0)
                client.config_set("slowlog-max-len", calls + 10)
                client.slowlog_reset()
                for _ in range(calls):
                    client.fcall(function, len(keys), *keys, *args)
                logged = client.execute_command("SLOWLOG", "GET", -1)
                medians[name] = statistics.median(e[2] for e in logged if e[3][0].upper() == b"FCALL")
            return medians
        finally:
            server.terminate()
            server.wait(timeout=10)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--top", type=int, default=8, help="helpers shown per script")
    parser.add_argument("--baseline", action="store_true", help="a no-op call's cost instead (no stack)")
    args = parser.parse_args()
    if args.baseline:
        for name, us in baseline().items():
            print(f"no-op FCALL, {name}: {us:.1f} us at the median")
        return
    with tempfile.TemporaryDirectory(prefix="reckon-luaprof-") as tmp:
        measured = profile(Path(tmp), args.jobs)
    by_script: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for (script, helper), (us, calls) in measured.items():
        by_script[script].append((helper, us, calls))
    defined = helper_files()
    whole = {script: next(us for helper, us, _ in rows if helper == "(whole)") for script, rows in by_script.items()}
    for script in sorted(whole, key=lambda s: -whole[s]):
        rows = by_script[script]
        runs = next(calls for helper, _, calls in rows if helper == "(whole)")
        files: dict[str, int] = defaultdict(int)
        for helper, us, _ in rows:
            if helper != "(whole)":
                files[defined.get(helper, "the script's body")] += us
        print(f"{script}: {whole[script] / runs:.0f} us a call instrumented, {runs} calls; self time by file: "
              + ", ".join(f"{name} {us / whole[script]:.0%}" for name, us in sorted(files.items(), key=lambda kv: -kv[1])))
        for helper, us, calls in sorted((r for r in rows if r[0] != "(whole)"), key=lambda r: -r[1])[:args.top]:
            print(f"  {helper:24s} {us / whole[script]:6.1%}  {calls / runs:6.1f} calls a call")


if __name__ == "__main__":
    main()
