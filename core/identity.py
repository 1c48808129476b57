"""Accounts and the handles that point to them.

A person's account is the identity. Phone numbers, email addresses and web logins are handles:
each points to one account, carries its own verified flag and, per channel, the person's consent
(an SMS STOP blocks SMS, WhatsApp and calls for that number). The Twilio numbers Pepper answers
are lines, each tied to the account it serves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg
import phonenumbers
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from core.errors import InvalidInput, NotFound
from core.settings import VOICE_ENGINES

HandleKind = Literal["phone", "email", "web"]
Channel = Literal["sms", "whatsapp", "voice", "email"]
LineKind = Literal["personal", "answering"]

HANDLE_KINDS: tuple[str, ...] = ("phone", "email", "web")
CONSENT_CHANNELS: tuple[str, ...] = ("sms", "whatsapp", "voice", "email")
LINE_KINDS: tuple[str, ...] = ("personal", "answering")
# A STOP on a phone number blocks every channel that reaches that number.
PHONE_CHANNELS: tuple[str, ...] = ("sms", "whatsapp", "voice")

PIN_PATTERN = re.compile(r"^\d{4,12}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_WEB_LOGIN = re.compile(r"^[a-z0-9][a-z0-9._-]{1,63}$")

# argon2id with the library's defaults (RFC 9106 low-memory profile).
_hasher = PasswordHasher()
# Argon2 takes about 100 ms of CPU per check. It runs here, off the event loop (which relays calls
# and answers webhooks), on at most this many threads at once; more checks wait their turn.
ARGON2_THREADS = 2
_argon2_pool = concurrent.futures.ThreadPoolExecutor(max_workers=ARGON2_THREADS, thread_name_prefix="pepper-argon2")


async def argon2_verify(stored: str, secret: str) -> bool:
    """Whether ``secret`` matches the argon2 hash ``stored``, computed on the bounded argon2 threads."""

    def check() -> bool:
        try:
            return _hasher.verify(stored, secret)
        except (VerificationError, InvalidHashError):
            return False

    return await asyncio.get_running_loop().run_in_executor(_argon2_pool, check)


async def argon2_hash(secret: str) -> str:
    """An argon2id hash of ``secret``, computed on the bounded argon2 threads."""
    return await asyncio.get_running_loop().run_in_executor(_argon2_pool, _hasher.hash, secret)


Executor = asyncpg.Connection | asyncpg.Pool | Any  # anything with fetchrow/fetch/execute


@dataclass(frozen=True)
class Account:
    id: UUID
    name: str
    timezone: str
    has_pin: bool
    created_at: datetime


@dataclass(frozen=True)
class Handle:
    id: UUID
    account_id: UUID
    kind: str
    value: str
    verified: bool


@dataclass(frozen=True)
class PhoneLine:
    number: str
    kind: str
    account_id: UUID
    label: str | None
    voice_engine: str | None = None  # None: the voice_engine setting


# Every webhook normalizes its sender, and the same few numbers write again and again: parsing
# and validating one costs more CPU than the database lookup that follows. A pure function of its
# arguments, so a bounded cache is safe (a number that does not parse raises and is not cached).
@functools.lru_cache(maxsize=4096)
def normalize_phone(raw: str, default_region: str = "US") -> str:
    """E.164 for a number as people write it; a ``whatsapp:`` prefix is ignored."""
    text = raw.strip().removeprefix("whatsapp:")
    try:
        number = phonenumbers.parse(text, default_region)
    except phonenumbers.NumberParseException as exc:
        raise InvalidInput(f"not a phone number: {exc}") from exc
    if not phonenumbers.is_valid_number(number):
        raise InvalidInput("not a valid phone number")
    return phonenumbers.format_number(number, phonenumbers.PhoneNumberFormat.E164)


def normalize_email(raw: str) -> str:
    value = raw.strip().lower()
    if not _EMAIL.match(value):
        raise InvalidInput("not an email address")
    return value


def normalize_handle(kind: str, raw: str, default_region: str = "US") -> str:
    if kind == "phone":
        return normalize_phone(raw, default_region)
    if kind == "email":
        return normalize_email(raw)
    if kind == "web":
        value = raw.strip().lower()
        if not _WEB_LOGIN.match(value):
            raise InvalidInput("a web login is 2-64 letters, digits, '.', '_' or '-'")
        return value
    raise InvalidInput(f"unknown handle kind {kind!r}; use one of {', '.join(HANDLE_KINDS)}")


def _account(row: asyncpg.Record) -> Account:
    return Account(row["id"], row["name"], row["timezone"], row["pin_hash"] is not None, row["created_at"])


def _handle(row: asyncpg.Record) -> Handle:
    return Handle(row["id"], row["account_id"], row["kind"], row["value"], row["verified_at"] is not None)


async def create_account(db: Executor, name: str, *, timezone: str = "UTC") -> Account:
    if not name.strip():
        raise InvalidInput("an account needs a name")
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidInput(f"unknown time zone {timezone!r}") from exc
    row = await db.fetchrow(
        """
        WITH account AS (
            INSERT INTO accounts (name, timezone) VALUES ($1, $2) RETURNING *
        ), conversation AS (
            INSERT INTO conversations (account_id) SELECT id FROM account
        )
        SELECT * FROM account
        """,
        name.strip(),
        timezone,
    )
    return _account(row)


async def get_account(db: Executor, ref: UUID | str) -> Account:
    """An account by id, or by exact name when the name is unique."""
    row = None
    try:
        row = await db.fetchrow("SELECT * FROM accounts WHERE id = $1", UUID(str(ref)))
    except ValueError:
        rows = await db.fetch("SELECT * FROM accounts WHERE name = $1", str(ref))
        if len(rows) > 1:
            raise InvalidInput(f"{len(rows)} accounts are named {ref!r}; use the account id") from None
        row = rows[0] if rows else None
    if row is None:
        raise NotFound(f"no account {ref}")
    return _account(row)


async def list_accounts(db: Executor) -> list[Account]:
    return [_account(r) for r in await db.fetch("SELECT * FROM accounts ORDER BY created_at")]


async def add_handle(
    db: Executor,
    account_id: UUID,
    kind: str,
    raw_value: str,
    *,
    verified: bool = False,
    default_region: str = "US",
) -> Handle:
    value = normalize_handle(kind, raw_value, default_region)
    try:
        row = await db.fetchrow(
            """
            INSERT INTO handles (account_id, kind, value, verified_at)
            VALUES ($1, $2, $3, CASE WHEN $4 THEN now() END)
            RETURNING *
            """,
            account_id,
            kind,
            value,
            verified,
        )
    except asyncpg.UniqueViolationError:
        raise InvalidInput(f"that {kind} handle already belongs to an account") from None
    except asyncpg.ForeignKeyViolationError:
        raise NotFound(f"no account {account_id}") from None
    return _handle(row)


async def set_handle_verified(
    db: Executor, kind: str, raw_value: str, verified: bool = True, *, default_region: str = "US"
) -> Handle:
    value = normalize_handle(kind, raw_value, default_region)
    row = await db.fetchrow(
        """
        UPDATE handles SET verified_at = CASE WHEN $3 THEN coalesce(verified_at, now()) END
        WHERE kind = $1 AND value = $2 RETURNING *
        """,
        kind,
        value,
        verified,
    )
    if row is None:
        raise NotFound(f"no {kind} handle like that")
    return _handle(row)


async def find_handle(db: Executor, kind: str, raw_value: str, *, default_region: str = "US") -> Handle | None:
    """The handle for a sender, or None when it belongs to no account (or does not parse)."""
    try:
        value = normalize_handle(kind, raw_value, default_region)
    except InvalidInput:
        return None
    row = await db.fetchrow("SELECT * FROM handles WHERE kind = $1 AND value = $2", kind, value)
    return _handle(row) if row else None


async def list_handles(db: Executor, account_id: UUID) -> list[Handle]:
    rows = await db.fetch("SELECT * FROM handles WHERE account_id = $1 ORDER BY created_at", account_id)
    return [_handle(r) for r in rows]


async def set_consent(
    db: Executor, handle_id: UUID, channels: tuple[str, ...] | list[str], *, opted_out: bool, source: str
) -> None:
    """Record an opt-out (STOP) or opt-in (START) for each channel given."""
    for channel in channels:
        if channel not in CONSENT_CHANNELS:
            raise InvalidInput(f"unknown channel {channel!r}")
    await db.execute(
        """
        INSERT INTO handle_consents (handle_id, channel, opted_out, source)
        SELECT $1, unnest($2::text[]), $3, $4
        ON CONFLICT (handle_id, channel)
        DO UPDATE SET opted_out = EXCLUDED.opted_out, source = EXCLUDED.source, changed_at = now()
        """,
        handle_id,
        list(channels),
        opted_out,
        source,
    )


async def is_blocked(db: Executor, handle_id: UUID, channel: str) -> bool:
    """True when the person behind this handle opted out of this channel. Fails toward blocked."""
    if channel not in CONSENT_CHANNELS:
        return True
    opted_out = await db.fetchval(
        "SELECT opted_out FROM handle_consents WHERE handle_id = $1 AND channel = $2", handle_id, channel
    )
    return bool(opted_out)


def hash_pin(pin: str) -> str:
    if not PIN_PATTERN.match(pin):
        raise InvalidInput("a PIN is 4 to 12 digits")
    return _hasher.hash(pin)


async def set_pin(db: Executor, account_id: UUID, pin: str) -> None:
    status = await db.execute(
        "UPDATE accounts SET pin_hash = $2, updated_at = now() WHERE id = $1",
        account_id,
        await asyncio.get_running_loop().run_in_executor(_argon2_pool, hash_pin, pin),
    )
    if status.endswith(" 0"):
        raise NotFound(f"no account {account_id}")


async def verify_pin(db: Executor, account_id: UUID, pin: str) -> bool:
    """Constant-time check of a spoken or keyed PIN; False when no PIN is set."""
    stored = await db.fetchval("SELECT pin_hash FROM accounts WHERE id = $1", account_id)
    if stored is None or not PIN_PATTERN.match(pin):
        return False
    return await argon2_verify(stored, pin)


async def assign_line(
    db: Executor,
    raw_number: str,
    kind: str,
    account_id: UUID,
    *,
    label: str | None = None,
    default_region: str = "US",
) -> PhoneLine:
    """Tie a Twilio number to an account as its personal line or its answering service."""
    if kind not in LINE_KINDS:
        raise InvalidInput(f"a line is one of {', '.join(LINE_KINDS)}")
    number = normalize_phone(raw_number, default_region)
    try:
        row = await db.fetchrow(
            """
            INSERT INTO phone_lines (number, kind, account_id, label) VALUES ($1, $2, $3, $4)
            ON CONFLICT (number) DO UPDATE
                SET kind = EXCLUDED.kind, account_id = EXCLUDED.account_id, label = EXCLUDED.label
            RETURNING *
            """,
            number,
            kind,
            account_id,
            label,
        )
    except asyncpg.ForeignKeyViolationError:
        raise NotFound(f"no account {account_id}") from None
    return _line(row)


def _line(row: Any) -> PhoneLine:
    return PhoneLine(row["number"], row["kind"], row["account_id"], row["label"], row["voice_engine"])


async def set_line_engine(
    db: Executor, raw_number: str, engine: str | None, *, default_region: str = "US"
) -> PhoneLine:
    """Which realtime engine calls on this line run on; ``None`` goes back to the setting."""
    if engine is not None and engine not in VOICE_ENGINES:
        raise InvalidInput(f"a voice engine is one of {', '.join(VOICE_ENGINES)}")
    number = normalize_phone(raw_number, default_region)
    row = await db.fetchrow("UPDATE phone_lines SET voice_engine = $2 WHERE number = $1 RETURNING *", number, engine)
    if row is None:
        raise NotFound(f"no line {number}")
    return _line(row)


async def find_line(db: Executor, raw_number: str, *, default_region: str = "US") -> PhoneLine | None:
    try:
        number = normalize_phone(raw_number, default_region)
    except InvalidInput:
        return None
    row = await db.fetchrow("SELECT * FROM phone_lines WHERE number = $1", number)
    return _line(row) if row else None


async def list_lines(db: Executor) -> list[PhoneLine]:
    rows = await db.fetch("SELECT * FROM phone_lines ORDER BY kind, number")
    return [_line(r) for r in rows]
