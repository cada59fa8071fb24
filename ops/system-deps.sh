#!/usr/bin/env bash
# Debian packages reckon needs, installed when missing (make run: redis-server; make bench: redis-server
# and wrk; make test: the rest):
#   redis-server  Redis 7, state and broker
#   faketime      a worker whose clock is off, in the fault tests
#   chromium      the status page's browser test (tests/api/test_ui.py)
#   promtool      from the prometheus package: ops/check_alerts.sh checks and unit-tests the alert rules
#   wrk           make bench only: the HTTP load generator of ops/bench/bench.py (its own processes, not the server's)
#   rabbitmq-server  the broker seam's test runs reckon on Dramatiq's RabbitMQ broker (a private node on
#                 loopback, ops/bench/rabbitmq.py; it starts in about 6 s); its start script is not on a user's PATH,
#                 and the policy-rc.d below also stops its postinst starting a node on 0.0.0.0:5672
# The prometheus package's postinst would start a Prometheus on 0.0.0.0:9090: a policy-rc.d that exits
# 101 forbids any service start during the install (ours is removed after; one already there stays).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
if [ "$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi
want=${1:-test}
declare -A package=([redis-server]=redis-server [faketime]=faketime [chromium]=chromium [promtool]=prometheus
                    [wrk]=wrk)
commands=(redis-server)
if [ "$want" = test ]; then commands+=(faketime chromium promtool); fi
if [ "$want" = bench ]; then commands+=(wrk); fi
missing=()
for cmd in "${commands[@]}"; do command -v "$cmd" >/dev/null || missing+=("${package[$cmd]}"); done
if [ "$want" = test ] && [ ! -x /usr/lib/rabbitmq/bin/rabbitmq-server ]; then missing+=(rabbitmq-server); fi
[ ${#missing[@]} -eq 0 ] && exit 0
policy=/usr/sbin/policy-rc.d
ours=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' | $SUDO tee "$policy" >/dev/null && $SUDO chmod 755 "$policy" && ours=1
fi
$SUDO apt-get update -qq
for pkg in "${missing[@]}"; do
  # prometheus recommends node-exporter, another service (on :9100): promtool needs neither
  if [ "$pkg" = prometheus ]; then flags=--no-install-recommends; else flags=; fi
  $SUDO apt-get install -y -qq $flags "$pkg" >/dev/null
done
if [ -n "$ours" ]; then $SUDO rm -f "$policy"; fi
# nothing may listen on 9090 (0x2382) now; a Prometheus the package started anyway is stopped by pid
if awk '$4 == "0A" && $2 ~ /:2382$/ {n++} END {exit !n}' /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
  echo "something listens on :9090 after installing prometheus; stopping /usr/bin/prometheus" >&2
  for exe in /proc/[0-9]*/exe; do
    if [ "$(readlink "$exe" 2>/dev/null)" = /usr/bin/prometheus ]; then pid=${exe#/proc/}; $SUDO kill "${pid%/exe}"; fi
  done
fi
