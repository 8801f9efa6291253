"""The store: what must survive a restart, in SQLite (aiosqlite) or PostgreSQL (asyncpg).

One module per aggregate (keys.py, ...); migrations.py holds the schema.
"""

from llmgw.store.db import Store, open_store

__all__ = ["Store", "open_store"]
