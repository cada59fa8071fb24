"""Webhooks: signed, at-least-once delivery of job events to a tenant's endpoints (docs/webhooks.md).

``signing`` (Standard Webhooks), ``endpoints`` (what a tenant registers), ``guard`` (the one HTTP request,
refused toward private addresses), ``deliveries`` (the Redis side: fan-out, take, outcome, redeliver) and
``sender`` (the ``webhooks`` process). They import ``pipeline.state`` and the ground modules, never the API
or the workers; nothing imports ``sender``.
"""
