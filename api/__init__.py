"""reckon's HTTP API (Falcon, WSGI): an app factory (``app``) that wires routes, middleware and
error handlers; thin resources (``resources``, ``sse``, ``ui``); authentication, request bodies,
problem details, metrics and the OpenAPI document. It sits on top of ``pipeline`` and may import
any of its rooms; nothing in ``pipeline`` imports it.
"""
