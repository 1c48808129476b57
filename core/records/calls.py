"""Phone calls as recorded (``calls``): which line took them, who holds them, how they ended, and
what the call engine and the voice webhook record of them."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import orjson

from core.store.queries import Queries

# A call's latency broken down, as the call engine records it in the call's stats (lists of ms):
# the key and how the CLI and the web app name it.
LATENCY_PARTS: tuple[tuple[str, str], ...] = (
    ("endpointing_ms", "endpointing (the model's, as it reports it)"),
    ("model_ms", "model: speech stopped -> first audio"),
    ("relay_ms", "Pepper's relay of that audio"),
    ("response_ms", "speech stopped -> first audio sent"),
    ("tool_ms", "tools, per call"),
    ("clear_ms", "speech started -> clear (barge-in)"),
)


async def line_of(db: Queries, call_sid: str) -> str | None:
    """The number of the line the call came in on; None for an unknown call (or one with no line)."""
    return await db.fetchval("SELECT line_number FROM calls WHERE call_sid = $1", call_sid)


async def record_final_status(db: Queries, call_sid: str, status: str, *, channel: str) -> None:
    """Record that the call ended with ``status`` (a call still ringing or in progress takes it) and
    announce its ``CallSid`` on ``channel`` to the process holding it, in one statement."""
    await db.execute(
        """
        WITH ended AS (
            UPDATE calls SET ended_at = coalesce(ended_at, now()),
                             status = CASE WHEN status IN ('ringing', 'in-progress') THEN $2 ELSE status END
            WHERE call_sid = $1 RETURNING held_by
        )
        SELECT pg_notify($3, $1) FROM ended WHERE held_by IS NOT NULL
        """,
        call_sid,
        status,
        channel,
    )


async def hold_calls(db: Queries, holder: int, call_sids: list[str]) -> None:
    """Record the calls (those not fully recorded yet) as held by the session ``holder``."""
    await db.execute(
        "UPDATE calls SET held_by = $1 WHERE call_sid = ANY($2::text[]) AND summary IS NULL"
        " AND held_by IS DISTINCT FROM $1",
        holder,
        call_sids,
    )


async def ended_among(db: Queries, call_sids: list[str]) -> list[str]:
    """Those of the calls whose end is recorded."""
    rows = await db.fetch(
        "SELECT call_sid FROM calls WHERE call_sid = ANY($1::text[]) AND ended_at IS NOT NULL", call_sids
    )
    return [r["call_sid"] for r in rows]


async def orphaned(db: Queries) -> list[tuple[str, int]]:
    """``(call_sid, held_by)`` of calls not fully recorded whose holding session is gone."""
    rows = await db.fetch(
        """
        SELECT call_sid, held_by FROM calls WHERE held_by IS NOT NULL AND summary IS NULL
          AND held_by NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        """
    )
    return [(r["call_sid"], r["held_by"]) for r in rows]


async def end_orphans(db: Queries, orphans: list[tuple[str, int]], *, reason: str, holder: int | None) -> list[Any]:
    """Record the end of those ``orphans`` (``(call_sid, held_by)``) still orphaned, and claim them
    for ``holder``: one statement, so of several processes sweeping at once one ends each. Returns
    the rows ended (``call_sid``, ``turn_id``)."""
    return await db.fetch(
        """
        UPDATE calls SET status = 'completed', ended_at = coalesce(ended_at, now()),
                         end_reason = coalesce(end_reason, $1), held_by = $4
        WHERE (call_sid, held_by) IN (SELECT * FROM unnest($2::text[], $3::int[])) AND summary IS NULL
          AND held_by NOT IN (SELECT pid FROM pg_stat_activity WHERE pid IS NOT NULL)
        RETURNING call_sid, turn_id
        """,
        reason,
        [sid for sid, _ in orphans],
        [pid for _, pid in orphans],
        holder,
    )


async def summarize_if_missing(db: Queries, call_sid: str, summary: str) -> None:
    """Set the call's summary unless it has one (a call with a summary is fully recorded)."""
    await db.execute("UPDATE calls SET summary = coalesce(summary, $2) WHERE call_sid = $1", call_sid, summary)


# --- The voice webhook --------------------------------------------------------------------------


async def record_call(
    db: Queries,
    call_sid: str,
    *,
    account_id: UUID | None,
    line_number: str | None,
    caller: str | None,
    handle_id: UUID | None,
    route: str,
    attested: bool,
    answered_route: str = "owner",
) -> bool:
    """A new call, ``ringing`` when ``route`` is the one that answers (``answered_route``: the
    owner's, or the answering service's), else ``refused``; False when it was recorded already (a
    retried webhook)."""
    inserted = await db.fetchval(
        """
        INSERT INTO calls (call_sid, account_id, line_number, caller, handle_id, route, status, attested)
        VALUES ($1, $2, $3, $4, $5, $6, CASE WHEN $6 = $8 THEN 'ringing' ELSE 'refused' END, $7)
        ON CONFLICT (call_sid) DO NOTHING RETURNING true
        """,
        call_sid,
        account_id,
        line_number,
        caller,
        handle_id,
        route,
        attested,
        answered_route,
    )
    return bool(inserted)


async def call_account(db: Queries, call_sid: str) -> UUID | None:
    """The account a call was for (None for an unknown call)."""
    return await db.fetchval("SELECT account_id FROM calls WHERE call_sid = $1", call_sid)


async def call_state(db: Queries, call_sid: str) -> Any:
    """The call's ``route``, ``status`` and ``ended_at``, or None."""
    return await db.fetchrow("SELECT route, status, ended_at FROM calls WHERE call_sid = $1", call_sid)


async def stream_end(db: Queries, call_sid: str) -> tuple[str | None, bool]:
    """The call's end reason, and whether a media process held it with no end written: its
    socket closed without Pepper ending the call (the process holding it died)."""
    row = await db.fetchrow("SELECT end_reason, held_by, ended_at FROM calls WHERE call_sid = $1", call_sid)
    if row is None:
        return None, False
    return row["end_reason"], row["held_by"] is not None and row["end_reason"] is None and row["ended_at"] is None


# --- The media socket ---------------------------------------------------------------------------


async def call_for_stream(db: Queries, call_sid: str) -> Any:
    """What admitting a media stream needs of its call, or None."""
    return await db.fetchrow(
        "SELECT account_id, handle_id, caller, line_number, route, attested, status, ended_at FROM calls"
        " WHERE call_sid = $1",
        call_sid,
    )


async def line_engine(db: Queries, line_number: str) -> str | None:
    """The voice engine a phone line names, or None for the default one."""
    return await db.fetchval("SELECT voice_engine FROM phone_lines WHERE number = $1", line_number)


async def line_transport(db: Queries, line_number: str) -> str | None:
    """How calls reach a phone line's voice model (``media-streams``, ``sip``), or None for the default."""
    return await db.fetchval("SELECT voice_transport FROM phone_lines WHERE number = $1", line_number)


# --- A call under way ---------------------------------------------------------------------------


async def account_timezone(db: Queries, account_id: UUID) -> str:
    return await db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id)


async def call_started(db: Queries, call_sid: str, turn_id: UUID, holder: int | None) -> None:
    await db.execute(
        "UPDATE calls SET status = 'in-progress', turn_id = $2, held_by = $3 WHERE call_sid = $1",
        call_sid,
        turn_id,
        holder,
    )


async def store_end_reason(db: Queries, call_sid: str, reason: str | None) -> None:
    await db.execute("UPDATE calls SET end_reason = $2 WHERE call_sid = $1", call_sid, reason)


async def call_completed(
    db: Queries, call_sid: str, *, reason: str | None, summary: str, verified_by: str | None, stats: dict[str, Any]
) -> None:
    await db.execute(
        """
        UPDATE calls SET status = 'completed', ended_at = now(), end_reason = $2, summary = $3,
                         verified_by = $4, stats = $5::jsonb
        WHERE call_sid = $1
        """,
        call_sid,
        reason,
        summary,
        verified_by,
        json.dumps(stats),
    )


async def call_message_ids(db: Queries, conversation_id: UUID, turn_id: UUID | None, call_sid: str) -> list[Any]:
    """The messages of this call in the person's conversation: its turn's, and the caller's lines."""
    rows = await db.fetch(
        "SELECT id FROM messages WHERE conversation_id = $1 AND (turn_id = $2 OR provider_message_id LIKE $3)",
        conversation_id,
        turn_id,
        f"{call_sid}:%",
    )
    return [r["id"] for r in rows]


async def set_verstat(db: Queries, call_sid: str, verstat: str) -> None:
    """Twilio's ``StirVerstat`` for the call, as it came."""
    await db.execute("UPDATE calls SET stir_verstat = $2 WHERE call_sid = $1", call_sid, verstat[:80])


async def verstat(db: Queries, call_sid: str) -> str | None:
    return await db.fetchval("SELECT stir_verstat FROM calls WHERE call_sid = $1", call_sid)


async def claim_sip_webhook(db: Queries, webhook_id: str, session_id: str) -> bool:
    """Record a SIP direct webhook (``voice.sip``) by its ``webhook-id``; False when it was acted
    on already (a redelivery)."""
    inserted = await db.fetchval(
        "INSERT INTO sip_webhooks (webhook_id, session_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING true",
        webhook_id,
        session_id,
    )
    return bool(inserted)


# --- Recordings for replay (voice.call_tape) ----------------------------------------------------


def recording_chunk(entries: list[list[Any]]) -> bytes:
    """A chunk's entries as stored: orjson and zlib level 1 (written mid-call, for every call, on
    the core that relays the audio)."""
    return zlib.compress(orjson.dumps(entries, option=orjson.OPT_NON_STR_KEYS), 1)


async def store_recording(
    db: Queries, call_sid: str, account_id: UUID | None, seq: int, entries: list[list[Any]], *, final: bool,
    stream_sid: str = "",
) -> None:  # fmt: skip
    """One chunk of one media stream's recording (written once: a retried chunk changes nothing)."""
    await store_recordings(db, [(call_sid, stream_sid, seq, account_id, recording_chunk(entries), final)])


Chunk = tuple[str, str, int, UUID | None, bytes, bool]  # call_sid, stream_sid, seq, account_id, chunk, final


async def store_recordings(db: Queries, chunks: list[Chunk]) -> None:
    """Chunks of any calls' recordings in one statement: ``(call_sid, stream_sid, seq, account_id,
    chunk, final)`` with ``chunk`` from :func:`recording_chunk`; each written once, as above."""
    await db.execute(
        "INSERT INTO call_recordings (call_sid, stream_sid, seq, account_id, entries, final)"
        " SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::uuid[], $5::bytea[], $6::boolean[])"
        " ON CONFLICT (call_sid, stream_sid, seq) DO NOTHING",
        [c[0] for c in chunks],
        [c[1] for c in chunks],
        [c[2] for c in chunks],
        [c[3] for c in chunks],
        [c[4] for c in chunks],
        [c[5] for c in chunks],
    )


@dataclass(frozen=True)
class StreamRecording:
    """One media stream's recorded entries, in order, and whether the recording is complete (its
    final chunk is there and no chunk before it is missing; else what came before the gap)."""

    stream_sid: str
    entries: list[list[Any]]
    complete: bool


async def load_recordings(db: Queries, call_sid: str) -> list[StreamRecording]:
    """A call's recordings, one per media stream it ran on, in the order the streams began."""
    rows = await db.fetch(
        "SELECT stream_sid, seq, entries, final, min(written_at) OVER (PARTITION BY stream_sid) AS began"
        " FROM call_recordings WHERE call_sid = $1 ORDER BY began, stream_sid, seq",
        call_sid,
    )
    streams: list[StreamRecording] = []
    for stream_sid in dict.fromkeys(row["stream_sid"] for row in rows):
        entries: list[list[Any]] = []
        complete = False
        for expected, row in enumerate(r for r in rows if r["stream_sid"] == stream_sid):
            if row["seq"] != expected:
                complete = False  # a chunk is missing: what came before it is readable
                break
            entries.extend(json.loads(zlib.decompress(row["entries"])))
            complete = bool(row["final"])
        streams.append(StreamRecording(stream_sid, entries, complete))
    return streams


async def load_recording(db: Queries, call_sid: str) -> tuple[list[list[Any]], bool] | None:
    """The call's first stream's recording (entries, complete); None when the call has none."""
    streams = await load_recordings(db, call_sid)
    return (streams[0].entries, streams[0].complete) if streams else None


async def recorded_call_of(db: Queries, call: str) -> str | None:
    """The CallSid of ``call``: a CallSid, or the id of the call's turn."""
    return await db.fetchval(
        "SELECT call_sid FROM calls WHERE call_sid = $1 OR turn_id::text = $1"
        " UNION SELECT call_sid FROM call_recordings WHERE call_sid = $1 LIMIT 1",
        call,
    )


async def call_row(db: Queries, call: str) -> Any:
    """One call's row by its CallSid or its turn id, or None."""
    return await db.fetchrow(
        "SELECT call_sid, route, status, line_number, verified_by, end_reason, summary, stats, turn_id,"
        " started_at, ended_at FROM calls WHERE call_sid = $1 OR turn_id::text = $1 LIMIT 1",
        call,
    )
