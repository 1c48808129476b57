"""Feature area: scheduled tasks, created, listed and cancelled from chat.

A task is a prompt the agent runs on a schedule (a morning brief, a watch); its result goes to
chat, SMS, WhatsApp or email. Speed bump, in code: one turn may cancel at most two tasks; a third
needs ``bulk: true``, because a vague "turn this off" once cancelled all ten of a person's tasks.
A scheduled run can neither create nor cancel tasks: no person is there to ask.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.errors import InvalidInput
from core.identity import normalize_phone
from core.scheduling.schedule import SCHEDULE_HELP, Schedule, ScheduleError, parse_schedule
from core.scheduling.tasks import (
    CANCEL_LIMIT_PER_TURN,
    DELIVERY_CHANNELS,
    cancel_tasks,
    cancelled_in_turn,
    check_channels,
    create_task,
    first_occurrence,
    list_tasks,
)
from core.store.queries import Queries
from core.tools.registry import Tool, ToolContext, ToolOutcome

NOT_IN_SCHEDULED_RUNS = "a scheduled run cannot create or cancel scheduled tasks; the person must ask in chat"


def _local(moment: datetime, timezone: str) -> str:
    return f"{moment.astimezone(ZoneInfo(timezone)):%a %d %b %H:%M}"


async def _plan_create(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    if not ctx.session.person_present:
        return ToolOutcome.failed(NOT_IN_SCHEDULED_RUNS)
    timezone = ctx.session.timezone
    try:
        schedule = parse_schedule(args["schedule"], now=ctx.now, timezone=timezone)
        channels = check_channels(args.get("deliver_to", []))
        first = await first_occurrence(ctx.db, ctx.session.account_id, schedule, timezone, ctx.now)
        call_number = normalize_phone(args["call_number"]) if args.get("call_number") else None
    except (ScheduleError, InvalidInput) as exc:
        return ToolOutcome.failed(exc.message)
    if first is None:
        return ToolOutcome.failed("that schedule has no time in the future")
    payload = {
        "title": args["title"],
        "prompt": args["prompt"],
        "schedule": schedule.as_record(),
        "deliver_to": list(channels),
        "call_number": call_number,
        "now": ctx.now.isoformat(),
        "turn_id": str(ctx.session.turn_id) if ctx.session.turn_id else None,
    }
    where = ", ".join(channels) if channels else "the usual channel"
    summary = (
        f"task '{args['title'].strip()}' scheduled {schedule.describe()}, "
        f"first run {_local(first, timezone)}, results to {where}"
    )
    return ToolOutcome.planned(payload, summary)


async def _apply_create(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await create_task(
        conn,
        account_id,
        title=payload["title"],
        prompt=payload["prompt"],
        schedule=Schedule.from_record(payload["schedule"]),
        deliver_to=payload["deliver_to"],
        now=datetime.fromisoformat(payload["now"]),
        created_turn_id=UUID(payload["turn_id"]) if payload.get("turn_id") else None,
        # Only a person present plans a task (never a scheduled run): the number is theirs to approve.
        call_number=payload.get("call_number"),
        call_approved=payload.get("call_number") is not None,
    )


async def _list(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    tasks = await list_tasks(ctx.db, ctx.session.account_id)
    if not tasks:
        return ToolOutcome.empty("there are no scheduled tasks or reminders")
    last = {
        r["task_id"]: r
        for r in await ctx.db.fetch(
            """
            SELECT DISTINCT ON (task_id) task_id, status, occurrence_at FROM task_runs
            WHERE task_id = ANY($1::bigint[]) AND status IN ('ran', 'silent', 'failed', 'missed')
            ORDER BY task_id, occurrence_at DESC
            """,
            [t.id for t in tasks],
        )
    }
    lines = []
    for t in tasks:
        line = f"- {t.describe()}"
        if t.kind == "reminder":
            line += " [reminder]"
        if t.next_run_at is not None:
            line += f"; next {_local(t.next_run_at, t.timezone or ctx.session.timezone)}"
        if t.id in last:
            line += f"; last run {last[t.id]['status']}"
        lines.append(line)
    return ToolOutcome.ok("\n".join(lines))


async def _plan_cancel(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
    if not ctx.session.person_present:
        return ToolOutcome.failed(NOT_IN_SCHEDULED_RUNS)
    ids = args["ids"]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in ids):
        return ToolOutcome.failed("ids must be task numbers from list_tasks")
    ids = sorted(set(ids))
    turn_id = ctx.session.turn_id
    already = await cancelled_in_turn(ctx.db, turn_id) if turn_id is not None else 0
    if already + len(ids) > CANCEL_LIMIT_PER_TURN and not args.get("bulk", False):
        return ToolOutcome.failed(
            f"cancelling more than {CANCEL_LIMIT_PER_TURN} tasks in one turn needs bulk=true "
            f"({already} already cancelled in this turn, {len(ids)} more asked). Nothing was cancelled. "
            "Check with the person that they really mean all of them"
        )
    rows = await ctx.db.fetch(
        "SELECT id, title FROM scheduled_tasks WHERE id = ANY($1::bigint[]) AND account_id = $2 AND status = 'active'",
        ids,
        ctx.session.account_id,
    )
    found = {r["id"]: r["title"] for r in rows}
    missing = [i for i in ids if i not in found]
    if missing:
        return ToolOutcome.failed(f"there is no active task #{missing[0]}; nothing was cancelled")
    names = ", ".join(f"#{i} {found[i]}" for i in ids)
    payload = {"ids": ids, "now": ctx.now.isoformat(), "turn_id": str(turn_id) if turn_id else None}
    return ToolOutcome.planned(payload, f"cancelled {names}")


async def _apply_cancel(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    await cancel_tasks(
        conn,
        account_id,
        payload["ids"],
        now=datetime.fromisoformat(payload["now"]),
        turn_id=UUID(payload["turn_id"]) if payload.get("turn_id") else None,
    )


TOOLS: tuple[Tool, ...] = (
    Tool(
        name="create_task",
        description=(
            "Schedule a task: Pepper runs `prompt` on the schedule and sends the result. "
            "For watches ('tell me if anything new arrives') the run stays silent when it finds nothing. "
            + SCHEDULE_HELP
        ),
        parameters={
            "type": "object",
            "properties": {
                "title": {"type": "string", "minLength": 1, "maxLength": 200, "description": "a short name"},
                "prompt": {"type": "string", "minLength": 1, "maxLength": 4000, "description": "what to do each run"},
                "schedule": {"type": "string", "minLength": 1, "maxLength": 200},
                "deliver_to": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(DELIVERY_CHANNELS)},
                    "description": "where results go; leave out for the person's usual channel",
                },
                "call_number": {
                    "type": "string",
                    "maxLength": 32,
                    "description": "for deliver_to call: a number other than the person's own to call (they asked)",
                },
            },
            "required": ["title", "prompt", "schedule"],
            "additionalProperties": False,
        },
        handler=_plan_create,
        apply=_apply_create,
        area="tasks",
        writes=True,
    ),
    Tool(
        name="list_tasks",
        description="List the person's scheduled tasks and reminders with their numbers, schedules and last result.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
        handler=_list,
        area="tasks",
    ),
    Tool(
        name="cancel_tasks",
        description=(
            "Cancel scheduled tasks or reminders by their numbers from list_tasks. At most two per turn; "
            "more needs bulk=true, only after the person clearly asked to cancel all of them."
        ),
        parameters={
            "type": "object",
            "properties": {
                "ids": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                "bulk": {"type": "boolean", "description": "true only when the person asked to cancel many"},
            },
            "required": ["ids"],
            "additionalProperties": False,
        },
        handler=_plan_cancel,
        apply=_apply_cancel,
        area="tasks",
        writes=True,
    ),
)
