"""``reckon workflow save|list|show`` against a real redis-server."""

from __future__ import annotations

from pathlib import Path

import orjson

from pipeline.operate import cli
from pipeline.state.tenants import create_tenant

GRAPH = {"3": {"class_type": "KSampler", "inputs": {"seed": 1, "text": "a saved prompt"}}}
PARAMS = {"seed": {"node": "3", "input": "seed", "type": "integer", "minimum": 0}}


def run(store, capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv), store=store)
    out, err = capsys.readouterr()
    return code, out, err


def test_save_list_show_and_refusals(store, capsys, tmp_path: Path) -> None:
    create_tenant(store.redis, "acme", 100)
    graph, params = tmp_path / "graph.json", tmp_path / "params.json"
    graph.write_bytes(orjson.dumps(GRAPH))
    params.write_bytes(orjson.dumps(PARAMS))
    code, out, _ = run(store, capsys, "workflow", "save", "portrait", str(graph), "--params", str(params))
    assert code == 0 and orjson.loads(out)["ref"] == "portrait@1" and "a saved prompt" not in out
    assert run(store, capsys, "workflow", "save", "portrait", str(graph))[0] == 0  # version 2, no parameters
    code, _, err = run(store, capsys, "workflow", "save", "mine", str(graph), "--tenant", "acme")
    assert code == 0
    code, _, err = run(store, capsys, "workflow", "save", "portrait", str(graph), "--tenant", "acme")
    assert code == 1 and "taken by a shared workflow" in err
    params.write_bytes(orjson.dumps({"seed": {"node": "9", "input": "seed", "type": "integer"}}))
    code, _, err = run(store, capsys, "workflow", "save", "other", str(graph), "--params", str(params))
    assert code == 1 and "params.seed" in err
    code, out, _ = run(store, capsys, "workflow", "list")
    assert orjson.loads(out) == {"workflows": [{"name": "mine", "owner": "acme", "latest": 1},
                                               {"name": "portrait", "owner": "shared", "latest": 2}]}
    code, out, _ = run(store, capsys, "workflow", "show", "portrait@1")
    shown = orjson.loads(out)
    assert (code, shown["version"], shown["workflow"], list(shown["params"])) == (0, 1, GRAPH, ["seed"])
    assert orjson.loads(run(store, capsys, "workflow", "show", "portrait")[1])["params"] == {}
    assert run(store, capsys, "workflow", "show", "mine")[0] == 1  # acme's: only with --tenant
    assert orjson.loads(run(store, capsys, "workflow", "show", "mine", "--tenant", "acme")[1])["version"] == 1
