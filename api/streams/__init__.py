"""The streams process: reckon's event streams (Server-Sent Events) on Falcon's ASGI app under gunicorn's
uvicorn workers, so an open stream costs a coroutine and a few kB, not a thread. An app factory
(``app``), the two stream resources (``resources``), the shard readers that wake them (``hub``), the
API's authentication awaited and kept up while streams are open (``auth``), ``POST /v1/jobs`` and
``GET /v1/jobs/{id}`` held for ``Prefer: wait`` on the same rooms (``waits``: the web process's admission and
problems, ``api.app``) and the gunicorn worker class (``worker``). It shares the web
process's problem details and resume rules (``api``) and reads the state through ``pipeline.state``;
nothing else imports it. See docs/api.md "Event streams".
"""
