"""Feature area: reminders. A reminder is a one-shot scheduled task: at its time, Pepper runs a
short turn that reminds the person, on their usual channel unless they name one.

Cancelling a reminder goes through ``cancel_tasks`` (same numbers, same speed bump).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.errors import InvalidInput
from core.scheduling.schedule import Schedule, ScheduleError, parse_schedule, to_utc
from core.scheduling.tasks import DELIVERY_CHANNELS, check_channels, create_task
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome

WHEN_HELP = "Write when like: 'in 20 minutes', 'in 2 hours', 'at 17:30', 'tomorrow at 9am', '2025-06-02 09:00'."


def one_moment(text: str, *, now: datetime, timezone: str) -> Schedule:
    """A reminder's time as a one-shot schedule; a bare time of day means its next occurrence."""
    words = " ".join(text.strip().lower().split())
    day_shift = 0
    for word, shift in (("today at ", 0), ("tomorrow at ", 1), ("today ", 0), ("tomorrow ", 1)):
        if words.startswith(word):
            words, day_shift = "every day at " + words[len(word) :], shift
            break
    if words and words[0].isdigit() and "-" in words[:8]:
        words = "at " + words
    schedule = parse_schedule(words, now=now, timezone=timezone)
    if schedule.kind == "once":
        if schedule.moment is None or schedule.moment <= now:
            raise ScheduleError("that time has already passed")
        return schedule
    if schedule.kind != "daily" or schedule.at is None or len(schedule.days) != 7:
        raise ScheduleError(f"a reminder happens once; for a repeating one use create_task. {WHEN_HELP}")
    local_now = now.astimezone(ZoneInfo(timezone))
    base = local_now.date()
    candidate = to_utc(datetime.combine(base + timedelta(days=day_shift), schedule.at), ZoneInfo(timezone))
    if candidate <= now:
        if day_shift:
            raise ScheduleError("that time has already passed")
        candidate = to_utc(datetime.combine(base + timedelta(days=1), schedule.at), ZoneInfo(timezone))
    return Schedule("once", moment=candidate)


async def _plan_set(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    if not ctx.session.person_present:
        return ToolOutcome.failed("a scheduled run cannot set reminders; the person must ask in chat")
    try:
        schedule = one_moment(args["when"], now=ctx.now, timezone=ctx.session.timezone)
        channels = check_channels(args.get("deliver_to", []))
    except (ScheduleError, InvalidInput) as exc:
        return ToolOutcome.failed(exc.message)
    assert schedule.moment is not None
    local = schedule.moment.astimezone(ZoneInfo(ctx.session.timezone))
    payload = {
        "text": args["text"].strip(),
        "schedule": schedule.as_record(),
        "deliver_to": list(channels),
        "now": ctx.now.isoformat(),
        "turn_id": str(ctx.session.turn_id) if ctx.session.turn_id else None,
    }
    return ToolOutcome.planned(payload, f"reminder set for {local:%a %d %b %H:%M}")


async def _apply_set(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    text = payload["text"]
    await create_task(
        conn,
        account_id,
        kind="reminder",
        title=text if len(text) <= 60 else text[:57] + "...",
        prompt=text,
        schedule=Schedule.from_record(payload["schedule"]),
        deliver_to=payload["deliver_to"],
        now=datetime.fromisoformat(payload["now"]),
        created_turn_id=UUID(payload["turn_id"]) if payload.get("turn_id") else None,
    )


async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    rows = await ctx.db.fetch(
        """
        SELECT id, prompt, next_run_at FROM scheduled_tasks
        WHERE account_id = $1 AND kind = 'reminder' AND status = 'active' ORDER BY next_run_at, id
        """,
        ctx.session.account_id,
    )
    if not rows:
        return ToolOutcome.empty("there are no pending reminders")
    zone = ZoneInfo(ctx.session.timezone)
    return ToolOutcome.ok(
        "\n".join(f"- #{r['id']} {r['next_run_at'].astimezone(zone):%a %d %b %H:%M}: {r['prompt']}" for r in rows)
    )


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="set_reminder",
        description="Remind the person of something once, at a time. " + WHEN_HELP,
        parameters={
            "type": "object",
            "properties": {
                "text": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "what to remind of"},
                "when": {"type": "string", "minLength": 1, "maxLength": 100},
                "deliver_to": {"type": "array", "items": {"type": "string", "enum": list(DELIVERY_CHANNELS)}},
            },
            "required": ["text", "when"],
            "additionalProperties": False,
        },
        handler=_plan_set,
        apply=_apply_set,
        area="reminders",
        writes=True,
    ),
    Tool(
        name="list_reminders",
        description="List the person's pending reminders with their numbers and times.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        handler=_list,
        area="reminders",
    ),
)
