"""What code that only runs SQL needs of the store: a ``Database``, an asyncpg pool or connection."""

from __future__ import annotations

from typing import Any, Protocol


class Queries(Protocol):
    """Runs SQL. ``core.store.Database`` is one, and so are asyncpg's ``Pool`` and ``Connection``
    (a transaction is taken on a connection); rows come back as asyncpg records."""

    async def execute(self, query: str, *args: Any) -> str: ...

    async def fetch(self, query: str, *args: Any) -> list[Any]: ...

    async def fetchrow(self, query: str, *args: Any) -> Any: ...

    async def fetchval(self, query: str, *args: Any) -> Any: ...
