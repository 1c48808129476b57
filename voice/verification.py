"""The limits on proving who the caller is, kept across calls (``call_verification_attempts``).

* **Wrong PINs** (keypad or spoken) are recorded one by one, with the account and the calling
  number. Once the last hour holds ``pin_per_source`` of them from one number, or
  ``pin_per_account`` for one account, the PIN path is locked: every PIN is refused unchecked
  until enough of them are older than the hour (a sliding window). Refused PINs are not counted,
  so the lock lapses on its own. The lock is recorded once (a ``pin-locked`` row and a security
  event) and the owner is told.
* **The one-time code** path stays open while the PIN is locked: the code goes only to the
  account's verified number, so a caller who merely spoofs that number never reads it, and the
  real owner keeps a way in. Sends are capped per call and per account per hour.

Every count is kept apart for **attested** calls (the originating carrier vouched that the caller
may use the number: SHAKEN/STIR attestation A, Twilio's ``StirVerstat`` of
``TN-Validation-Passed-A``) and the others. Spoofing a number does not get attestation A, so a
spoofer's failures and code requests lock and use up only the unattested side; the owner calling
from their own phone (in the US, where carriers sign calls) keeps the PIN and the codes. Where no
carrier signs calls, every call is unattested and shares one count.

What was tried is never stored, only that a try failed. The per-call side (one check at a time,
nothing checked once the call is closing) lives in ``voice.owner_profile``.
"""

from __future__ import annotations

from uuid import UUID

from core.records import call_verification as attempts
from core.security import record_security_event
from core.store import Database
from core.store.queries import Queries

WRONG_PIN = "pin-wrong"
WRONG_CODE = "code-wrong"
CODE_SENT = "code-sent"
PIN_LOCKED = "pin-locked"


async def pin_locked(
    db: Queries,
    account_id: UUID,
    source: str | None,
    *,
    attested: bool,
    per_source: int,
    per_account: int,
    window: float,
) -> bool:
    """Whether the PIN path is locked for this account or this calling number right now (wrong
    PINs within the last ``window`` seconds)."""
    for_account, from_source = await attempts.wrong_pins(db, account_id, source, attested=attested, window=window)
    return for_account >= per_account or from_source >= per_source


async def record_wrong(
    db: Database,
    account_id: UUID,
    source: str | None,
    call_sid: str,
    kind: str,
    *,
    attested: bool,
    per_source: int,
    per_account: int,
    window: float,
) -> bool:
    """Record one wrong answer. True when it is the one that locked the PIN path (the first lock
    within the window): the lock is recorded then, with a security event, and the caller of this
    function tells the owner. Calls on other processes wait for each other on the account's row."""
    async with db.transaction() as conn:
        await attempts.lock_account(conn, account_id)
        await attempts.record_attempt(conn, account_id, source, call_sid, kind, attested=attested)
        if kind != WRONG_PIN:
            return False
        if not await pin_locked(
            conn, account_id, source, attested=attested, per_source=per_source, per_account=per_account, window=window
        ):
            return False
        if await attempts.locked_within(conn, account_id, attested=attested, window=window):
            return False
        await attempts.record_attempt(conn, account_id, source, call_sid, PIN_LOCKED, attested=attested)
    await record_security_event(
        db, "call-pin-locked", call_sid=call_sid, account_id=str(account_id), attested=str(attested).lower()
    )
    return True


async def claim_code_send(
    db: Database, account_id: UUID, source: str | None, call_sid: str, *, attested: bool, per_hour: int
) -> int | None:
    """Claim one code send for this account within its hourly cap: the claim's id (give it back
    with :func:`release_code_send` if the text could not be sent), or None when the cap is reached."""
    async with db.transaction() as conn:
        await attempts.lock_account(conn, account_id)
        if await attempts.codes_sent_this_hour(conn, account_id, attested=attested) >= per_hour:
            return None
        return await attempts.record_attempt(conn, account_id, source, call_sid, CODE_SENT, attested=attested)


async def release_code_send(db: Queries, claim: int) -> None:
    await attempts.forget_code_send(db, claim)
