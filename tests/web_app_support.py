"""A running Pepper for the web app's tests: Ada signed up with a verified email address and Bob
as a contact, a loopback model and a loopback SMTP server for Pepper's own mail."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from core import access, identity
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.testing.smtp_peer import SmtpPeer
from gateway.server import running_app
from gateway.web_api import run_owner_tool

PASSWORD = "correct horse battery"
ADA_EMAIL = "ada@example.com"
BOB_EMAIL = "bob@example.org"


@dataclass
class WebApp:
    db: Database
    model: OpenAIPeer
    smtp: SmtpPeer
    base: str
    account_id: Any
    services: Any  # gateway.services.Services

    async def draft(self, body: str, *, held: bool = False) -> int:
        """A draft of Pepper's mail to Bob, saved by the email tool through the gate as a
        turn's call saves it (the email tools live behind skills, so no scripted turn reaches
        them directly); ``held``: as a scheduled run leaves a send it could not make."""
        outcome = await run_owner_tool(
            self.services, self.account_id, "email_from_pepper",
            {"to": [BOB_EMAIL], "subject": "Friday", "body": body, "mode": "draft"},
        )  # fmt: skip
        assert outcome.status == "ok", outcome.content
        draft_id = await self.db.fetchval("SELECT max(id) FROM email_messages WHERE body = $1", body)
        if held:
            turn_id = await self.db.fetchval(
                "INSERT INTO turns (conversation_id, kind, channel, status) SELECT id, 'scheduled', 'web', 'delivered'"
                " FROM conversations WHERE account_id = $1 RETURNING id",
                self.account_id,
            )
            await self.db.execute("UPDATE email_messages SET turn_id = $2 WHERE id = $1", draft_id, turn_id)
        return draft_id


@asynccontextmanager
async def web_app(db: Database, db_url: str) -> AsyncIterator[WebApp]:
    ada = await identity.create_account(db, "Ada")
    await access.set_web_password(db, ada.id, "ada", PASSWORD)
    await identity.add_handle(db, ada.id, "email", ADA_EMAIL, verified=True)
    await db.execute("INSERT INTO contacts (account_id, name, emails) VALUES ($1, 'Bob', $2)", ada.id, [BOB_EMAIL])
    async with OpenAIPeer() as model, SmtpPeer() as smtp:
        settings = Settings(
            database_url=db_url, openai_api_key="sk-test", openai_base_url=model.base_url, port=0,
            smtp_host="127.0.0.1", smtp_port=smtp.port, smtp_security="none", smtp_from="pepper@p.test",
        )  # fmt: skip
        async with running_app(settings, db) as (app, port):
            yield WebApp(db, model, smtp, f"http://127.0.0.1:{port}", ada.id, app.extensions["pepper"])


async def some_records(app: WebApp) -> None:
    """A call with its transcript and tool calls, and a scheduled task, for the pages to show."""
    db = app.db
    turn = await db.fetchval(
        "INSERT INTO turns (conversation_id, kind, channel, status, rounds, tool_calls, usage)"
        " SELECT id, 'call', 'voice', 'delivered', $2::jsonb, $3::jsonb,"
        " '{\"input_tokens\": 1200, \"output_tokens\": 80}' FROM conversations WHERE account_id = $1"
        " RETURNING id",
        app.account_id,
        json.dumps([{"at_ms": 900, "role": "caller", "text": "Add milk to my list"},
                    {"at_ms": 1700, "role": "pepper", "text": "Milk is on your list."}]),
        json.dumps([{"name": "add_todo", "status": "ok", "arguments": {"title": "milk"}}]),
    )  # fmt: skip
    await db.execute(
        "INSERT INTO calls (call_sid, account_id, route, status, turn_id, caller, stats)"
        " VALUES ('CAweb1', $1, 'owner', 'completed', $2, '+15550100', $3::jsonb)",
        app.account_id,
        turn,
        json.dumps(
            {
                "response_ms": [420.0, 510.0, 880.0],
                "model_ms": [400.0, 500.0, 870.0],
                "relay_ms": [0.2, 0.3, 0.4],
                "endpointing_ms": [520.0, 540.0],
                "barge_ins": 1,
            }
        ),
    )
    now = datetime.now(UTC)
    async with db.transaction() as conn:
        await create_task(
            conn, app.account_id, title="Brief me", prompt="brief",
            schedule=parse_schedule("every day at 07:30", now=now, timezone="UTC"), now=now,
        )  # fmt: skip
