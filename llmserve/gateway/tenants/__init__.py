"""Tenants: per-key rate limits, concurrency caps and spend budgets, shared by gateway replicas.

``config`` (the schema), ``decision`` (pure: what to reserve, what a reply means),
``store`` (the counters' contract and its in-memory backend), ``redis_store`` (the same
contract as Lua scripts), ``limiter`` (the request path's entry: admit, charge, settle,
degrade to a local share), ``admin`` (``GET /admin/keys/{id}/usage``). See docs/keys.md.
"""
