"""Suggestions, not actions: the calendar's detectors and the cards they leave.

:func:`run_detectors` reads a person's coming days (:func:`snapshot`), runs each detector still
running in the quality loop's lifecycle (``core.quality.detectors``: shadow, promotable,
promoted) and records what it found in ``suggestions``, keyed by the detector's stable key:

* a detector in **shadow** records its findings as ``shadow`` rows: nothing shows;
* a **promoted** one's findings are ``open`` cards (``pepper suggestions list``, the web app's
  approvals page); a shadow row found again once its detector is promoted becomes a card;
* a finding seen before is not added again; a **dismissed** or accepted one never comes back;
  an open one a later run no longer finds (the clash was resolved) is ``gone``.

:func:`accept` runs the card's action as a tool call through the registry's gate for the
session that accepts (a session that may not run it is refused, and the card stays open);
two accepts of one card run it once. :func:`dismiss` closes it for good.

Runs happen when the calendar, todos, notes or inbound mail change (triggers mark the account in
``suggestion_runs``; the scheduler's tick runs :func:`run_changed`), and in the morning brief
(the ``suggestions`` tool).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo

from core.errors import PepperError
from core.models.types import ToolCall
from core.quality.detectors import SUGGESTERS, detector_states, ensure_detectors
from core.store.pool import connection
from core.store.queries import Queries
from core.suggestions.detect import DETECT, Snapshot, Suggestion
from core.suggestions.mail import MailItem, MailSource, mail_sources
from core.tools.areas.calendar import list_events
from core.tools.connectors import GMAIL_READONLY, Connectors
from core.tools.context import SessionContext
from core.tools.gate import Gate
from core.tools.registry import ToolContext, ToolRegistry
from core.tools.runner import run_call

log = logging.getLogger(__name__)

WINDOW = timedelta(days=14)
MAIL_SINCE = timedelta(days=14)
READS_MAIL = frozenset({"mail-event", "deadline"})  # detectors whose findings a missing mailbox can hide
RUN_LEASE = timedelta(minutes=5)
REMOTE_EVERY = timedelta(hours=1)  # how often an account with a remote calendar is looked at again
MAX_ID = 2**63 - 1


@dataclass
class RunReport:
    found: dict[str, int] = field(default_factory=dict)  # per detector
    shown: int = 0  # open cards after the run
    new: int = 0  # rows added this run
    failed: dict[str, str] = field(default_factory=dict)  # detector -> error type (fail open)
    unavailable: list[str] = field(default_factory=list)


async def snapshot(
    db: Queries,
    connectors: Connectors,
    account_id: UUID,
    now: datetime,
    *,
    window: timedelta = WINDOW,
    sources: Sequence[MailSource] | None = None,
) -> Snapshot:
    tz = ZoneInfo(await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id) or "UTC")
    end = now + window
    listing = await list_events(db, connectors, account_id, now, end, tz)
    mine = {r["value"].lower() for r in await db.fetch(
        "SELECT value FROM handles WHERE account_id = $1 AND kind = 'email'", account_id)}  # fmt: skip
    if connectors.smtp_from:
        mine.add(connectors.smtp_from.lower())
    todos = await db.fetch(
        "SELECT id, title, created_at FROM todos WHERE account_id = $1 AND done_at IS NULL ORDER BY id LIMIT 500",
        account_id,
    )
    notes = await db.fetch(
        "SELECT id, title, body FROM notes WHERE account_id = $1 AND created_at > $2 ORDER BY id DESC LIMIT 200",
        account_id,
        now - timedelta(days=30),
    )
    broken: list[str] = []
    if sources is None:
        sources, broken = await mail_sources(db, connectors, account_id)
    mail: list[MailItem] = []
    for source in sources:
        try:
            mail += await source.recent(db, account_id, now - MAIL_SINCE)
        except Exception as exc:  # one mailbox that fails leaves the others, and says so
            log.warning("mail source failed for the detectors: source=%s error=%s", source.name, type(exc).__name__)
            why = exc.message if isinstance(exc, PepperError) else "an unexpected error"
            broken.append(f"{source.name} ({why})")
    return Snapshot(account_id, tz, now, end, listing.events, listing.unavailable, frozenset(mine),
                    list(todos), list(notes), mail, mail_unavailable=broken)  # fmt: skip


async def run_detectors(
    db: Queries,
    connectors: Connectors,
    account_id: UUID,
    now: datetime,
    *,
    window: timedelta = WINDOW,
    sources: Sequence[MailSource] | None = None,
) -> RunReport:
    """Run every calendar detector still running over the person's coming ``window`` and record
    what each found (see the module's docstring). A detector that raises records nothing and
    leaves its earlier findings as they were (fail open)."""
    await ensure_detectors(db, now)
    states = await detector_states(db)
    running = {n: s for n, s in states.items() if n in SUGGESTERS and s in ("shadow", "promotable", "promoted")}
    report = RunReport()
    if not running:
        return report
    snap = await snapshot(db, connectors, account_id, now, window=window, sources=sources)
    report.unavailable = [*snap.unavailable, *snap.mail_unavailable]
    for name, state in running.items():
        try:
            found = await DETECT[name](snap, db, connectors)
        except Exception as exc:
            log.warning("calendar detector failed; nothing changed: detector=%s error=%s", name, type(exc).__name__)
            report.failed[name] = type(exc).__name__
            continue
        unique = {s.key: s for s in found}
        report.found[name] = len(unique)
        report.new += await _record(db, account_id, name, "open" if state == "promoted" else "shadow",
                                    list(unique.values()), complete=_complete(snap, name))  # fmt: skip
    report.shown = await db.fetchval(
        "SELECT count(*) FROM suggestions WHERE account_id = $1 AND state = 'open'", account_id
    )
    return report


def _complete(snap: Snapshot, detector: str) -> bool:
    """Whether the detector saw everything it reads: a calendar or, for those that read mail, a
    mailbox that could not be read is no evidence that a finding went away."""
    return not snap.unavailable and not (detector in READS_MAIL and snap.mail_unavailable)


async def _record(
    db: Queries, account_id: UUID, detector: str, state: str, found: list[Suggestion], *, complete: bool
) -> int:
    rows = [{"key": s.key, "title": s.title, "detail": s.detail, "action": s.action} for s in found]
    new = await db.fetchval(
        """
        WITH found AS (
            SELECT * FROM jsonb_to_recordset($4::jsonb) AS f(key text, title text, detail text, action jsonb)
        ), upserted AS (
            INSERT INTO suggestions (account_id, detector, key, title, detail, action, state)
            SELECT $1, $2, f.key, f.title, f.detail, f.action, $3 FROM found f
            ON CONFLICT (account_id, detector, key) DO UPDATE SET
                seen_at = now(),
                title = CASE WHEN suggestions.state IN ('shadow', 'open', 'gone') THEN EXCLUDED.title
                             ELSE suggestions.title END,
                detail = CASE WHEN suggestions.state IN ('shadow', 'open', 'gone') THEN EXCLUDED.detail
                              ELSE suggestions.detail END,
                action = CASE WHEN suggestions.state IN ('shadow', 'open', 'gone') THEN EXCLUDED.action
                              ELSE suggestions.action END,
                state = CASE WHEN suggestions.state IN ('shadow', 'gone') THEN EXCLUDED.state
                             ELSE suggestions.state END
            RETURNING (xmax = 0) AS inserted
        )
        SELECT count(*) FILTER (WHERE inserted) FROM upserted
        """,
        account_id, detector, state, json.dumps(rows),
    )  # fmt: skip
    if complete:
        # A calendar that could not be read is no evidence that a finding went away.
        await db.execute(
            "UPDATE suggestions SET state = 'gone' WHERE account_id = $1 AND detector = $2"
            " AND state IN ('shadow', 'open') AND NOT (key = ANY($3::text[]))",
            account_id, detector, [s.key for s in found],
        )  # fmt: skip
    return int(new or 0)


# --- the cards ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Card:
    id: int
    detector: str
    title: str
    detail: str
    action: dict[str, Any] | None
    state: str
    created_at: datetime
    result: str | None = None

    @property
    def does(self) -> str:
        if not self.action:
            return "nothing to run (accepting closes it)"
        if self.action["tool"] == "move_event":
            return "moves the event"
        return "adds the event to your calendar (no invitations)"


def _card(row: Any) -> Card:
    action = row["action"]
    if isinstance(action, str):
        action = json.loads(action)
    return Card(row["id"], row["detector"], row["title"], row["detail"], action, row["state"], row["created_at"],
                row["result"])  # fmt: skip


async def cards(db: Queries, account_id: UUID, *, states: Sequence[str] = ("open",), limit: int = 100) -> list[Card]:
    rows = await db.fetch(
        "SELECT * FROM suggestions WHERE account_id = $1 AND state = ANY($2::text[])"
        " ORDER BY created_at, id LIMIT $3",
        account_id, list(states), limit,
    )  # fmt: skip
    return [_card(r) for r in rows]


def parse_id(raw: object) -> int | None:
    """A card id as written by a person or a client; None when it is not one."""
    text = str(raw).strip().lstrip("#")
    if not (text.isascii() and text.isdigit()) or len(text) > 19:  # "²" is a digit to isdigit, not to int
        return None
    value = int(text)
    return value if 0 < value <= MAX_ID else None


@dataclass(frozen=True)
class Decision:
    ok: bool
    message: str


async def dismiss(db: Queries, account_id: UUID, card_id: int) -> Decision | None:
    """Close an open card for good; None when this account has no open card with that id."""
    row = await db.fetchrow(
        "UPDATE suggestions SET state = 'dismissed', decided_at = now() WHERE id = $1 AND account_id = $2"
        " AND state = 'open' RETURNING title",
        card_id, account_id,
    )  # fmt: skip
    return None if row is None else Decision(True, f"Dismissed: {row['title']}. It will not come back.")


async def accept(
    db: Queries, registry: ToolRegistry, gate: Gate, session: SessionContext, card_id: int, now: datetime
) -> Decision | None:
    """Run an open card's action as ``session`` would call the tool: through ``gate``. None when
    the session's account has no open card with that id (another account's, decided already, or
    being accepted right now). A refused or failed action leaves the card open, saying why."""
    row = await db.fetchrow(
        "UPDATE suggestions SET state = 'accepting', decided_at = now() WHERE id = $1 AND account_id = $2"
        " AND state = 'open' RETURNING *",
        card_id, session.account_id,
    )  # fmt: skip
    if row is None:
        return None
    card = _card(row)
    if not card.action:
        await _close(db, card.id, "accepted", "nothing to run")
        return Decision(True, f"Accepted: {card.title}.")
    call = ToolCall(f"suggestion-{card.id}-{uuid4().hex[:8]}", card.action["tool"], dict(card.action["arguments"]))
    try:
        async with connection(db, stateless=True) as conn:
            outcome = await run_call(registry, gate, ToolContext(session, conn, now), call)
    except Exception:
        await _close(db, card.id, "open", "the action failed")
        raise
    if not outcome.succeeded:
        why = outcome.content.strip()[:500]
        await _close(db, card.id, "open", why)
        return Decision(False, f"Not done: {why}")
    await _close(db, card.id, "accepted", outcome.content.strip()[:500])
    return Decision(True, f"Done: {outcome.content.strip()[:300]}")


async def _close(db: Queries, card_id: int, state: str, result: str) -> None:
    await db.execute(
        "UPDATE suggestions SET state = $2, result = $3, decided_at = CASE WHEN $2 = 'open' THEN NULL"
        " ELSE now() END WHERE id = $1",
        card_id, state, result,
    )  # fmt: skip


# --- runs on change ----------------------------------------------------------------------------


async def claim_changed(db: Queries, owner: str, now: datetime, limit: int = 5) -> list[UUID]:
    """Accounts whose calendar, todos, notes or inbound mail changed since their last run, or
    with a remote calendar and no run for :data:`REMOTE_EVERY`; leased to ``owner`` so two
    processes do not run one twice."""
    rows = await db.fetch(
        """
        UPDATE suggestion_runs r SET lease_owner = $1, lease_until = $2 + $3::interval
        WHERE r.account_id IN (
            SELECT account_id FROM suggestion_runs
            WHERE ((dirty_at IS NOT NULL AND (ran_at IS NULL OR dirty_at > ran_at))
                   -- a remote calendar changes without a trace here: look again every so often
                   OR (ran_at < now() - $5::interval AND (EXISTS (SELECT 1 FROM calendars c
                       WHERE c.account_id = suggestion_runs.account_id AND c.kind <> 'pepper')
                       -- so does a mailbox the detectors read (IMAP, Gmail with the read scope)
                       OR EXISTS (SELECT 1 FROM connections m WHERE m.account_id = suggestion_runs.account_id
                       AND (m.provider = 'imap' OR (m.provider = 'google' AND $6 = ANY(m.scopes)))))))
              AND (lease_until IS NULL OR lease_until < $2)
            ORDER BY dirty_at LIMIT $4 FOR UPDATE SKIP LOCKED
        )
        RETURNING r.account_id
        """,
        owner, now, RUN_LEASE, limit, REMOTE_EVERY, GMAIL_READONLY,
    )  # fmt: skip
    return [r["account_id"] for r in rows]


async def run_changed(db: Queries, connectors: Connectors, owner: str, now: datetime) -> int:
    """Run the detectors for each changed account (the scheduler's tick); returns how many ran."""
    ran = 0
    for account_id in await claim_changed(db, owner, now):
        started = await db.fetchval("SELECT now()")
        try:
            await run_detectors(db, connectors, account_id, now)
        except Exception as exc:
            log.warning("calendar detectors failed for an account: error=%s", type(exc).__name__)
        await db.execute(
            "UPDATE suggestion_runs SET ran_at = $2, lease_owner = NULL, lease_until = NULL WHERE account_id = $1",
            account_id, started,
        )  # fmt: skip
        ran += 1
    return ran
