"""``reckon cost adjust``, ``reckon usage export`` and ``reckon invoice reconcile`` against real books."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.operate import cli
from pipeline.state.keys import TenantKeys
from pipeline.state.store import Store
from tests.pipeline.test_adjustments import admit, complete

T0 = 1_796_000_000_000


def run(store: Store, capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv), store=store)
    out, err = capsys.readouterr()
    return code, out, err


def books(store: Store, tenant) -> dict[str, str]:
    """Jobs a, b, c on gpu-a (charged 10, 11, 12) and d on gpu-b (20); name -> job id (its prompt: op-<id>)."""
    tenant("acme", 10_000)
    jobs = {}
    for i, (name, units, server) in enumerate((("a", 10, "gpu-a"), ("b", 11, "gpu-a"), ("c", 12, "gpu-a"),
                                               ("d", 20, "gpu-b"))):
        jobs[name] = job = f"acme.{i + 1:020x}"
        admit(store, job, 60, now_ms=T0)
        complete(store, job, units, now_ms=T0 + 1000 * i, server=server)
    return jobs


def statement(tmp_path: Path, text: str) -> str:
    path = tmp_path / "statement.csv"
    path.write_text(text)
    return str(path)


def test_a_statement_equal_to_the_books_exits_0(store, tenant, capsys, tmp_path) -> None:
    jobs = books(store, tenant)
    text = "date,operation_id,units,sku\n" + "".join(
        f"2026-11-30,op-{jobs[n]},{u},gpu\n" for n, u in (("c", 12), ("a", 10), ("b", 11)))
    code, out, _ = run(store, capsys, "invoice", "reconcile", statement(tmp_path, text), "--server", "gpu-a")
    assert code == 0
    assert json.loads(out) == {"lines": 3, "unknown": [], "missing": [], "differ": [], "duplicate": [], "booked": [],
                                "refused": []}
    # a window that ends before c settled: c's line has no attempt in it
    code, out, _ = run(store, capsys, "invoice", "reconcile", statement(tmp_path, text), "--server", "gpu-a",
                       "--from", "2026-11-30T00:53:19Z", "--to", "2026-11-30T00:53:21.5Z")
    assert (code, json.loads(out)["unknown"], json.loads(out)["missing"]) == (
        1, [{"operation_id": f"op-{jobs['c']}", "units": 12}], [])
    # without --server, d (gpu-b) is an attempt with no line
    code, out, _ = run(store, capsys, "invoice", "reconcile", statement(tmp_path, text))
    assert code == 1
    assert json.loads(out)["missing"] == [{"operation_id": f"op-{jobs['d']}", "job": jobs["d"], "attempt": 1,
                                           "server": "gpu-b", "booked": 20}]


def test_every_kind_of_difference_is_listed_and_apply_books_each_once(store, tenant, capsys, tmp_path) -> None:
    jobs = books(store, tenant)
    a, b, c = (f"op-{jobs[n]}" for n in "abc")
    text = f"operation_id,units\n{a},10\n{b},15\nop-nobody,5\n{a},10\n"
    code, out, _ = run(store, capsys, "invoice", "reconcile", statement(tmp_path, text), "--server", "gpu-a")
    assert code == 1
    assert json.loads(out) == {
        "lines": 3,
        "unknown": [{"operation_id": "op-nobody", "units": 5}],
        "missing": [{"operation_id": c, "job": jobs["c"], "attempt": 1, "server": "gpu-a", "booked": 12}],
        "differ": [{"operation_id": b, "job": jobs["b"], "attempt": 1, "server": "gpu-a", "booked": 11,
                    "statement": 15}],
        "duplicate": [{"operation_id": a, "lines": [2, 5]}],
        "booked": [], "refused": []}
    assert store.ledger("acme")["settled"] == 53  # nothing booked without --apply

    clean = statement(tmp_path, f"operation_id,units\n{a},10\n{b},15\n")
    code, out, _ = run(store, capsys, "invoice", "reconcile", clean, "--server", "gpu-a", "--apply")
    assert code == 1
    assert json.loads(out)["booked"] == [
        {"booking_id": f"statement:{b}:15", "job": jobs["b"], "attempt": 1, "units": 4, "replayed": False},
        {"booking_id": f"statement:{c}:absent", "job": jobs["c"], "attempt": 1, "units": -12, "replayed": False}]
    assert store.ledger("acme")["settled"] == 53 + 4 - 12
    code, out, _ = run(store, capsys, "invoice", "reconcile", clean, "--server", "gpu-a", "--apply")
    assert (code, json.loads(out)["booked"]) == (0, [])  # the books now equal the statement: nothing more
    assert store.ledger("acme")["settled"] == 45
    assert store.redis.hlen(TenantKeys("acme").bookings) == 2


def test_a_malformed_statement_exits_2_and_changes_nothing(store, tenant, capsys, tmp_path) -> None:
    jobs = books(store, tenant)
    before = store.ledger("acme")
    for text, said in (("operation,units\nx,1\n", "line 1: the header must name operation_id and units"),
                       (f"operation_id,units\nop-{jobs['b']},15\nop-x,ten\n", "line 3: units 'ten' is not an integer"),
                       ("operation_id,units\n,3\n", "line 2: no operation_id"), ("", "line 1: the header")):
        code, out, err = run(store, capsys, "invoice", "reconcile", statement(tmp_path, text), "--apply")
        assert (code, out) == (2, "")
        assert said in err and err.count("\n") == 1
    assert run(store, capsys, "invoice", "reconcile", str(tmp_path / "absent.csv"))[0] == 2
    assert store.ledger("acme") == before
    assert store.redis.exists(TenantKeys("acme").bookings) == 0


def test_cost_adjust_books_once_and_refuses_another_amount(store, tenant, capsys) -> None:
    jobs = books(store, tenant)
    argv = ("cost", "adjust", jobs["a"], "--units", "7", "--id", "late-1", "--reason", "late charge", "--attempt", "1")
    code, out, _ = run(store, capsys, *argv)
    assert (code, json.loads(out)["replayed"], json.loads(out)["units"]) == (0, False, 7)
    code, out, _ = run(store, capsys, *argv)
    assert (code, json.loads(out)["replayed"]) == (0, True)
    code, _, err = run(store, capsys, "cost", "adjust", jobs["a"], "--units", "8", "--id", "late-1", "--reason", "x")
    assert code == 1 and "already booked 7" in err
    assert run(store, capsys, "cost", "adjust", "acme." + "f" * 20, "--units", "1", "--id", "z", "--reason", "x")[0] == 1
    assert store.ledger("acme")["settled"] == 53 + 7


def test_usage_export_in_both_formats_and_a_window(store, tenant, capsys) -> None:
    jobs = books(store, tenant)
    tenant("other", 100)
    code, out, _ = run(store, capsys, "usage", "export", "acme", "--format", "csv", "--from", "2026-11-30T00:53:21Z",
                       "--to", "2026-11-30T00:53:22.5Z")
    assert code == 0
    assert out == ("at,kind,booking_id,job,attempt,server,operation_id,seconds,units,reason\n"
                   f"2026-11-30T00:53:22.003Z,charge,charge:{jobs['c']}:1,{jobs['c']},1,gpu-a,op-{jobs['c']},,12,\n"
                   f"2026-11-30T00:53:21.003Z,charge,charge:{jobs['b']}:1,{jobs['b']},1,gpu-a,op-{jobs['b']},,11,\n")
    code, out, _ = run(store, capsys, "usage", "export", "acme", "--format", "jsonl")
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["job"], r["server"], r["units"]) for r in rows] == [
        (jobs["d"], "gpu-b", 20), (jobs["c"], "gpu-a", 12), (jobs["b"], "gpu-a", 11), (jobs["a"], "gpu-a", 10)]
    assert run(store, capsys, "usage", "export", "other")[1] == "at,kind,booking_id,job,attempt,server,operation_id,seconds,units,reason\n"
    assert run(store, capsys, "usage", "export", "nobody")[0] == 1


def test_a_duplicate_column_or_units_not_plain_digits_exit_2_and_change_nothing(store, tenant, capsys, tmp_path) -> None:
    jobs = books(store, tenant)
    b = f"op-{jobs['b']}"
    before = store.ledger("acme")
    for text, said in ((f"operation_id,units,units\n{b},11,99\n", "line 1: the header names units twice"),
                       (f"operation_id, units,units \n{b},11,99\n", "line 1: the header names units twice"),
                       (f"operation_id,units,operation_id\n{b},11,op-x\n", "line 1: the header names operation_id twice"),
                       (f"operation_id,units\n{b},1_5\n", "line 2: units '1_5' is not an integer"),
                       (f"operation_id,units\n{b},\u0661\u0665\n", "is not an integer"),  # Arabic-Indic 15
                       (f"operation_id,units\n{b},-4\n", "line 2: units '-4' is not an integer"),
                       (f"operation_id,units\n{b},15\nop-{jobs['a']},{2**53}\n", f"line 3: units '{2**53}' is not an integer from 0 to 2**53 - 1")):
        code, out, err = run(store, capsys, "invoice", "reconcile", statement(tmp_path, text), "--server", "gpu-a",
                             "--apply")
        assert (code, out) == (2, ""), text
        assert said in err and err.count("\n") == 1, err
    assert store.ledger("acme") == before
    assert store.redis.exists(TenantKeys("acme").bookings) == 0


def test_apply_reports_a_correction_its_id_refuses_and_books_the_others(store, tenant, capsys, tmp_path) -> None:
    jobs = books(store, tenant)
    a, b = f"op-{jobs['a']}", f"op-{jobs['b']}"
    text = statement(tmp_path, f"operation_id,units\n{a},10\n")  # b and c billed nothing
    assert run(store, capsys, "invoice", "reconcile", text, "--server", "gpu-a", "--apply")[0] == 1
    assert store.ledger("acme")["settled"] == 53 - 11 - 12
    store.adjust(jobs["b"], 5, "late-b", "late charge", attempt=1)  # b booked 5 again: absent asks -5
    text = statement(tmp_path, f"operation_id,units\n{a},10\n{b},0\n")
    code, out, err = run(store, capsys, "invoice", "reconcile", text, "--server", "gpu-a", "--apply")
    assert code == 1 and err == ""
    assert json.loads(out)["differ"] == [{"operation_id": b, "job": jobs["b"], "attempt": 1, "server": "gpu-a",
                                          "booked": 5, "statement": 0}]
    assert json.loads(out)["booked"] == [{"booking_id": f"statement:{b}:0", "job": jobs["b"], "attempt": 1,
                                          "units": -5, "replayed": False}]
    text = statement(tmp_path, f"operation_id,units\n{a},10\n")
    store.adjust(jobs["b"], 2, "late-b2", "late charge", attempt=1)  # absent now asks -2 under the id that booked -11
    code, out, err = run(store, capsys, "invoice", "reconcile", text, "--server", "gpu-a", "--apply")
    assert (code, err) == (1, "")
    assert json.loads(out)["refused"] == [{"booking_id": f"statement:{b}:absent", "job": jobs["b"], "attempt": 1,
                                           "units": -2, "why": f"booking id 'statement:{b}:absent' already booked -11"
                                           f" units against job {jobs['b']} attempt 1; nothing changed"}]
    assert store.ledger("acme")["settled"] == 53 - 11 - 12 + 5 - 5 + 2
