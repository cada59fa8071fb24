"""reckon's domain, one package per concern (docs/design.md, "Layout"; ``ops/dev/imports.py`` checks it).

The modules here are the ground every room reads:
``settings`` (the one reader of the environment), ``errors`` (one exception tree), ``logs``,
``faultpoints`` (where crash tests stop a process), ``fleet`` (the configured servers, their caps
and prices), ``claims`` (what a claim hands a worker), ``needs`` (what a workflow needs of a
server, what a server offers), ``mediatypes`` (a file's content type from its bytes), ``inputs``
(an uploaded input's name, the inputs a workflow names) and ``templates`` (a saved workflow's parameters
and the graph a request's values build). They import nothing of reckon's but each
other (``settings`` parses ``fleet``'s servers; ``errors`` names ``claims.Claim``). Above them,
lowest first:

- ``state``: reckon's Redis state (key names, the Lua scripts' wrappers, reads, figures); imports the ground.
- ``blobs``: durable output storage; imports the ground.
- ``providers``: what reckon needs from a provider, the ComfyUI adapter, a simulated ComfyUI; imports the ground.
- ``work``: the processes that move jobs (worker and actors, watcher, sweeper, broker); imports all of the above.
- ``operate``: the ``reckon`` command line; imports all of the above.

The API (``api/``) sits on top and may import any of them.
"""
