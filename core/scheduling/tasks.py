"""Scheduled tasks in the store: create, list, cancel, and the owner's place.

Shared by the chat tools (``core/tools/areas/tasks`` and ``reminders``), the CLI and the
scheduler. A task is a prompt with a schedule and where its result goes; a reminder is a
one-shot task. Creating a task computes its first occurrence; the scheduler takes it from there.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from core.errors import InvalidInput, NotFound
from core.records import rooms
from core.scheduling.schedule import Place, Schedule, ScheduleError, stable_offset
from core.store.queries import Queries

# Where a run's result can go. Empty means the person's usual channel (see the scheduler). Besides
# these, ``room:ROOM`` posts it in a room the owner is a member of (``room:`` + the room's id once
# stored; the CLI takes a name): see ``resolve_rooms``. ``call``: a phone call (``voice.outbound``)
# to the owner's verified number or the task's approved one.
DELIVERY_CHANNELS: tuple[str, ...] = ("chat", "sms", "whatsapp", "email", "call")
ROOM_PREFIX = "room:"
TASK_KINDS: tuple[str, ...] = ("task", "reminder")
# The speed bump: cancelling more than this many tasks in one turn needs an explicit bulk flag.
CANCEL_LIMIT_PER_TURN = 2


@dataclass(frozen=True)
class ScheduledTask:
    id: int
    account_id: UUID
    kind: str
    title: str
    prompt: str
    schedule: Schedule
    timezone: str | None
    deliver_to: tuple[str, ...]
    offset_seconds: int
    status: str
    next_run_at: datetime | None
    created_at: datetime
    call_number: str | None = None  # the number a ``call`` delivery dials, if not the owner's
    call_approved: bool = False  # set by the owner (never by a scheduled run): only then dialled

    def describe(self) -> str:
        where = ", ".join(self.deliver_to) if self.deliver_to else "usual channel"
        return f"#{self.id} {self.title} ({self.schedule.describe()}; to {where})"


def task_from_row(row: Any) -> ScheduledTask:
    schedule = row["schedule"]
    if isinstance(schedule, str):
        schedule = json.loads(schedule)
    return ScheduledTask(
        id=row["id"],
        account_id=row["account_id"],
        kind=row["kind"],
        title=row["title"],
        prompt=row["prompt"],
        schedule=Schedule.from_record(schedule),
        timezone=row["timezone"],
        deliver_to=tuple(row["deliver_to"] or ()),
        offset_seconds=row["offset_seconds"],
        call_number=row.get("call_number"),
        call_approved=bool(row.get("call_approved")),
        status=row["status"],
        next_run_at=row["next_run_at"],
        created_at=row["created_at"],
    )


def check_channels(channels: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for channel in channels:
        name = channel.strip().lower()
        if name.startswith(ROOM_PREFIX):
            ref = channel.strip()[len(ROOM_PREFIX) :].strip()
            if not ref:
                raise InvalidInput("name the room: room:NAME")
            name = ROOM_PREFIX + ref
            if name not in out:
                out.append(name)
            continue
        if name in ("web", "app"):
            name = "chat"
        if name in ("phone", "voice", "phone call"):
            name = "call"
        if name not in DELIVERY_CHANNELS:
            raise InvalidInput(f"unknown channel {channel!r}; use one of {', '.join(DELIVERY_CHANNELS)}")
        if name not in out:
            out.append(name)
    return tuple(out)


async def resolve_rooms(db: Queries, account_id: UUID, channels: Sequence[str]) -> tuple[str, ...]:
    """``room:NAME`` channels as ``room:<room id>``, each a room the account is a member of (checked
    again at every delivery: a member who left gets the result on chat instead)."""
    out: list[str] = []
    for channel in channels:
        if channel.startswith(ROOM_PREFIX):
            room = await rooms.get_room(db, channel[len(ROOM_PREFIX) :])
            if not await rooms.is_member(db, room.id, account_id):
                raise InvalidInput(f"results can go only to a room the account is a member of, not {room.name!r}")
            channel = f"{ROOM_PREFIX}{room.id}"
        if channel not in out:
            out.append(channel)
    return tuple(out)


async def owner_place(db: Queries, account_id: UUID) -> Place | None:
    row = await db.fetchrow("SELECT latitude, longitude FROM account_places WHERE account_id = $1", account_id)
    return Place(row["latitude"], row["longitude"]) if row else None


async def set_owner_place(db: Queries, account_id: UUID, place: Place, label: str | None = None) -> None:
    await db.execute(
        """
        INSERT INTO account_places (account_id, latitude, longitude, label) VALUES ($1, $2, $3, $4)
        ON CONFLICT (account_id) DO UPDATE
        SET latitude = excluded.latitude, longitude = excluded.longitude, label = excluded.label, updated_at = now()
        """,
        account_id,
        place.latitude,
        place.longitude,
        label,
    )


async def account_timezone(db: Queries, account_id: UUID) -> str:
    tz = await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id)
    if tz is None:
        raise NotFound(f"no account {account_id}")
    return tz


async def first_occurrence(
    db: Queries, account_id: UUID, schedule: Schedule, timezone: str, now: datetime
) -> datetime | None:
    place = await owner_place(db, account_id) if schedule.needs_place else None
    if schedule.needs_place and place is None:
        raise ScheduleError(
            "this schedule follows the sun, but Pepper does not know where you are; "
            "set your place first (pepper tasks place ACCOUNT LAT LON)"
        )
    return schedule.next_after(now, timezone, place)


async def create_task(
    conn: Queries,
    account_id: UUID,
    *,
    title: str,
    prompt: str,
    schedule: Schedule,
    now: datetime,
    kind: str = "task",
    deliver_to: Sequence[str] = (),
    timezone: str | None = None,
    created_turn_id: UUID | None = None,
    call_number: str | None = None,
    call_approved: bool = False,
) -> ScheduledTask:
    """Insert a task with its first occurrence; ``conn`` should be a connection in a transaction.
    ``call_number``: where a ``call`` delivery dials (not the owner's own number), dialled only
    with ``call_approved`` (the owner set it: the CLI, a live turn's confirmed write).

    Raises ``InvalidInput`` (or ``ScheduleError``) for a task that could never run.
    """
    title, prompt = title.strip(), prompt.strip()
    if not title or not prompt:
        raise InvalidInput("a task needs a title and a prompt")
    if kind not in TASK_KINDS:
        raise InvalidInput(f"unknown task kind {kind!r}")
    channels = await resolve_rooms(conn, account_id, check_channels(deliver_to))
    zone_name = timezone or await account_timezone(conn, account_id)
    first = await first_occurrence(conn, account_id, schedule, zone_name, now)
    if first is None:
        raise ScheduleError("that schedule has no time in the future")
    row = await conn.fetchrow(
        """
        INSERT INTO scheduled_tasks
            (account_id, kind, title, prompt, schedule, timezone, deliver_to, next_run_at, created_turn_id,
             call_number, call_approved)
        VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11)
        RETURNING *
        """,
        account_id,
        kind,
        title[:200],
        prompt,
        json.dumps(schedule.as_record()),
        timezone,
        list(channels),
        first,
        created_turn_id,
        call_number,
        call_approved and call_number is not None,
    )
    offset = stable_offset(row["id"], schedule)
    if offset:
        row = await conn.fetchrow(
            "UPDATE scheduled_tasks SET offset_seconds = $2 WHERE id = $1 RETURNING *", row["id"], offset
        )
    return task_from_row(row)


async def list_tasks(
    db: Queries, account_id: UUID | None = None, *, include_inactive: bool = False
) -> list[ScheduledTask]:
    rows = await db.fetch(
        """
        SELECT * FROM scheduled_tasks
        WHERE ($1::uuid IS NULL OR account_id = $1) AND ($2 OR status = 'active')
        ORDER BY id
        """,
        account_id,
        include_inactive,
    )
    return [task_from_row(r) for r in rows]


async def get_task(db: Queries, task_id: int, account_id: UUID | None = None) -> ScheduledTask:
    row = await db.fetchrow(
        "SELECT * FROM scheduled_tasks WHERE id = $1 AND ($2::uuid IS NULL OR account_id = $2)", task_id, account_id
    )
    if row is None:
        raise NotFound(f"there is no task #{task_id}")
    return task_from_row(row)


async def is_active(db: Queries, task_id: int, account_id: UUID) -> bool:
    found = await db.fetchval(
        "SELECT 1 FROM scheduled_tasks WHERE id = $1 AND account_id = $2 AND status = 'active'", task_id, account_id
    )
    return bool(found)


async def cancelled_in_turn(db: Queries, turn_id: UUID) -> int:
    return await db.fetchval("SELECT count(*) FROM scheduled_tasks WHERE cancelled_turn_id = $1", turn_id)


async def cancel_tasks(
    conn: Queries, account_id: UUID | None, task_ids: Sequence[int], *, now: datetime, turn_id: UUID | None = None
) -> list[int]:
    """Cancel active tasks (of ``account_id`` when given); returns the ids actually cancelled.

    Occurrences not yet started are dropped with them; a run already under way finishes.
    """
    rows = await conn.fetch(
        """
        UPDATE scheduled_tasks
        SET status = 'cancelled', cancelled_at = $3, cancelled_turn_id = $4, next_run_at = NULL
        WHERE id = ANY($2::bigint[]) AND ($1::uuid IS NULL OR account_id = $1) AND status = 'active'
        RETURNING id
        """,
        account_id,
        list(task_ids),
        now,
        turn_id,
    )
    ids = [r["id"] for r in rows]
    if ids:
        await conn.execute(
            "DELETE FROM task_runs WHERE task_id = ANY($1::bigint[]) AND status = 'due' AND attempts = 0", ids
        )
    return ids
