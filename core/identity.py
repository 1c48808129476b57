"""Accounts and the handles that point to them.

A person's account is the identity. Phone numbers, email addresses and web logins are handles:
each points to one account, carries its own verified flag and, per channel, the person's consent
(an SMS STOP blocks SMS, WhatsApp and calls for that number). The Twilio numbers Pepper answers
are lines, each tied to the account it serves.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, cast
from uuid import UUID
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import asyncpg
import phonenumbers
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from core.errors import InvalidInput, NotFound
from core.settings import VOICE_ENGINES, VOICE_TRANSPORTS
from core.store.queries import Queries

HandleKind = Literal["phone", "email", "web", "matrix"]
Channel = Literal["sms", "whatsapp", "voice", "email"]
LineKind = Literal["personal", "answering"]

HANDLE_KINDS: tuple[str, ...] = ("phone", "email", "web", "matrix", "plugin")
CONSENT_CHANNELS: tuple[str, ...] = ("sms", "whatsapp", "voice", "email")
LINE_KINDS: tuple[str, ...] = ("personal", "answering")
# A STOP on a phone number blocks every channel that reaches that number.
PHONE_CHANNELS: tuple[str, ...] = ("sms", "whatsapp", "voice")

PIN_PATTERN = re.compile(r"^\d{4,12}$")
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_WEB_LOGIN = re.compile(r"^[a-z0-9][a-z0-9._-]{1,63}$")
# A Matrix user ID: @localpart:server (the spec's localpart characters; a server name with an optional port).
_MATRIX_ID = re.compile(r"^@[a-z0-9._=/+-]+:[a-z0-9.-]+(:\d{1,5})?$")
# A plugin text channel's sender (``gateway.plugin_channels``): the plugin's name, then its address.
_PLUGIN_HANDLE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}:[!-~]{1,200}$")

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
    voice_transport: str | None = None  # None: the voice_transport setting


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


def phone_region(e164: str) -> str | None:
    """The ISO 3166 region (``GB``, ``US``) a valid E.164 number belongs to, or None."""
    try:
        return phonenumbers.region_code_for_number(phonenumbers.parse(e164, None))
    except phonenumbers.NumberParseException:
        return None


def is_phone_region(code: str) -> bool:
    """Whether ``code`` is a region phone numbers are assigned to (``GB``, ``US``...)."""
    return code.upper() in phonenumbers.SUPPORTED_REGIONS


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
    if kind == "matrix":
        value = raw.strip().lower()
        if not _MATRIX_ID.match(value) or len(value) > 255:
            raise InvalidInput("a Matrix ID looks like @name:example.org")
        return value
    if kind == "plugin":
        value = raw.strip().lower()
        if not _PLUGIN_HANDLE.match(value):
            raise InvalidInput("a plugin channel's sender is PLUGIN:address (the plugin's name, then its address)")
        return value
    raise InvalidInput(f"unknown handle kind {kind!r}; use one of {', '.join(HANDLE_KINDS)}")


def _account(row: asyncpg.Record) -> Account:
    return Account(row["id"], row["name"], row["timezone"], row["pin_hash"] is not None, row["created_at"])


def _handle(row: asyncpg.Record) -> Handle:
    return Handle(row["id"], row["account_id"], row["kind"], row["value"], row["verified_at"] is not None)


async def create_account(db: Queries, name: str, *, timezone: str = "UTC") -> Account:
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


async def get_account(db: Queries, ref: UUID | str) -> Account:
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


async def list_accounts(db: Queries) -> list[Account]:
    return [_account(r) for r in await db.fetch("SELECT * FROM accounts ORDER BY created_at")]


async def add_handle(
    db: Queries,
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
    db: Queries, kind: str, raw_value: str, verified: bool = True, *, default_region: str = "US"
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


async def find_handle(db: Queries, kind: str, raw_value: str, *, default_region: str = "US") -> Handle | None:
    """The handle for a sender, or None when it belongs to no account (or does not parse)."""
    try:
        value = normalize_handle(kind, raw_value, default_region)
    except InvalidInput:
        return None
    row = await db.fetchrow("SELECT * FROM handles WHERE kind = $1 AND value = $2", kind, value)
    return _handle(row) if row else None


async def list_handles(db: Queries, account_id: UUID) -> list[Handle]:
    rows = await db.fetch("SELECT * FROM handles WHERE account_id = $1 ORDER BY created_at", account_id)
    return [_handle(r) for r in rows]


async def first_verified_handle(db: Queries, account_id: UUID, kind: HandleKind) -> Handle | None:
    """The account's oldest verified handle of ``kind``: where Pepper reaches the person unasked
    (a scheduled run's result), or None."""
    row = await db.fetchrow(
        """
        SELECT * FROM handles WHERE account_id = $1 AND kind = $2 AND verified_at IS NOT NULL
        ORDER BY created_at, id LIMIT 1
        """,
        account_id,
        kind,
    )
    return _handle(row) if row else None


async def set_consent(
    db: Queries, handle_id: UUID, channels: tuple[str, ...] | list[str], *, opted_out: bool, source: str
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


async def is_blocked(db: Queries, handle_id: UUID, channel: str) -> bool:
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


# PINs people pick most often that the repeat and sequence rules below do not already catch
# (published analyses of leaked PIN sets: dates, keypad columns and patterns, pairs).
COMMON_PINS: frozenset[str] = frozenset(
    """1212 1004 2000 2001 1010 6969 1122 1313 2580 0852 1998 1999 2020 2021 2022 2023 2024 2025 1969
    5683 1066 1221 2112 4545 7007 0007 1357 8520 1230 0101 0911 9111 1984 1990 1991 1992 2525
    123123 112233 121212 696969 159753 159357 147258 258369 789456 520520 131313 102030 111222
    123321 101010 007007 000123""".split()
)


def weak_pin_reason(pin: str, phones: list[str] | tuple[str, ...] = ()) -> str | None:
    """Why this PIN is too easy to guess, or None. ``phones``: the owner's numbers (E.164)."""
    if len(set(pin)) == 1:
        return "a PIN of one repeated digit is too easy to guess"
    steps = {(int(b) - int(a)) % 10 for a, b in itertools.pairwise(pin)}
    if steps in ({1}, {9}):
        return "a PIN of ascending or descending digits is too easy to guess"
    if pin in COMMON_PINS:
        return "that PIN is one of the most common PINs; choose another"
    if any(phone.endswith(pin) for phone in phones):
        return "a PIN must not be the last digits of the owner's phone number"
    return None


async def set_pin(db: Queries, account_id: UUID, pin: str) -> None:
    if not PIN_PATTERN.match(pin):
        raise InvalidInput("a PIN is 4 to 12 digits")
    rows = await db.fetch("SELECT value FROM handles WHERE account_id = $1 AND kind = 'phone'", account_id)
    reason = weak_pin_reason(pin, [r["value"] for r in rows])
    if reason is not None:
        raise InvalidInput(f"{reason}; nothing changed")
    status = await db.execute(
        "UPDATE accounts SET pin_hash = $2, updated_at = now() WHERE id = $1",
        account_id,
        await asyncio.get_running_loop().run_in_executor(_argon2_pool, hash_pin, pin),
    )
    if status.endswith(" 0"):
        raise NotFound(f"no account {account_id}")


async def verify_pin(db: Queries, account_id: UUID, pin: str) -> bool:
    """Constant-time check of a spoken or keyed PIN; False when no PIN is set."""
    stored = await db.fetchval("SELECT pin_hash FROM accounts WHERE id = $1", account_id)
    if stored is None or not PIN_PATTERN.match(pin):
        return False
    return await argon2_verify(stored, pin)


async def assign_line(
    db: Queries,
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
    return PhoneLine(row["number"], row["kind"], row["account_id"], row["label"], row["voice_engine"],
                     row["voice_transport"])  # fmt: skip


async def set_line_engine(db: Queries, raw_number: str, engine: str | None, *, default_region: str = "US") -> PhoneLine:
    """Which realtime engine calls on this line run on; ``None`` goes back to the setting."""
    if engine is not None and engine not in VOICE_ENGINES and not engine.startswith("plugin:"):
        raise InvalidInput(f"a voice engine is one of {', '.join(VOICE_ENGINES)}, or plugin:NAME")
    number = normalize_phone(raw_number, default_region)
    row = await db.fetchrow("UPDATE phone_lines SET voice_engine = $2 WHERE number = $1 RETURNING *", number, engine)
    if row is None:
        raise NotFound(f"no line {number}")
    return _line(row)


async def set_line_transport(
    db: Queries, raw_number: str, transport: str | None, *, default_region: str = "US"
) -> PhoneLine:
    """How calls reach this line (``media-streams`` or ``sip``); ``None`` goes back to the setting."""
    if transport is not None and transport not in VOICE_TRANSPORTS:
        raise InvalidInput(f"a voice transport is one of {', '.join(VOICE_TRANSPORTS)}")
    number = normalize_phone(raw_number, default_region)
    row = await db.fetchrow(
        "UPDATE phone_lines SET voice_transport = $2 WHERE number = $1 RETURNING *", number, transport
    )
    if row is None:
        raise NotFound(f"no line {number}")
    return _line(row)


async def find_line(db: Queries, raw_number: str, *, default_region: str = "US") -> PhoneLine | None:
    try:
        number = normalize_phone(raw_number, default_region)
    except InvalidInput:
        return None
    row = await db.fetchrow("SELECT * FROM phone_lines WHERE number = $1", number)
    return _line(row) if row else None


async def personal_line(db: Queries, account_id: UUID) -> PhoneLine | None:
    """The account's (oldest) personal line: the number Pepper texts and calls the person from."""
    row = await db.fetchrow(
        "SELECT * FROM phone_lines WHERE account_id = $1 AND kind = 'personal' ORDER BY created_at LIMIT 1",
        account_id,
    )
    return _line(row) if row else None


async def line_number_of(db: Queries, account_id: UUID) -> str | None:
    """The number of one of the account's lines, a personal one first; None when it has none."""
    return await db.fetchval(
        "SELECT number FROM phone_lines WHERE account_id = $1 ORDER BY (kind = 'personal') DESC LIMIT 1",
        account_id,
    )


async def list_lines(db: Queries) -> list[PhoneLine]:
    rows = await db.fetch("SELECT * FROM phone_lines ORDER BY kind, number")
    return [_line(r) for r in rows]


async def accounts_named(db: Queries, name: str) -> list[Account]:
    """Every account with exactly this name (trimmed), oldest first."""
    rows = await db.fetch("SELECT * FROM accounts WHERE name = $1 ORDER BY created_at", name.strip())
    return [_account(r) for r in rows]


async def rename_account(db: Queries, account_id: UUID, new_name: str) -> Account:
    if not new_name.strip():
        raise InvalidInput("an account needs a name")
    row = await db.fetchrow(
        "UPDATE accounts SET name = $2, updated_at = now() WHERE id = $1 RETURNING *", account_id, new_name.strip()
    )
    if row is None:
        raise NotFound(f"no account {account_id}")
    return _account(row)


async def delete_account(db: Queries, account_id: UUID) -> None:
    """Remove a person and everything Pepper holds about them, in one transaction.

    Every table with an account (or conversation, handle, call) reference cascades from
    ``accounts``; the two that name a call only by its SID (the stream tokens, the refusal records)
    are cleared here from the person's calls first.
    """
    async with _transaction(db) as conn:
        sids = [
            r["call_sid"]
            for r in await conn.fetch(
                "SELECT call_sid FROM calls WHERE account_id = $1"
                " UNION SELECT call_sid FROM answering_calls WHERE account_id = $1",
                account_id,
            )
        ]
        await conn.execute("DELETE FROM call_stream_tokens WHERE call_sid = ANY($1::text[])", sids)
        await conn.execute("DELETE FROM security_events WHERE detail->>'call_sid' = ANY($1::text[])", sids)
        status = await conn.execute("DELETE FROM accounts WHERE id = $1", account_id)
        if status.endswith(" 0"):
            raise NotFound(f"no account {account_id}")


@contextlib.asynccontextmanager
async def _transaction(db: Queries) -> Any:
    """A transaction on ``db``: a Database, a pool or a connection."""
    if isinstance(db, asyncpg.Connection):
        async with db.transaction():
            yield db
    elif isinstance(db, asyncpg.Pool):
        async with db.acquire() as conn, conn.transaction():
            yield conn
    else:
        async with cast(Any, db).transaction() as conn:  # a core.store.Database
            yield conn
