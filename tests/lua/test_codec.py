"""A finished job's compact record (lua/_codec.lua writes it, pipeline/state/archive.py reads it): every
reader gets back what the job's own keys held, whatever the values, and the two sides list the same
keys in the same order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.state import archive
from pipeline.state.keys import JobKeys
from pipeline.state.store import Store

CODEC = (Path(__file__).resolve().parent.parent.parent / "lua" / "_codec.lua").read_text()


def lua_list(name: str) -> tuple[str, ...]:
    body = re.search(rf"local {name} = \{{(.*?)\}}", CODEC, re.S).group(1)
    return tuple(re.findall(r"'([a-z_0-9]+)'", body))


def test_both_sides_list_the_same_keys_in_the_same_order() -> None:
    assert lua_list("RECORD_FIELDS") == archive.RECORD_FIELDS
    assert lua_list("ATTEMPT_KEYS") == archive.ATTEMPT_KEYS
    assert lua_list("ATTEMPT_TIMED_KEYS") == archive.ATTEMPT_TIMED_KEYS
    assert lua_list("EVENT_KEYS") == archive.EVENT_KEYS
    assert lua_list("OUTPUT_KEYS") == archive.OUTPUT_KEYS
    assert set(re.findall(r"(\w+) = true", re.search(r"local RECORD_TIMES = \{(.*?)\}", CODEC).group(1))) == \
        archive.RECORD_TIMES
    assert set(re.findall(r"(\w+) = true", re.search(r"local ITEM_TIMES = \{(.*?)\}", CODEC).group(1))) == \
        archive.ITEM_TIMES


TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
#: Redis strings that look like integers and some that only nearly do (they must stay strings).
NUMBERISH = st.one_of(st.integers(-10**15, 10**15).map(str), st.sampled_from(["007", "-0", "1e3", " 1", "1.5", ""]))
VALUE = st.one_of(TEXT, NUMBERISH)
JSON_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-2**52, 2**52), TEXT,
                       st.integers(-10**9, 10**9).map(lambda n: n / 8 + 1 / 16),
                       st.sampled_from([2.0, -0.0, 1e14, 1e300, 2**53 + 1, -(2**63), 2**64 - 1, [], {}, [1, "a"],
                                        {"k": [None]}]))  # what Lua's numbers and tables would not keep
MOMENT = st.one_of(st.integers(0, 2**42), JSON_VALUE)
JOB_ID = "acme.0123456789abcdef0123"
EXTRA_NAME = st.from_regex(r"[a-y][a-z_]{0,8}", fullmatch=True)


def item(names: tuple[str, ...]) -> st.SearchStrategy[dict[str, Any]]:
    """An attempt, event or output: its usual keys in their usual order, or in another order, with a key
    missing or one more."""
    usual = st.fixed_dictionaries({name: MOMENT if name in archive.ITEM_TIMES else JSON_VALUE for name in names}).map(
        lambda item: {name: item[name] for name in names})
    return st.one_of(usual, usual, st.permutations(names).flatmap(
        lambda order: st.fixed_dictionaries({name: JSON_VALUE for name in order})),
        st.tuples(usual, EXTRA_NAME, JSON_VALUE).map(lambda t: {**t[0], t[1]: t[2]} if t[1] not in t[0] else t[0]),
        usual.map(lambda d: dict(list(d.items())[1:])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.fixed_dictionaries({"created_at": NUMBERISH, **{name: VALUE for name in archive.RECORD_FIELDS[2:]}},
                                    optional={"id": st.one_of(st.just(JOB_ID), VALUE),
                                              "tenant": st.one_of(st.just("acme"), VALUE)}),
       extra=st.dictionaries(EXTRA_NAME.map(lambda n: "x_" + n), VALUE, max_size=2),
       attempts=st.lists(item(archive.ATTEMPT_KEYS), max_size=3),
       events=st.lists(item(archive.EVENT_KEYS), max_size=4),
       outputs=st.lists(item(archive.OUTPUT_KEYS), max_size=3),
       state=st.sampled_from(["completed", "cancelled"]))
def test_a_packed_job_reads_back_as_its_keys_held_it(store: Store, fields, extra, attempts, events, outputs,
                                                      state) -> None:
    store.redis.flushdb()
    job_id = JOB_ID
    j = JobKeys(job_id)
    record = {"state": state, **fields, **extra}
    store.redis.hset(j.record, mapping=record)
    if attempts:
        store.redis.hset(j.attempts, mapping={str(n): orjson.dumps(a) for n, a in enumerate(attempts, 1)})
    if events:
        store.redis.rpush(j.events, *(orjson.dumps(e) for e in events))
    if outputs:
        store.redis.hset(j.outputs, mapping={str(n * 3): orjson.dumps(o) for n, o in enumerate(outputs)})
    before = (store.job(job_id), store.attempts(job_id), store.events(job_id), store.outputs(job_id))
    parts = [j.attempts, j.events, j.outputs, j.progress, j.progress_seen]
    assert store.scripts("pack", [j.record, *parts, j.workflow], []) == [0, 1]
    assert sorted(store.redis.hkeys(j.record)) == ["state", "z"]
    after = (store.job(job_id), store.attempts(job_id), store.events(job_id), store.outputs(job_id))
    assert after[0] == before[0]  # a record's fields: views pick them by name
    assert orjson.dumps(after[1:], option=orjson.OPT_NON_STR_KEYS) == orjson.dumps(before[1:], option=orjson.OPT_NON_STR_KEYS)  # items byte for byte: their keys' order too


SHA = "5ea6256345e1f585d47691390902a50dfc02a9fe9e6c894d3608fc06423be652"


def test_version_2_writes_digests_short_and_leaves_out_a_from_that_follows(store: Store) -> None:
    """A digest of 64 hex digits takes 44 characters, an event whose `from` is the `to` before it 4
    values (3 when its reason is its `to`), an output of the content type before it 3, the deadline 0 when
    it is deadline_s after created_at, the nulls at the end of the record none, a slash one character: what
    every reader gets back is unchanged, byte for byte. A sha256 that would read as a short digest keeps
    its output an object."""
    j = JobKeys(JOB_ID)
    store.redis.hset(j.record, mapping={"state": "completed", "id": JOB_ID, "tenant": "acme", "created_at": "1000",
                                        "kind": "image/x", "error_class": "", "obsolete": "0",
                                        "deadline_s": "60", "deadline": "61000"})
    events = [{"at": 1000, "to": "queued", "from": None, "seq": 1, "reason": "admitted"},
              {"at": 1010, "to": "running", "from": "queued", "seq": 2, "reason": "claimed"},
              {"at": 1020, "to": "retry_wait", "from": "queued", "seq": 3, "reason": "a/b"},
              {"at": 1030, "to": "completed", "from": "retry_wait", "seq": 4, "reason": "completed"}]
    store.redis.rpush(j.events, *(orjson.dumps(e) for e in events))
    outputs = [{"sha256": SHA, "bytes": 74, "content_type": "image/png"},
               {"sha256": SHA, "bytes": 75, "content_type": "image/png"},
               {"sha256": "=" + "A" * 43, "bytes": 1, "content_type": "image/png"},
               {"sha256": SHA, "bytes": 76, "content_type": "image/png"}]
    store.redis.hset(j.outputs, mapping={str(n): orjson.dumps(o) for n, o in enumerate(outputs)})
    before = (store.job(JOB_ID), store.events(JOB_ID), store.outputs(JOB_ID))
    parts = [j.attempts, j.events, j.outputs, j.progress, j.progress_seen]
    assert store.scripts("pack", [j.record, *parts, j.workflow], []) == [0, 1]
    z = store.redis.hget(j.record, "z")
    packed = orjson.loads(z)
    assert (packed[0], len(packed[2]), "\\/" in z) == (2, archive.RECORD_FIELDS.index("obsolete") + 1, False)
    assert [len(event) for event in packed[5]] == [4, 4, 5, 3]
    short = "=XqYlY0Xh9YXUdpE5CQKlDfwCqf6ebIlNNgj8BkI75lC"
    assert packed[6] == [[0, short, 74, "image/png"], [1, short, 75], [2, outputs[2]], [3, short, 76, "image/png"]]
    assert packed[2][archive.RECORD_FIELDS.index("deadline")] == 0
    assert (store.job(JOB_ID), store.events(JOB_ID), store.outputs(JOB_ID)) == before
    assert store.outputs(JOB_ID)[0]["sha256"] == SHA


def test_a_record_packed_by_version_1_reads_as_it_did(store: Store) -> None:
    """Version 1: every null, every `from`, digests in hex, slashes escaped."""
    z = ('[1,1000,[true,true,"k1","image","interactive",1,10,10,30,3,1,null,0,0,0,10,1,"",3,1,2,60,60000,20,20,"",'
         '"completed","",null,null,null],{},[[1,12,10,"vm\\/1","completed",null,11,1,"comfyui",20,"op-1","sim"]],'
         '[[0,"queued",null,1,"admitted"],[11,"running","queued",2,"claimed"],[20,"completed","running",3,"completed"]],'
         f'[[0,"{SHA}",74,"image\\/png"]]]')
    store.redis.hset(JobKeys(JOB_ID).record, mapping={"state": "completed", "z": z})
    assert store.outputs(JOB_ID) == {0: {"sha256": SHA, "bytes": 74, "content_type": "image/png"}}
    assert [(e["at"], e["from"], e["to"]) for e in store.events(JOB_ID)] == [
        (1000, None, "queued"), (1011, "queued", "running"), (1020, "running", "completed")]
    assert store.attempts(JOB_ID)[0]["worker"] == "vm/1"
    job = store.job(JOB_ID)
    assert (job["id"], job["tenant"], job["idem_key"], job["deadline"], job["settled"], job.get("obsolete")) == (
        JOB_ID, "acme", "k1", "61000", "10", None)
