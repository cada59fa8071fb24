"""Every process opens its Redis connections before it serves, so a load opens none (issue 30, section 5).

A connection Redis accepts costs it a client struct and buffers (a 16 KB reply buffer at first, about
1.8 kB once idle): opened under load, they were charged to the jobs of that load (the deployed stack
went from 22 to 40 connections over 300 jobs, ops/bench/deployed.py)."""

from __future__ import annotations

import threading
from collections import Counter

from pipeline.state.keys import TenantKeys
from pipeline.state.tenants import create_key, create_tenant
from tests.conftest import wait_until

#: The stack's processes (their connections' names, pipeline/state/redisconn.py) and what each opens
#: at start: the API's 2 gunicorn workers x 4 threads, to the state and the broker; the worker's one
#: process x 2 threads (tests/faults/conftest.py) and its lease keeper's 2 threads to the state; one sweeper
#: thread; the watcher's one thread per server (one here).
OPENED_AT_START = {"web": 8, "broker-web": 8, "worker": 4, "sweeper": 1, "broker-sweeper": 1, "watcher": 1,
                   "broker-watcher": 1}


def connections(redis_client) -> Counter:
    return Counter(c["name"] for c in redis_client.client_list() if c["name"])


def test_a_load_opens_no_connection(stack, redis_client) -> None:
    create_tenant(redis_client, "acme", 10**6)
    auth = {"Authorization": f"Bearer {create_key(redis_client, 'acme')}"}
    stack.start_provider(delay=0)
    stack.start_web()
    stack.start_worker()
    stack.start_sweeper()
    wait_until(lambda: all(connections(redis_client)[name] >= n for name, n in OPENED_AT_START.items()),
               timeout=30)
    before = connections(redis_client)
    # at least what each opens at start: a thread of the process that needs a connection while
    # open_pools holds the pool's (the executor's first reads, say) opens one more, before any load
    assert all(before[name] >= n for name, n in OPENED_AT_START.items()), before

    body = {"kind": "image", "workflow": {"3": {"class_type": "KSampler", "inputs": {"seed": 5}}}, "outputs": 1}
    statuses: list[int] = []

    def post(first: int) -> None:
        for n in range(first, 24, 8):
            statuses.append(stack.api("POST", "/v1/jobs", body, **auth, **{"Idempotency-Key": f"k-{n}"})[0])

    threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [202] * 24
    wait_until(lambda: int(redis_client.hget(TenantKeys("acme").counts, "completed") or 0) == 24, timeout=60)
    after = connections(redis_client)
    assert after == before
