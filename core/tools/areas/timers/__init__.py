"""Feature area: timers ("in 10 minutes") and alarms ("at 6:30"), rung by a text (SMS or
WhatsApp) or in chat.

Both are one-shot reminders (``scheduled_tasks`` of kind ``reminder``) whose title starts with
"Timer" or "Alarm", so the scheduler runs and delivers them and ``cancel_tasks`` cancels them.
Ringing by phone call waits for the scheduler to deliver by call (not a delivery channel yet).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.scheduling.schedule import Schedule, ScheduleError, parse_schedule
from core.scheduling.tasks import create_task
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "timers"
RING = {"text": "sms", "whatsapp": "whatsapp", "chat": "chat"}


async def _plan(ctx: ToolContext, args: dict[str, Any], kind: str) -> ToolOutcome:
    if not ctx.session.person_present:
        return ToolOutcome.failed("a scheduled run cannot set timers or alarms")
    label = " ".join(str(args.get("label", "")).split())[:100]
    if kind == "Timer":
        moment = ctx.now + timedelta(minutes=float(args["minutes"]))
    else:
        words = str(args["at"]).strip().lower()
        try:
            schedule = parse_schedule(f"every day at {words}", now=ctx.now, timezone=ctx.session.timezone)
        except ScheduleError as exc:
            return ToolOutcome.failed(f"{exc.message}; write the time like 06:30 or 7am")
        if schedule.at is None:
            return ToolOutcome.failed("write the alarm's time like 06:30 or 7am")
        zone = ZoneInfo(ctx.session.timezone)
        local = ctx.now.astimezone(zone)
        moment = datetime.combine(local.date(), schedule.at, zone)
        if moment <= local:
            moment += timedelta(days=1)
    ring = args.get("ring", "text")
    when = moment.astimezone(ZoneInfo(ctx.session.timezone))
    title = f"{kind}: {label}" if label else kind
    payload = {"title": title, "moment": moment.isoformat(), "channel": RING[ring], "now": ctx.now.isoformat(),
               "turn_id": str(ctx.session.turn_id) if ctx.session.turn_id else None}  # fmt: skip
    return ToolOutcome.planned(payload, f"{kind.lower()} set for {when:%a %H:%M}, by {ring}")


async def _apply(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await create_task(
        conn, account_id, kind="reminder", title=payload["title"], prompt=f"{payload['title']} (ringing now)",
        schedule=Schedule("once", moment=datetime.fromisoformat(payload["moment"])),
        deliver_to=[payload["channel"]], now=datetime.fromisoformat(payload["now"]),
        created_turn_id=UUID(payload["turn_id"]) if payload.get("turn_id") else None,
    )  # fmt: skip


async def _plan_timer(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    if ("minutes" in args) == ("at" in args):
        return ToolOutcome.failed("give minutes (a timer) or at (an alarm), not both")
    return await _plan(ctx, args, "Timer" if "minutes" in args else "Alarm")


async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    rows = await ctx.db.fetch(
        """
        SELECT id, title, next_run_at FROM scheduled_tasks WHERE account_id = $1 AND kind = 'reminder'
          AND status = 'active' AND (title LIKE 'Timer%' OR title LIKE 'Alarm%') ORDER BY next_run_at, id
        """,
        ctx.session.account_id,
    )
    if not rows:
        return ToolOutcome.empty("no timers or alarms are set")
    zone = ZoneInfo(ctx.session.timezone)
    return ToolOutcome.ok("\n".join(f"- #{r['id']} {r['title']} at {r['next_run_at'].astimezone(zone):%a %H:%M}"
                                    for r in rows))  # fmt: skip


TOOLS: tuple[Tool, ...] = (
    Tool("set_timer", "Timer in minutes, or alarm at a time of day; rings by text unless told.",
         {"type": "object", "properties": {"minutes": {"type": "number", "exclusiveMinimum": 0, "maximum": 1440},
                                           "at": {"type": "string", "maxLength": 20}, "label": {"type": "string"},
                                           "ring": {"type": "string", "enum": list(RING)}},
          "additionalProperties": False},
         _plan_timer, AREA, writes=True, apply=_apply),
    Tool("list_timers", "Timers and alarms set, with numbers (cancel with cancel_tasks).",
         {"type": "object", "properties": {}, "additionalProperties": False}, _list, AREA),
)  # fmt: skip
