"""The calendar's suggestion cards in the web app: listed on the approvals page, accepted through
the gate (the event is made once however often the button is pressed), dismissed for good; with
garbage ids, a forged CSRF token, no session and another account's card."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import aiohttp
import pytest
from test_gateway_web_app import post, signed_in
from web_app_support import PASSWORD, WebApp, web_app

from core import access, identity
from core.quality.detectors import promote
from core.store import Database
from core.suggestions import run_detectors
from gateway.web_api import run_owner_tool


@pytest.fixture
async def app(db: Database, db_url: str) -> AsyncIterator[WebApp]:
    async with web_app(db, db_url) as running:
        yield running


async def test_suggestion_cards_are_accepted_once_and_dismissed_for_good(app: WebApp):
    now = datetime.now(UTC)
    for title in ("Write the report (1h)", "Plan the trip (30 min)"):
        made = await run_owner_tool(app.services, app.account_id, "add_todo", {"title": title})
        assert made.status == "ok", made.content
    connectors = app.services.harness.connectors
    await run_detectors(app.db, connectors, app.account_id, now)
    session, headers = await signed_in(app)
    async with session:
        async with session.get(app.base + "/api/approvals") as response:
            assert [a for a in (await response.json())["approvals"] if a["kind"] == "suggestion"] == []  # shadow
        await promote(app.db, "todo-slot", now)
        await run_detectors(app.db, connectors, app.account_id, now)
        async with session.get(app.base + "/api/approvals") as response:
            items = [a for a in (await response.json())["approvals"] if a["kind"] == "suggestion"]
        assert sorted(i["title"] for i in items) == ["Find time for 'Plan the trip (30 min)'",
                                                     "Find time for 'Write the report (1h)'"]  # fmt: skip
        assert {i["approve_label"] for i in items} == {"Accept"}
        report = next(i for i in items if "report" in i["title"])
        trip = next(i for i in items if "trip" in i["title"])
        async with session.get(app.base + "/approvals") as response:
            page = await response.text()
        assert f"/api/approvals/suggestion/{report['id']}/approve" in page and "<script>" not in report["detail"]

        base = app.base + "/api/approvals/suggestion"
        for bad in ("abc", "-1", "0", "1e3", "99999999999999999999999", "%C2%B2", "%D9%A1"):
            assert (await post(session, f"{base}/{bad}/approve", headers))[0] == 404
        assert (await post(session, f"{base}/{report['id']}/approve", {"X-CSRF-Token": "forged"}))[0] == 403
        async with aiohttp.ClientSession() as anonymous:
            assert (await post(anonymous, f"{base}/{report['id']}/approve", {}))[0] == 401
        bea = await identity.create_account(app.db, "Bea")
        await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
        other, other_headers = await signed_in(app, "bea")
        async with other:
            assert (await post(other, f"{base}/{report['id']}/approve", other_headers))[0] == 404
            assert (await post(other, f"{base}/{trip['id']}/reject", other_headers))[0] == 404

        status, answer = await post(session, f"{base}/{report['id']}/approve", headers)
        assert status == 200 and answer["message"].startswith("Done"), answer
        assert (await post(session, f"{base}/{report['id']}/approve", headers))[0] == 404  # decided already
        made = await app.db.fetchval("SELECT count(*) FROM calendar_events WHERE title = 'Write the report (1h)'")
        assert made == 1

        status, answer = await post(session, f"{base}/{trip['id']}/reject", headers)
        assert status == 200 and "will not come back" in answer["message"]
        await run_detectors(app.db, connectors, app.account_id, now)
        async with session.get(app.base + "/api/approvals") as response:
            assert [a for a in (await response.json())["approvals"] if a["kind"] == "suggestion"] == []
