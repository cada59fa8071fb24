"""reckon's HTTP API (Falcon, WSGI): an app factory (``app``) that wires routes, middleware and
error handlers; thin resources (``resources``, ``sse``); the operators' pages (``operator``: their
token and headers; ``ui``: the status page; ``jobpage``: the job page); authentication, request
bodies, problem details, metrics and the OpenAPI document. It sits on top of ``pipeline`` and may
import any of its rooms; nothing in ``pipeline`` imports it.
"""
