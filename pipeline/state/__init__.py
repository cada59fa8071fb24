"""reckon's Redis state: every key name (``keys``), the clients (``redisconn``), the Lua scripts as
typed calls (``scripts``, ``store``), plain reads (``reads``, ``views``, ``archive``, ``progress``),
jobs as clients see them (``jobs``, ``submit``), tenants and admission settings, what each server
can run (``offers``), the operators' figures (``status``, ``history``, ``fairness``) and one job as
an operator sees it (``lookup``), money after the fact (``bookings``: adjustments; ``booked`` and
``records``: what was booked, the usage records), and the migration of older layouts (``migrate``).

Imports only the ground (``pipeline.settings``, ``errors``, ``fleet``, ``claims``, ``needs``, ``faultpoints``):
what changes state here is one script, and nothing here runs a provider or a process.
"""
