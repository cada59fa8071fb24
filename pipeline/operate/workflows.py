"""The ``reckon workflow`` commands: save a version of a workflow (for every tenant, or one with ``--tenant``),
list the saved ones, show one version (docs/api.md "Saved workflows")."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from pipeline.errors import InvalidRequest
from pipeline.operate.commands import _print
from pipeline.settings import Settings
from pipeline.state.store import Store
from pipeline.state.tenants import _require
from pipeline.state.workflows import SHARED, Workflows


def add_parsers(verbs: Any) -> None:
    workflow = verbs.add_parser("workflow").add_subparsers(dest="verb", required=True)
    save = workflow.add_parser("save", help="save the next version of NAME: FILE is the graph in ComfyUI's API format")
    save.add_argument("name")
    save.add_argument("file", type=Path)
    save.add_argument("--params", type=Path, help="a JSON file: parameter name -> {node, input, type, ...}")
    save.add_argument("--tenant", help="one tenant's own workflow (default: for every tenant)")
    save.set_defaults(run=workflow_save)
    listing = workflow.add_parser("list", help="saved workflows: name, owner, latest version")
    listing.add_argument("--tenant", help="only those this tenant may name")
    listing.set_defaults(run=workflow_list)
    show = workflow.add_parser("show", help="one version (NAME@V) or the latest (NAME), with its graph")
    show.add_argument("ref")
    show.add_argument("--tenant", help="look in this tenant's own workflows too")
    show.set_defaults(run=workflow_show)


def _workflows(store: Store) -> Workflows:
    return Workflows(store.redis, store.scripts, Settings.from_env())


def workflow_save(store: Store, args: argparse.Namespace) -> int:
    owner = SHARED
    if args.tenant:
        _require(store.redis, args.tenant)
        owner = args.tenant
    graph = orjson.loads(args.file.read_bytes())
    params = orjson.loads(args.params.read_bytes()) if args.params else {}
    try:
        version, _ = _workflows(store).save(owner, args.name, graph, params)
    except InvalidRequest as exc:
        raise InvalidRequest(exc.field, f"{exc.field}: {exc.detail}", problem=exc.problem) from None
    _print(version.view(with_graph=False))
    return 0


def workflow_list(store: Store, args: argparse.Namespace) -> int:
    _print({"workflows": _workflows(store).listing(args.tenant or None)})
    return 0


def workflow_show(store: Store, args: argparse.Namespace) -> int:
    version = _workflows(store).resolve(args.tenant or SHARED, args.ref)
    if version is None:
        raise InvalidRequest("ref", f"no saved workflow {args.ref}" + (f" for {args.tenant}" if args.tenant else ""))
    _print(version.view(with_graph=True))
    return 0
