"""Readers of a job that is packed meanwhile: one that read a job's record before its outputs, in one
pipeline that is not a transaction, could see the job between the two: the record from before the step
that ended it (no archive yet), the outputs hash from after it (packed and deleted). Readers read the
outputs first (the review of the change found it; these tests failed before).

A pipeline (``transaction=False``) is one round trip, not one atomic step: Redis runs another client's
commands between two of its commands whenever its bytes arrive in more than one read (a listing of
200 jobs, ``GET /v1/jobs?limit=200``, sends about 100 kB; Redis reads a client's socket 16 kB at a time).
``Split`` makes that gap deterministic: its pipeline reaches Redis in two parts, with another client's
step run in between.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from pipeline.state import views
from pipeline.state.store import Store
from pipeline.state.tenants import create_tenant
from tests.lua.test_scripts import NOW, admit, claim


class Split:
    """A client whose non-transactional pipelines reach Redis as two parts, the first ``first``
    commands and the rest, with ``between`` (another client's step) run in the gap."""

    def __init__(self, client: Any, first: int, between: Callable[[], Any]) -> None:
        self.client, self.first, self.between = client, first, between

    def pipeline(self, transaction: bool = True) -> _SplitPipeline:
        assert not transaction  # a MULTI is one step: nothing runs inside it
        return _SplitPipeline(self)


class _SplitPipeline:
    def __init__(self, split: Split) -> None:
        self.split, self.calls = split, []

    def __getattr__(self, name: str) -> Callable[..., _SplitPipeline]:
        def queue(*args: Any, **kwargs: Any) -> _SplitPipeline:
            self.calls.append((name, args, kwargs))
            return self
        return queue

    def execute(self) -> list[Any]:
        replies = []
        parts = (self.calls[:self.split.first], self.calls[self.split.first:])
        for n, part in enumerate(parts):
            pipe = self.split.client.pipeline(transaction=False)
            for name, args, kwargs in part:
                getattr(pipe, name)(*args, **kwargs)
            replies += pipe.execute()
            if n == 0:
                self.split.between()
        return replies


@pytest.fixture
def acme(store: Store) -> Store:
    create_tenant(store.redis, "acme", 100)
    return store


def _running_with_two_outputs(acme: Store) -> tuple[str, Any]:
    """A running job with both of its outputs stored and charged: the next step finishes it."""
    job_id = admit(acme, outputs=2).job_id
    held = claim(acme)
    for index in (0, 1):
        acme.store_output(held, index, {"sha256": str(index) * 64, "bytes": 1, "content_type": "image/png"},
                          now_ms=NOW + 1)
    acme.charge(held, 20)
    return job_id, held


def test_a_listing_shows_the_outputs_of_a_job_that_completes_while_it_is_read(acme: Store) -> None:
    """``GET /v1/jobs`` (pipeline/state/views.py ``jobs_with_outputs``) reads each job's view fields, then its
    outputs hash. The job completes in between: the listing shows it `running` with no outputs at all,
    though both of its outputs were stored before the listing began (and are in its archive after)."""
    job_id, held = _running_with_two_outputs(acme)
    assert [len(outputs) for _, outputs in views.jobs_with_outputs(acme.redis, [job_id])] == [2]

    finish = lambda: acme.finish(held, "completed", now_ms=NOW + 5)  # noqa: E731 (another client's step)
    [(record, outputs)] = views.jobs_with_outputs(Split(acme.redis, 1, finish), [job_id])
    assert acme.job(job_id)["state"] == "completed"
    assert sorted(outputs) == [0, 1], f"listed {record['state']} with outputs {outputs}"


def test_the_store_s_jobs_with_outputs_sees_no_half_finished_job(acme: Store) -> None:
    """The same order in ``Reads.jobs_with_outputs`` (the CLI's ``reckon jobs`` reads it):
    the record's HGETALL, then the outputs hash."""
    job_id, held = _running_with_two_outputs(acme)

    reader = Store(Split(acme.redis, 1, lambda: acme.finish(held, "completed", now_ms=NOW + 5)),
                   scripts=acme.scripts)
    [(record, outputs)] = reader.jobs_with_outputs([job_id])
    assert sorted(outputs) == [0, 1], f"read {record['state']} with outputs {outputs}"
