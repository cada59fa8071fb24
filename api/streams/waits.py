"""``POST /v1/jobs`` and ``GET /v1/jobs/{id}`` on the streams process, held for ``Prefer: wait``.

Admission is the web process's: the same ``Admitter`` and the same problem for each refusal
(``api.app.refusal``), run in a thread since it is synchronous. A held request joins its job's room in
the hub (api/streams/hub.py) and costs no Redis command of its own while it waits: its shard's reader
wakes the room when the job changes, and one read of the job then serves every request held on it.
Held requests take slots of the process's streams (``RECKON_STREAMS_MAX_STREAMS``); past that a request
is answered at once without ``Preference-Applied``. See docs/api.md "Waiting for the result".
"""

from __future__ import annotations

import asyncio
from typing import Any

from falcon.asgi import Request, Response

from api.app import refusal
from api.body import check_media_type, decode_json, too_large
from api.prefer import applied, wait_seconds
from api.problems import Problem
from api.resources import answer_submitted, check_idempotency_key, current_view
from api.streams.hub import Hub
from api.streams.resources import Slots
from api.waiting import answer_after_wait
from pipeline.state.ids import tenant_of
from pipeline.state.keys import shard_of
from pipeline.state.progress import TERMINAL
from pipeline.state.store import Store
from pipeline.state.submit import Admitter, Submitted


class Holds:
    """Requests of this process held until their job ends, woken by the hub; at most what ``slots`` allow."""

    def __init__(self, hub: Hub, slots: Slots, store: Store) -> None:
        self.hub, self.slots, self.store = hub, slots, store

    async def view(self, tenant: str, job_id: str) -> dict[str, Any]:
        return await asyncio.to_thread(current_view, self.store, tenant, job_id)

    async def hold(self, req: Request, resp: Response, job_id: str, state: str | None) -> bool:
        """Hold the request as its ``Prefer`` asks (``state``: the job's when read, None if not); whether
        a wait was asked and honoured (then ``Preference-Applied`` is set)."""
        seconds = wait_seconds(req.get_header("Prefer"))
        if seconds is None:
            return False
        if state not in TERMINAL and seconds > 0:
            try:
                give_back = self.slots.take()
            except Problem:  # every slot taken: answered at once, the preference ignored
                return False
            try:
                await self._until_ended(job_id, seconds)
            finally:
                give_back()
        resp.set_header("Preference-Applied", applied(seconds))
        return True

    async def _until_ended(self, job_id: str, seconds: float) -> None:
        room = await self.hub.join(self.hub.jobs, job_id, shard_of(tenant_of(job_id)))
        try:
            loop = asyncio.get_running_loop()
            until = loop.time() + seconds
            seen = room.version
            state, _ = await self.hub.snapshot(room, seen, job_id)
            while state is not None and state not in TERMINAL:
                left = until - loop.time()
                if left <= 0 or not await room.wait(seen, left):
                    return
                seen = room.version
                state, _ = await self.hub.snapshot(room, seen, job_id)
        finally:
            self.hub.leave(self.hub.jobs, job_id)


class Jobs:
    """``POST /v1/jobs``: the web process's admission, then held for ``Prefer: wait``."""

    def __init__(self, admitter: Admitter, holds: Holds) -> None:
        self.admitter, self.holds = admitter, holds

    async def on_post(self, req: Request, resp: Response) -> None:
        key = check_idempotency_key(req.get_header("Idempotency-Key"))
        check_media_type(req.content_type)
        limit = self.admitter.settings.max_body_bytes
        if (req.content_length or 0) > limit:
            raise too_large(limit)
        data = await req.stream.read(limit + 1)
        if len(data) > limit:
            raise too_large(limit)
        submitted = await self._admit(req.context.tenant, key, decode_json(data))
        answer_submitted(resp, submitted)
        if await self.holds.hold(req, resp, submitted.job_id, None):
            answer_after_wait(resp, await self.holds.view(req.context.tenant, submitted.job_id), resp.status)

    async def _admit(self, tenant: str, key: str, body: Any) -> Submitted:
        try:
            return await asyncio.to_thread(self.admitter.submit, tenant, key, body)
        except Exception as exc:
            problem = refusal(exc)
            if problem is None:
                raise
            raise problem from None


class Job:
    """``GET /v1/jobs/{job_id}``: the job's view, held for ``Prefer: wait``."""

    def __init__(self, holds: Holds) -> None:
        self.holds = holds

    async def on_get(self, req: Request, resp: Response, job_id: str) -> None:
        resp.vary = ["Prefer"]
        view = await self.holds.view(req.context.tenant, job_id)
        if await self.holds.hold(req, resp, job_id, view["state"]):
            view = await self.holds.view(req.context.tenant, job_id)
        resp.media = view
