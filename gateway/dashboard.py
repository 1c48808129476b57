"""The dashboard pages: approvals, calls (with transcripts), scheduled tasks and their receipts,
the rooms (each of the member's calendars' sharing level), the dossier, plots, and settings (what
``pepper doctor`` says). Signed-in only; each shows the signed-in account's own records. Their
actions post to ``gateway.web_api``."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from quart import Blueprint, Response, current_app

from core.memory.dossier import load_dossier, revisions
from core.quality.jobs import grades_report
from core.quality.points import POINTS
from core.records import dashboard, rooms
from core.records.calls import LATENCY_PARTS
from core.records.connections import connections_of
from core.scheduling.runs import recent_receipts
from core.scheduling.tasks import account_timezone, list_tasks
from core.tools.areas.calendar import calendars
from gateway.answering_routes import screening
from gateway.doctor import diagnose
from gateway.latency_plots import RECENT_CALLS, numbers, quantile, recent_calls, reply_bars
from gateway.pages import signed_in_page
from gateway.services import Services
from gateway.web_api import all_approvals
from gateway.webchat import plain_id, tool_label
from gateway.webhooks import served_paths

PLOT_DAYS = 30
LEVEL_NAMES = (
    ("nothing", "Nothing"),
    ("free_busy", "Free/busy"),
    ("titles", "Titles and times"),
    ("everything", "Everything"),
)

blueprint = Blueprint("dashboard", __name__, template_folder="templates")


def _services() -> Services:
    return current_app.extensions["pepper"]


@signed_in_page(blueprint, "/approvals", "Approvals")
async def approvals_page(account_id: UUID) -> dict[str, Any]:
    return {"template": "approvals.html", "groups": await all_approvals(_services(), account_id)}


@signed_in_page(blueprint, "/calls", "Calls")
async def calls_page(account_id: UUID) -> dict[str, Any]:
    db = _services().db
    recent = recent_calls(await dashboard.recent_call_latency(db, account_id, RECENT_CALLS))
    return {"template": "calls.html", "calls": await dashboard.calls_of(db, account_id), "recent": recent}


@signed_in_page(blueprint, "/calls/<call_sid>", "Call")
async def call_page(account_id: UUID, call_sid: str) -> dict[str, Any] | Response:
    detail = await dashboard.call_detail(_services().db, account_id, call_sid) if plain_id(call_sid) else None
    if detail is None:
        return Response("no such call\n", status=404, content_type="text/plain")
    tools = [{**t, "label": tool_label(str(t.get("name", "")))} for t in detail["tools"] if isinstance(t, dict)]
    return {"template": "call.html", **detail, "tools": tools, "latency": _latency(detail["stats"]),
            "breakdown": _breakdown(detail["stats"]), "screening": screening(dict(detail["call"])),
            "bars": reply_bars(detail["stats"])}  # fmt: skip


def _breakdown(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """The call's latency broken down (core.records.calls.LATENCY_PARTS): the parts it has."""
    parts = []
    for key, label in LATENCY_PARTS:
        ms = numbers(stats.get(key))
        if ms:
            parts.append({"key": key, "label": label, "count": len(ms), "p50": statistics.median(ms), "max": max(ms)})
    return parts


def _latency(stats: dict[str, Any]) -> dict[str, float] | None:
    ms = numbers(stats.get("response_ms"))
    if not ms:
        return None
    return {"count": len(ms), "p50": quantile(ms, 0.5), "p99": quantile(ms, 0.99), "max": max(ms)}


@signed_in_page(blueprint, "/tasks", "Tasks")
async def tasks_page(account_id: UUID) -> dict[str, Any]:
    db = _services().db
    zone = ZoneInfo(await account_timezone(db, account_id))
    tasks = [
        {"task": t, "receipts": await recent_receipts(db, t.id, 10)}
        for t in await list_tasks(db, account_id, include_inactive=True)
    ]
    return {"template": "tasks.html", "tasks": tasks, "zone": zone}


@signed_in_page(blueprint, "/rooms", "Rooms")
async def rooms_page(account_id: UUID) -> dict[str, Any]:
    """The signed-in member's rooms and, per room, what they share of each of their calendars:
    their own levels only (another member's are not even shown)."""
    db = _services().db
    own = await calendars(db, account_id)
    listed = []
    for room in await rooms.member_rooms(db, account_id):
        levels = await rooms.shares(db, room.id)
        listed.append({"room": room, "calendars": [(c, levels.get((account_id, c.id), "nothing")) for c in own]})
    return {"template": "rooms.html", "rooms": listed, "levels": LEVEL_NAMES}


@signed_in_page(blueprint, "/dossier", "Dossier")
async def dossier_page(account_id: UUID) -> dict[str, Any]:
    db = _services().db
    return {
        "template": "dossier.html",
        "halves": await load_dossier(db, account_id),
        "revisions": await revisions(db, account_id),
    }


@signed_in_page(blueprint, "/settings", "Settings")
async def settings_page(account_id: UUID) -> dict[str, Any]:
    services = _services()
    report = await diagnose(services.settings, served_paths(current_app), inspect=False)
    connected = await connections_of(services.db, account_id)
    return {"template": "settings.html", "report": report, "connected": connected}


@signed_in_page(blueprint, "/plots", "Plots")
async def plots_page(account_id: UUID) -> dict[str, Any]:
    db = _services().db
    zone_name = await account_timezone(db, account_id)
    since = datetime.now(UTC) - timedelta(days=PLOT_DAYS)
    per_day: dict[str, list[float]] = defaultdict(list)
    for started, ms in await dashboard.call_response_times(db, account_id, since):
        per_day[started.astimezone(ZoneInfo(zone_name)).date().isoformat()].extend(ms)
    latency = [
        {"day": day, "p50": quantile(ms, 0.5), "p99": quantile(ms, 0.99), "count": len(ms)}
        for day, ms in sorted(per_day.items())
    ]
    usage = [
        {"day": r["day"].isoformat(), "turns": r["turns"], "input_tokens": r["input_tokens"],
         "output_tokens": r["output_tokens"]}
        for r in await dashboard.turns_per_day(db, account_id, since, zone_name)
    ]  # fmt: skip
    grades = _grades(await grades_report(db, since, datetime.now(UTC), account_id=account_id))
    return {
        "template": "plots.html",
        "figures": json.dumps({"latency": latency, "usage": usage, "grades": grades}).replace("<", "\\u003c"),
        "latency": latency,
        "usage": usage,
        "grades": grades,
    }


def _grades(rows: list[Any]) -> dict[str, Any]:
    """The judge's pass rate per point for each model (tier/model) of the person's graded turns:
    passes over pass + fail, None where it graded nothing (n/a only)."""
    by_model: dict[str, dict[str, tuple[int, int]]] = defaultdict(dict)
    for r in rows:
        by_model[f"{r['tier']}/{r['model']}"][r["point"]] = (r["passed"], r["failed"])
    models = []
    for name, points in sorted(by_model.items()):
        counts = [points.get(p, (0, 0)) for p in POINTS]
        models.append({
            "model": name,
            "pass_rate": [round(100 * ok / (ok + bad), 1) if ok + bad else None for ok, bad in counts],
            "graded": [ok + bad for ok, bad in counts],
        })  # fmt: skip
    return {"points": list(POINTS), "models": models}
