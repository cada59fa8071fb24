"""The docs name only what exists: every path, module (the client's ``reckon.client`` too), Lua script,
``reckon`` command, ``RECKON_*`` variable and Redis key pattern that ``README.md``, ``docs/`` or
``ops/RUNBOOK.md`` names is checked against the code, and every setting is documented. A renamed
file, a dropped command or a key spelled otherwise fails here, naming the document and the stale name."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.operate.cli import parser
from pipeline.state import keys
from pipeline.state.keys import JobKeys, ProviderKeys, ShardKeys, TenantKeys

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "ops" / "RUNBOOK.md", *(ROOT / "docs").glob("*.md")])
CODE = [*ROOT.glob("pipeline/**/*.py"), *ROOT.glob("api/**/*.py"), *ROOT.glob("ops/**/*"),
        *ROOT.glob("tests/**/*.py"), ROOT / "Procfile", ROOT / "Procfile.dev", ROOT / "Makefile", ROOT / ".ci" / "run"]

PATH = re.compile(r"(?<![\w./{:<-])((?:pipeline|api|lua|ops|tests|docs|client|\.ci)/[\w./*<>-]*[\w/*])")
MODULE = re.compile(r"(?<![\w./-])((?:pipeline|api|ops)(?:\.\w+)+(?::\w+)?|reckon\.client(?:\.\w+)*(?::\w+)?)")
LUA = re.compile(r"(?<![\w/<.-])([a-z_][\w-]*\.lua)\b")
SCRIPT_WITH_COUNT = re.compile(r"(?<![\w-])([a-z]+(?:-[a-z]+)*-[0-9]+|<verb>-<\w+>)(?:\.lua)?(?![\w-])")
CODE_TEXT = re.compile(r"```[^\n]*\n(.*?)```|`([^`\n]+)`", re.DOTALL)
COMMAND = re.compile(r"(?:(?<=\.venv/bin/)|(?<![\w/.-]))reckon((?: [a-z][a-z-]*)+)")
BARE_FILE = re.compile(r"^([\w.-]+\.(?:py|lua|md|yml|yaml|sh|conf|toml|html|json))$")
KEY = re.compile(r"(?<![\w:])(reckon:(?:<[^>\n]+>|[^\s`'\"|)])+)")
#: Keys named by the docs that keys.py does not build: the durable writes' marker (built in
#: pipeline/state/scripts.py) and the layout before shards, which ``reckon keys migrate`` reads.
OTHER_KEYS = {"reckon:{s<n>}:ack": "pipeline/state/scripts.py", "reckon:{t:<tenant>}:...": "pipeline/state/migrate.py",
              "reckon:stats": "pipeline/state/migrate.py"}
VARIABLE = re.compile(r"\bRECKON_[A-Z0-9_]*[A-Z0-9]\b")
KEY_TABLE = ROOT / "docs" / "redis.md"
TABLE_KEY = re.compile(r"^\| `(reckon:[^`]+)` \|", re.MULTILINE)


def text(path: Path) -> str:
    return path.read_text()


def code_spans(doc: str) -> list[str]:
    """The text of every fenced block and inline code span."""
    return [block or span for block, span in CODE_TEXT.findall(doc)]


def named(pattern: re.Pattern[str], *, code_only: bool = False) -> list[tuple[str, str]]:
    """(document, name) for every match of ``pattern`` in the docs."""
    found = []
    for path in DOCS:
        doc = text(path)
        for chunk in (code_spans(doc) if code_only else [doc]):
            found += [(path.name, match.group(1) if match.groups() else match.group(0))
                      for match in pattern.finditer(chunk)]
    return found


def test_the_checks_find_what_the_docs_name() -> None:
    """Each pattern finds names in today's docs, so a check that matches nothing cannot pass unseen."""
    counts = {pattern.pattern[:20]: len(named(pattern, code_only=pattern is COMMAND))
              for pattern in (PATH, MODULE, LUA, COMMAND, VARIABLE)}
    assert min(counts.values()) >= 10, counts


def test_every_path_the_docs_name_exists() -> None:
    missing = []
    for doc, name in named(PATH):
        if "<" in name:  # a pattern (lua/<verb>.lua): its fixed part must exist
            name = name[: name.index("<")].rpartition("/")[0]
        if not list(ROOT.glob(name.rstrip("/"))):
            missing.append((doc, name))
    assert missing == []


LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#+ (.+)$", re.MULTILINE)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_lands_on_a_file_and_a_heading() -> None:
    broken = []
    for path in DOCS:
        for target in LINK.findall(text(path)):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            name, _, anchor = target.partition("#")
            linked = (path.parent / name).resolve() if name else path
            if not linked.exists():
                broken.append((path.name, target))
            elif anchor and linked.suffix == ".md" and anchor not in {slug(h) for h in HEADING.findall(text(linked))}:
                broken.append((path.name, target))
    assert broken == []


def exists(dotted: str) -> bool:
    """A module, or a name a module defines (``pipeline.state.keys.JobKeys``, ``api.app:create_app``)."""
    parts = dotted.replace(":", ".").split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:  # a parent is a module, not a package
            continue
        value: object = importlib.import_module(module)
        for attribute in parts[cut:]:
            if not hasattr(value, attribute):
                return False
            value = getattr(value, attribute)
        return True
    return False


def test_every_module_the_docs_name_exists() -> None:
    names = [(doc, name) for doc, name in named(MODULE) if not name.endswith((".md", ".py", ".html"))]
    assert [(doc, name) for doc, name in names if not exists(name)] == []


#: Lua scripts of other projects the docs name.
ELSEWHERE = frozenset({"dispatch.lua"})  # Dramatiq's Redis broker script (dramatiq/brokers/redis/dispatch.lua)


def test_every_lua_script_the_docs_name_exists() -> None:
    scripts = {path.name for path in [*ROOT.glob("lua/*.lua"), *ROOT.glob("ops/**/*.lua")]} | ELSEWHERE
    assert [(doc, name) for doc, name in named(LUA) if name not in scripts] == []


def test_no_doc_names_a_script_by_its_old_key_count() -> None:
    verbs = {path.stem for path in ROOT.glob("lua/*.lua")}
    named_so = [(doc, name) for doc, name in named(SCRIPT_WITH_COUNT)]
    assert [(doc, name) for doc, name in named_so if name.startswith("<") or name.rpartition("-")[0] in verbs] == []


def test_every_file_named_alone_exists_somewhere() -> None:
    """A code span that is a file name alone (`views.py`) names a file of the repository."""
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = {Path(line).name for line in tracked.splitlines()} | ELSEWHERE
    assert [(doc, name) for doc, name in named(BARE_FILE, code_only=True) if name not in files] == []


def test_the_other_keys_are_built_where_the_docs_say() -> None:
    """A key outside keys.py that the docs name is still spelled by the module that builds or reads it."""
    for key, module in OTHER_KEYS.items():
        source = (ROOT / module).read_text()
        assert key.replace("{s<n>}", "{tag}").replace("<tenant>", "*").rstrip(".") in source or \
            key.replace("...", "") in source, (key, module)


def key_patterns() -> list[re.Pattern[str]]:
    """What keys.py builds, each placeholder open to any value (a shard, a tenant, `TENANT`, `<job id>`)."""
    patterns = []
    for key in built_keys():
        text_ = re.escape(key)
        for holder in ("<n>", "<tenant>", "<job id>", "<server>", "<provider>", "<sha256>", "<key>"):
            text_ = text_.replace(re.escape(holder), r"(?:<[^>]+>|[\w.]+)")
        patterns.append(re.compile(text_))
    return patterns


def test_every_key_the_docs_spell_is_one_keys_py_builds() -> None:
    """Keys in code spans and blocks anywhere in the docs (the table of docs/redis.md has its own test)."""
    patterns = key_patterns()
    spelled = [(doc, key) for doc, key in named(KEY, code_only=True) if key not in OTHER_KEYS]
    assert len(spelled) >= 20
    assert [(doc, key) for doc, key in spelled
            if "*" not in key and not any(p.fullmatch(key.rstrip(".,;")) for p in patterns)] == []


def commands() -> dict[str, argparse.ArgumentParser]:
    """Every ``reckon`` command path ('tenant create', 'status') -> its parser."""
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(prefix: str, node: argparse.ArgumentParser) -> None:
        found[prefix.strip()] = node
        for action in node._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(f"{prefix} {name}", child)

    walk("", parser())
    return found


def test_every_reckon_command_the_docs_name_exists() -> None:
    """Each word after ``reckon`` is a command of the level before it, as long as that level has
    commands (``reckon tenant`` alone names the group; its arguments are not checked)."""
    known = commands()
    wrong = []
    for doc, words in named(COMMAND, code_only=True):
        path = ""
        for word in words.split():
            if not any(isinstance(a, argparse._SubParsersAction) for a in known[path]._actions):
                break
            path = f"{path} {word}".strip()
            if path not in known:
                wrong.append((doc, f"reckon{words}"))
                break
    assert wrong == []


def test_every_variable_the_docs_name_is_read_somewhere() -> None:
    here = Path(__file__).resolve()  # its stale examples are not code
    read = {name for path in CODE if path.is_file() and path != here and path.suffix != ".md"
            for name in VARIABLE.findall(path.read_text(errors="replace"))}
    assert sorted({(doc, name) for doc, name in named(VARIABLE) if name not in read}) == []


def test_every_setting_is_documented() -> None:
    read = set(VARIABLE.findall((ROOT / "pipeline" / "settings.py").read_text()))
    documented = {name for _, name in named(VARIABLE)}
    assert len(read) > 40 and sorted(read - documented) == []


def built_keys() -> set[str]:
    """Every key pattern pipeline/state/keys.py builds, with the placeholders docs/redis.md uses (one
    shard, whatever count a test before this one left set: a tenant's keys are then in `{s0}`)."""
    tenant, job_id, count = "tnt", "tnt.0123456789abcdef0123", keys.shard_count()
    keys.use_shards(1)
    try:
        holders = [ShardKeys(0), TenantKeys(tenant), JobKeys(job_id), ProviderKeys("prv")]
        built = {keys.SWEEPER, keys.HISTORY, keys.FAIRNESS, keys.RUN_TIMES, keys.watcher_lock("srv"),
                 keys.server_offers("srv"),
                 keys.server_slots("srv"), keys.server_waiting("srv"), ShardKeys(0).parked_on("srv"),
                 ShardKeys(0).webhook_exhausted("whk"), ShardKeys(0).webhook_due("whk"),
                 keys.api_key("sha"),
                 keys.tenant_disabled(tenant), keys.tenant_api_keys(tenant), TenantKeys(tenant).idempotency("idk"),
                 TenantKeys(tenant).idempotency_window(424242), TenantKeys(tenant).input_jobs("sha")}
        for holder in holders:
            for name, member in inspect.getmembers(type(holder)):
                if isinstance(member, property) and isinstance(value := getattr(holder, name), str):
                    built.add(value)
    finally:
        keys.use_shards(count)
    return {placeholders(key) for key in built}


def placeholders(key: str) -> str:
    for value, holder in (("{s0}", "{s<n>}"), ("tnt.0123456789abcdef0123", "<job id>"), ("tnt", "<tenant>"),
                          ("srv", "<server>"), ("prv", "<provider>"), ("sha", "<sha256>"), ("idk", "<key>"),
                          ("whk", "<endpoint>"), ("424242", "<window>")):
        key = key.replace(value, holder)
    return key


def test_the_key_table_lists_exactly_the_keys_keys_py_builds() -> None:
    table = {key.replace("{s0}", "{s<n>}") for key in TABLE_KEY.findall(text(KEY_TABLE))}
    built = built_keys()
    assert len(built) > 30
    assert (sorted(table - built), sorted(built - table)) == ([], [])


@pytest.mark.parametrize(("stale", "caught_by"), [
    ("lua/claim-18.lua", "test_every_path_the_docs_name_exists"),
    ("the `claim-18` script", "test_no_doc_names_a_script_by_its_old_key_count"),
    ("`pipeline/store.py`", "test_every_path_the_docs_name_exists"),
    ("`pipeline.store.Store`", "test_every_module_the_docs_name_exists"),
    ("`nothing.lua`", "test_every_lua_script_the_docs_name_exists"),
    ("`reckon tenant frobnicate NAME`", "test_every_reckon_command_the_docs_name_exists"),
    ("RECKON_NO_SUCH_SETTING", "test_every_variable_the_docs_name_is_read_somewhere"),
    ("| `reckon:{s<n>}:t:<tenant>:nothing` | set | x |", "test_the_key_table_lists_exactly_the_keys_keys_py_builds"),
    ("[costs](costs.md#the-ledger-of-old)", "test_every_link_between_the_docs_lands_on_a_file_and_a_heading"),
    ("`.venv/bin/reckon frobnicate`", "test_every_reckon_command_the_docs_name_exists"),
    ("`lua/<verb>-<keys>.lua`", "test_no_doc_names_a_script_by_its_old_key_count"),
    ("`packed.py`", "test_every_file_named_alone_exists_somewhere"),
    ("`python -m ops.soak.nothing`", "test_every_module_the_docs_name_exists"),
    ("`api.app:create_nothing()`", "test_every_module_the_docs_name_exists"),
    ("`client/reckon/client/nothing.py`", "test_every_path_the_docs_name_exists"),
    ("`reckon.client.retry.Nothing`", "test_every_module_the_docs_name_exists"),
    ("`RECKON_SHARD`", "test_every_variable_the_docs_name_is_read_somewhere"),
    ("`redis-cli HGETALL 'reckon:{s0}:t:TENANT:nothing'`", "test_every_key_the_docs_spell_is_one_keys_py_builds"),
])
def test_a_stale_name_fails_its_check(stale: str, caught_by: str, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "docs").mkdir()  # docs/redis.md with the stale name, beside links to the real rest
    for other in [*ROOT.glob("docs/*.md"), ROOT / "ops", ROOT / "README.md", ROOT / "pipeline", ROOT / "lua"]:
        if other != KEY_TABLE:
            (tmp_path / other.relative_to(ROOT)).symlink_to(other)
    doc = tmp_path / "docs" / "redis.md"
    doc.write_text(text(KEY_TABLE).replace("## redis-cli", f"{stale}\n\n## redis-cli"))
    here = sys.modules[__name__]
    monkeypatch.setattr(here, "DOCS", [doc])
    monkeypatch.setattr(here, "KEY_TABLE", doc)
    failed = []
    for check in CHECKS:
        try:
            check()
        except AssertionError:
            failed.append(check.__name__)
    assert caught_by in failed


CHECKS = [test_every_path_the_docs_name_exists, test_every_module_the_docs_name_exists,
          test_every_lua_script_the_docs_name_exists, test_no_doc_names_a_script_by_its_old_key_count,
          test_every_reckon_command_the_docs_name_exists, test_every_variable_the_docs_name_is_read_somewhere,
          test_the_key_table_lists_exactly_the_keys_keys_py_builds,
          test_every_link_between_the_docs_lands_on_a_file_and_a_heading, test_every_file_named_alone_exists_somewhere,
          test_every_key_the_docs_spell_is_one_keys_py_builds]
