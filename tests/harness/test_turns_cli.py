"""``pepper turns list`` and ``pepper turns show`` over turns the harness really ran."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest
from cli_support import run_cli

from core.errors import InvalidInput
from core.identity import create_account
from core.testing.scripted import calls, reply
from core.tools.gate import Policy, Verdict, default_gate
from gateway.cli_turns import parse_since
from text_loop import deliver, run_turn


@pytest.fixture
def pepper(db_url, monkeypatch, capsys):
    """Run ``pepper ARGS`` as the operator does (``main``: one-line errors, exit status), in a thread
    of its own since ``main`` runs its own event loop."""
    monkeypatch.setenv("DATABASE_URL", db_url)

    async def run(*argv: str) -> tuple[int, str, str]:
        return await asyncio.to_thread(run_cli, monkeypatch, capsys, *argv)

    return run


async def _turns(db, deps, models, account):
    """Four turns of Ada's (Europe/Paris) and one of Bob's, each differing in one way a filter sees."""
    bob = await create_account(db, "Bob", timezone="UTC")
    # A note as a stranger could have written it: its escape sequence must not reach the terminal.
    await db.execute("INSERT INTO notes (account_id, body) VALUES ($1, 'mum: 3 May \x1b[31m')", account.id)
    call, flowers = [
        await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, $2) RETURNING id", account.id, title)
        for title in ("call mum", "buy flowers")
    ]
    models.script(
        calls(("search_notes", {"query": "mum"})),
        calls(("add_note", {"text": "gift for mum"}), ("complete_todo", {"id": call})),
        reply("Her birthday is 3 May; I noted the gift."),
    )
    kept = await run_turn(deps, account.id, "web", "when is mum's birthday? note a gift")
    await deliver(deps, kept.turn_id, True)

    models.script(calls(("complete_todo", {"id": flowers})), reply("Ticked off: buy flowers."))
    dropped = await run_turn(deps, account.id, "whatsapp", "remind me to buy flowers")
    await deliver(deps, dropped.turn_id, False)

    models.script(calls(("current_time", {})), reply(""), reply("It is half past two."))
    recovered = await run_turn(deps, account.id, "web", "what time is it?", kind="scheduled")

    deps.config = replace(deps.config, round_caps={"live": 1})
    models.script(calls(("current_time", {})), reply("I ran out of rounds; it is 14:30."))
    capped = await run_turn(deps, account.id, "web", "time, then more")

    models.script(reply("Hi Bob."))
    old = await run_turn(deps, bob.id, "web", "hi")
    await db.execute("UPDATE turns SET started_at = now() - interval '3 days' WHERE id = $1", old.turn_id)
    return kept.turn_id, dropped.turn_id, recovered.turn_id, capped.turn_id, old.turn_id


def _ids(out: str) -> list[str]:
    return [line.split()[0] for line in out.splitlines()[1:]]


async def test_turns_list_filters_by_account_channel_kind_since_and_flags(db, deps, models, account, pepper):
    recorded = await _turns(db, deps, models, account)
    kept, dropped, recovered, capped, old = (str(t) for t in recorded)

    code, out, _ = await pepper("turns", "list")
    assert code == 0 and _ids(out) == [capped, recovered, dropped, kept, old]  # newest first
    header, *lines = out.splitlines()
    assert header.split()[:3] == ["turn", "time", "account"]
    line = {row.split()[0]: row for row in lines}
    started = await db.fetchval("SELECT started_at FROM turns WHERE id = $1", recorded[0])
    assert f"{started.astimezone(ZoneInfo('Europe/Paris')):%Y-%m-%d %H:%M %Z}" in line[kept]
    assert "Ada" in line[kept] and " live " in line[kept] and "gpt-small" in line[kept]
    assert line[kept].split()[-3:] == ["3", "30/15", "-"]  # three rounds, tokens in/out, no flag
    assert line[dropped].endswith("undelivered, writes-dropped")
    assert line[recovered].endswith("recovered") and " scheduled " in line[recovered]
    assert line[capped].endswith("capped")
    assert " UTC " in line[old] and "Bob" in line[old]

    assert _ids((await pepper("turns", "list", "--account", "Bob"))[1]) == [old]
    assert _ids((await pepper("turns", "list", "--channel", "whatsapp"))[1]) == [dropped]
    assert _ids((await pepper("turns", "list", "--kind", "scheduled"))[1]) == [recovered]
    assert _ids((await pepper("turns", "list", "--flagged"))[1]) == [capped, recovered, dropped]
    assert _ids((await pepper("turns", "list", "--since", "2d"))[1]) == [capped, recovered, dropped, kept]
    assert _ids((await pepper("turns", "list", "--since", "4d"))[1])[-1] == old
    two_days_ago = await db.fetchval("SELECT (now() - interval '2 days')::date::text")
    assert old not in _ids((await pepper("turns", "list", "--since", two_days_ago, "--account", "Bob"))[1])
    assert _ids((await pepper("turns", "list", "--limit", "2"))[1]) == [capped, recovered]
    assert (await pepper("turns", "list", "--account", "Ada", "--channel", "sms"))[1] == "no turns"


async def test_turns_show_prints_prompt_rounds_calls_reply_and_writes(db, deps, models, account, pepper):
    kept, dropped, _, capped, _ = await _turns(db, deps, models, account)

    code, out, _ = await pepper("turns", "show", str(kept))
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == f"turn {kept}"
    assert "account Ada  channel web  kind live  status delivered" in out
    assert "tokens 30 in / 15 out" in out and "flags: none" in out
    stable = await db.fetchval("SELECT length(turn_prompt(t)->>'system_stable') FROM turns t WHERE id = $1", kept)
    assert f"stable prefix: {stable} characters;" in out
    assert "newest message:" in out and "when is mum's birthday? note a gift" in out
    assert "round 1 turn: gpt-small  tokens 10 in / 5 out  (tier small)" in out
    assert 'call search_notes {"query": "mum"} -> ok' in out
    assert "mum: 3 May \\x1b[31m" in out and "\x1b" not in out  # as recorded, escapes made visible
    assert 'call add_note {"text": "gift for mum"} -> ok' in out
    assert "round 3 turn:" in out and "reply:\n  Her birthday is 3 May; I noted the gift." in out
    write = await db.fetchrow("SELECT id, summary FROM staged_writes WHERE turn_id = $1", kept)
    todo = await db.fetchval("SELECT id FROM todos WHERE title = 'call mum'")
    assert f'call complete_todo {{"id": {todo}}} -> ok' in out and f"todo #{todo}" in write["summary"]
    assert out.splitlines()[-2:] == ["writes:", f"  committed #{write['id']} complete_todo: {write['summary']}"]

    out = (await pepper("turns", "show", str(dropped)))[1]
    assert "status failed" in out and "flags: undelivered, writes-dropped" in out
    assert 'delivery: {"dropped": 1, "ok": false}' in out
    assert out.splitlines()[-1].startswith("  dropped   #") and "complete_todo: " in out.splitlines()[-1]

    out = (await pepper("turns", "show", str(capped)))[1]
    assert "round 2 final:" in out and "(tier small, not counted, cap: rounds)" in out
    assert "flags: capped" in out and out.splitlines()[-1] == "  none staged"

    # A prompt part the record names but the store lost is named as missing, not shown as empty.
    await db.execute("DELETE FROM prompt_parts WHERE hash = (SELECT prompt_prefix FROM turns WHERE id = $1)", kept)
    out = (await pepper("turns", "show", str(kept)))[1]
    assert "  stable prefix: missing from prompt_parts; " in out and " tools offered" in out


async def test_turns_flags_a_failed_a_repaired_and_a_refused_turn(db, deps, models, account, pepper):
    models.script(RuntimeError("the model adapter broke"))
    with pytest.raises(RuntimeError):
        await run_turn(deps, account.id, "web", "hello?")
    failed = await db.fetchval("SELECT id FROM turns ORDER BY started_at DESC LIMIT 1")

    original = "Your train probably leaves at 9:40. Your train probably leaves at 9:40. Bring the blue ticket."
    models.script(reply(original), reply("Your train probably leaves at 9:40. Bring the blue ticket."))
    repaired = (await run_turn(deps, account.id, "sms", "when is my train?")).turn_id

    no_notes = Policy(
        "no-notes", lambda tool, a, s: Verdict.deny("notes are off") if tool.area == "notes" else Verdict.allow()
    )
    deps.gate = default_gate().with_policy(no_notes)
    models.script(calls(("add_note", {"text": "x"})), reply("I could not save that."))
    refused = (await run_turn(deps, account.id, "web", "note x")).turn_id

    line = {row.split()[0]: row for row in (await pepper("turns", "list", "--flagged"))[1].splitlines()[1:]}
    assert line[str(failed)].endswith("  failed")
    assert line[str(repaired)].endswith("  repaired") and " sms " in line[str(repaired)]
    assert line[str(refused)].endswith("  denied")
    out = (await pepper("turns", "show", str(failed)))[1]
    assert "status failed" in out and "flags: failed" in out and "error: RuntimeError" in out
    out = (await pepper("turns", "show", str(repaired)))[1]
    assert "round 2 repair: changed (accepted)" in out
    assert "reply:\n  Your train probably leaves at 9:40. Bring the blue ticket.\nwrites:" in out
    out = (await pepper("turns", "show", str(refused)))[1]
    assert 'call add_note {"text": "x"} -> denied' in out and "gate no-notes: deny: notes are off" in out


async def test_turns_mistakes_are_one_line_errors(db, pepper, capsys):
    unknown = uuid4()
    for argv, message in [
        (("turns", "show", "not-a-uuid"), "pepper: error: not a turn id: 'not-a-uuid'"),
        (("turns", "show", str(unknown)), f"pepper: error: no turn {unknown}"),
        (("turns", "list", "--since", "yesterday"), "pepper: error: not a time for --since: 'yesterday'"),
        (("turns", "list", "--account", "Nobody"), "pepper: error: no account Nobody"),
        (("turns", "list", "--limit", "0"), "pepper: error: --limit must be at least 1"),
    ]:
        code, out, err = await pepper(*argv)
        assert code == 1 and out == "" and err.startswith(message) and err.count("\n") == 1, (argv, err)
    with pytest.raises(SystemExit) as usage:  # argparse's mistakes end the process, also one line
        await pepper("turns", "list", "--channel", "fax")
    err = capsys.readouterr().err
    assert usage.value.code == 1 and err.startswith("pepper: error: argument --channel: invalid choice 'fax'")


def test_since_reads_relative_spans_and_iso_times_in_the_accounts_zone():
    now = datetime(2025, 6, 2, 12, 0, tzinfo=UTC)
    assert parse_since("90m", now=now, timezone="UTC") == now - timedelta(minutes=90)
    assert parse_since("2h", now=now, timezone="UTC") == now - timedelta(hours=2)
    assert parse_since("3d", now=now, timezone="UTC") == now - timedelta(days=3)
    assert parse_since("1w", now=now, timezone="UTC") == now - timedelta(weeks=1)
    # Paris is two hours ahead in June: its 09:00 and its midnight, in UTC.
    assert parse_since("2025-06-02T09:00", now=now, timezone="Europe/Paris") == datetime(2025, 6, 2, 7, 0, tzinfo=UTC)
    assert parse_since("2025-06-02", now=now, timezone="Europe/Paris") == datetime(2025, 6, 1, 22, 0, tzinfo=UTC)
    assert parse_since("2025-06-02 09:00+00:00", now=now, timezone="Europe/Paris") == datetime(
        2025, 6, 2, 9, 0, tzinfo=UTC
    )
    for bad in ("yesterday", "2h ago", "-2h", "2025-13-01", ""):
        with pytest.raises(InvalidInput, match="not a time for --since"):
            parse_since(bad, now=now, timezone="UTC")
