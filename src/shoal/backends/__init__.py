"""The backends, one package each, holding its code, its SQL or Lua, and its migrations:

- ``memory``: one process; the reference semantics every other backend is tested against;
- ``sqlite``: several processes on one machine;
- ``postgres``: the production store across machines;
- ``redis``: coordination and rate limits only, with Redlock over several servers.

A backend implements the protocols of :mod:`shoal.ports` and depends on them, on
:mod:`shoal.types` and on the helpers beside it here (``_sql``, ``_watches``, ``_urls``), never on
another backend or on the engine. ``shoal.stores.open_store`` picks one from a URL.
"""
