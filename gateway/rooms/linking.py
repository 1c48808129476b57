"""Linking a person's Matrix ID to their account, like any other handle.

``pepper rooms link ACCOUNT @name:server`` records the Matrix ID as an unverified handle and sends
a six-digit code to it in a direct message from Pepper's Matrix user; ``pepper rooms verify ACCOUNT
@name:server CODE`` (the person reads it in their Matrix client and gives it back on the other
side) verifies the handle. Only a verified Matrix ID makes its sender a room member: until then
their messages are a non-member's. The code is kept as an argon2 hash, expires after
:data:`CODE_TTL` and allows :data:`MAX_ATTEMPTS` tries.
"""

from __future__ import annotations

import secrets
from datetime import UTC, datetime, timedelta
from uuid import UUID

from core import identity
from core.adapters.matrix import MatrixClient
from core.errors import InvalidInput
from core.records import rooms
from core.store.queries import Queries

CODE_TTL = timedelta(minutes=15)
MAX_ATTEMPTS = 5


async def send_link_code(db: Queries, client: MatrixClient, account_id: UUID, matrix_id: str) -> bool:
    """Send a code to ``matrix_id`` for ``account_id``; False when it is already theirs and verified."""
    handle = await identity.find_handle(db, "matrix", matrix_id)
    if handle is not None and handle.account_id != account_id:
        raise InvalidInput("that Matrix ID already belongs to another account")
    if handle is None:
        handle = await identity.add_handle(db, account_id, "matrix", matrix_id)
    if handle.verified:
        return False
    code = f"{secrets.randbelow(10**6):06d}"
    dm = await client.create_room("", [handle.value], direct=True)
    await client.send_text(
        dm, f"Your code to link this Matrix account to Pepper is {code}. It expires in 15 minutes. If you did not"
        " ask for it, ignore this message.", f"pepper.link.{handle.id}.{secrets.token_hex(6)}",
    )  # fmt: skip
    expires = datetime.now(UTC) + CODE_TTL
    await rooms.set_link_code(db, handle.id, await identity.argon2_hash(code), dm, expires)
    return True


async def verify_link_code(db: Queries, account_id: UUID, matrix_id: str, code: str) -> None:
    """Verify the handle with the code it was sent; ``InvalidInput`` when the code is wrong or spent."""
    handle = await identity.find_handle(db, "matrix", matrix_id)
    if handle is None or handle.account_id != account_id:
        raise InvalidInput("no link is pending for that Matrix ID on this account; run pepper rooms link first")
    if handle.verified:
        return
    row = await rooms.link_code(db, handle.id)
    if row is None:
        raise InvalidInput("no code is pending for that Matrix ID; run pepper rooms link again")
    if row["attempts"] > MAX_ATTEMPTS or row["expires_at"] < datetime.now(UTC):
        await rooms.drop_link_code(db, handle.id)
        raise InvalidInput("that code has expired or had too many tries; run pepper rooms link again")
    if not await identity.argon2_verify(row["code_hash"], code.strip()):
        raise InvalidInput("that code is not the one Pepper sent")
    await identity.set_handle_verified(db, "matrix", handle.value)
    await rooms.drop_link_code(db, handle.id)
