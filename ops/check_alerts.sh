#!/usr/bin/env bash
# Check ops/alerts.yml: promtool's syntax check, the unit tests in ops/alerts_test.yml, and what
# promtool cannot see: every alert has a severity, an owner role, a summary and a runbook whose
# anchor is a heading of ops/RUNBOOK.md, and a test where it fires and one where it must not.
# `make test` runs it; a missing promtool is a failure, never a skip (.ci/run installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v promtool >/dev/null; then
  echo "check_alerts: FAILED: promtool not found (Debian: apt-get install --no-install-recommends prometheus;" \
       ".ci/run installs it without starting the service)" >&2
  exit 1
fi
PYTHON=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

promtool check rules ops/alerts.yml
promtool test rules ops/alerts_test.yml

"$PYTHON" - ops/alerts.yml ops/alerts_test.yml ops/RUNBOOK.md <<'EOF'
"""Owners, runbook anchors and test coverage of every alert."""
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit(f"check_alerts: FAILED: {sys.executable} has no PyYAML (make test installs it with the test extras)")

rules_path, tests_path, runbook_path = sys.argv[1:]
PREFIX = "ops/RUNBOOK.md#"
ROLE = re.compile(r"[a-z][a-z0-9-]*")


def github_anchor(heading: str, seen: dict[str, int]) -> str:
    """GitHub's heading id: lower case, punctuation dropped, spaces to hyphens; repeats get -1, -2..."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
    count = seen.get(slug, 0)
    seen[slug] = count + 1
    return slug if count == 0 else f"{slug}-{count}"


seen: dict[str, int] = {}
anchors = set()
fenced = False
for line in open(runbook_path, encoding="utf-8"):
    if line.startswith("```"):
        fenced = not fenced
    elif not fenced and (match := re.match(r"#{1,6} (.+)", line)):
        anchors.add(github_anchor(match.group(1), seen))

problems = []
alerts = []
for group in yaml.safe_load(open(rules_path, encoding="utf-8"))["groups"]:
    for rule in group["rules"]:
        if "alert" not in rule:
            continue
        name, labels, notes = rule["alert"], rule.get("labels") or {}, rule.get("annotations") or {}
        alerts.append(name)
        if not ROLE.fullmatch(str(labels.get("owner", ""))):
            problems.append(f"{name}: no owner label naming a role (e.g. owner: reckon-oncall)")
        if labels.get("severity") not in ("page", "ticket", "info"):
            problems.append(f"{name}: severity must be page, ticket or info, not {labels.get('severity')!r}")
        if not notes.get("summary"):
            problems.append(f"{name}: no summary annotation")
        runbook = str(notes.get("runbook", ""))
        if not runbook.startswith(PREFIX):
            problems.append(f"{name}: runbook {runbook!r} is not {PREFIX}<anchor>")
        elif runbook[len(PREFIX):] not in anchors:
            problems.append(f"{name}: runbook anchor #{runbook[len(PREFIX):]} is no heading of {runbook_path}")

fires, silent = set(), set()
for test in yaml.safe_load(open(tests_path, encoding="utf-8"))["tests"]:
    for case in test.get("alert_rule_test") or []:
        (fires if case.get("exp_alerts") else silent).add(case["alertname"])
for name in sorted(set(alerts)):
    if name not in fires:
        problems.append(f"{name}: no test in {tests_path} where it fires")
    if name not in silent:
        problems.append(f"{name}: no test in {tests_path} where it must not fire")

if problems:
    print("check_alerts: FAILED:", *problems, sep="\n  ", file=sys.stderr)
    sys.exit(1)
print(f"check_alerts: {len(alerts)} alerts, each with severity, owner, summary, a runbook heading, "
      f"and tests that fire and stay silent")
EOF
