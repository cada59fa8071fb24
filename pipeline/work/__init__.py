"""The processes that move jobs: the Dramatiq worker (``worker``, ``actors``) running attempts
(``executor``) under fenced leases (``leases``), the failure router (``routing``), the broker
(``broker``, ``waking``), the watcher that follows prompts at their servers (and, in its process, runs
the jobs called to the slots they free, ``dispatch``, and collects the prompts that end, ``collecting``),
and the sweeper.

Imports the ground, ``pipeline.state``, ``pipeline.blobs`` and ``pipeline.providers``; nothing
below imports this package.
"""
