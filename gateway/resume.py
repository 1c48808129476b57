"""Answer the messages a crash left unanswered.

A webhook is acknowledged as soon as its message is recorded (``handling = 'queued'``); the turn
runs afterwards. If the process dies in between, the message would wait forever. At start-up
every process picks such messages up again; the claim in ``core.conversation.claim_for_turn``
makes sure that, with several processes, each message is still answered once.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta

from gateway.email_channel import InboundMail
from gateway.email_channel import run_and_reply as run_email
from gateway.messaging import Inbound, run_and_reply
from gateway.services import Services
from gateway.webchat import run_web_turn

log = logging.getLogger(__name__)

# A turn never runs this long: a message still "running" after it was left by a dead process.
STALE_RUNNING = timedelta(minutes=10)
# Past this, an answer would only confuse: the message is marked expired instead.
RESUME_WINDOW = timedelta(hours=1)


async def resume_unanswered(services: Services, *, window: timedelta = RESUME_WINDOW) -> int:
    """Start the turns of messages left queued (or stuck running) by a crash; return how many."""
    db = services.db
    async with db.transaction() as conn:
        await conn.execute(
            """
            UPDATE messages SET handling = 'expired'
            WHERE handling IN ('queued', 'running') AND created_at < now() - $1::interval
            """,
            window,
        )
        await conn.execute(
            """
            UPDATE messages SET handling = 'queued'
            WHERE handling = 'running' AND created_at < now() - $1::interval
            """,
            STALE_RUNNING,
        )
    rows = await db.fetch(
        """
        SELECT m.id, m.channel, m.body, m.handle_id, m.meta, m.provider_message_id, c.account_id
        FROM messages m JOIN conversations c ON c.id = m.conversation_id
        WHERE m.handling = 'queued' AND m.direction = 'inbound'
        ORDER BY m.id
        """
    )
    started = 0
    for row in rows:
        meta = row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"] or "{}")
        if row["channel"] in ("sms", "whatsapp") and meta.get("from") and meta.get("to") and row["handle_id"]:
            inbound = Inbound(row["channel"], row["provider_message_id"], meta["from"], meta["to"], row["body"], None)
            job = run_and_reply(services, inbound, row["account_id"], row["handle_id"], row["id"])
        elif row["channel"] == "email" and meta.get("message_id") and row["handle_id"]:
            fields = {**meta, "references": tuple(meta.get("references", ())),
                      "attachments": tuple(meta.get("attachments", ()))}  # fmt: skip
            job = run_email(services, InboundMail(**fields), row["account_id"], row["handle_id"], row["id"])
        elif row["channel"] == "web":
            job = run_web_turn(services, row["account_id"], row["body"], row["id"])
        else:
            continue
        services.tasks.spawn(f"resume-{row['channel']}-{row['id']}", job)
        started += 1
    if started:
        log.info("resuming %s message(s) left unanswered by an earlier stop", started)
    return started
