"""The web app's pages and endpoints over a real socket: the home, the shared look, the reply
streaming with the working indicator, draft cards, the approvals queue, run-now and the dossier;
every endpoint with garbage, a forgery (no session, a bad CSRF token, another account's id) and a
duplicate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from uuid import uuid4

import aiohttp
import pytest
from web_app_support import BOB_EMAIL, PASSWORD, WebApp, some_records, web_app

from core import access, identity
from core.scheduling.schedule import parse_schedule
from core.scheduling.tasks import create_task
from core.store import Database
from core.testing.peers import reply_text, reply_tools
from gateway.markdown import to_html

PAGES = ("/", "/approvals", "/calls", "/tasks", "/rooms", "/dossier", "/plots", "/settings")


@pytest.fixture
async def app(db: Database, db_url: str) -> AsyncIterator[WebApp]:
    async with web_app(db, db_url) as running:
        yield running


async def signed_in(app: WebApp, login: str = "ada") -> tuple[aiohttp.ClientSession, dict[str, str]]:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.post(app.base + "/chat/login", data={"login": login, "password": PASSWORD}):
        pass
    async with session.get(app.base + "/api/session") as response:
        csrf = (await response.json())["csrf_token"]
    return session, {"X-CSRF-Token": csrf}


async def post(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str], body: object = None
) -> tuple[int, dict]:
    data = body if isinstance(body, (bytes, str)) else json.dumps(body if body is not None else {})
    async with session.post(url, data=data, headers={"Content-Type": "application/json", **headers}) as response:
        try:
            return response.status, await response.json()
        except (aiohttp.ContentTypeError, ValueError):
            return response.status, {}


async def until(predicate, within: float = 15.0):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + within
    while not (value := await predicate()):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("never happened")
        await asyncio.sleep(0.05)
    return value


async def a_draft(app: WebApp, session: aiohttp.ClientSession, body: str, *, held: bool = False) -> dict:
    """A draft saved by the email tool; the chat lists its card."""
    draft_id = await app.draft(body, held=held)
    async with session.get(app.base + "/api/drafts") as response:
        drafts = (await response.json())["drafts"]
    return next(d for d in drafts if d["id"] == str(draft_id))


async def test_home_is_the_sign_in_or_the_chat_and_every_page_shares_one_look(app: WebApp):
    await some_records(app)
    await app.db.execute(
        "INSERT INTO answering_calls (call_sid, account_id, caller, transcript, summary)"
        " VALUES ('CAans1', $1, '+15550111', $2::jsonb, 'left a message')",
        app.account_id,
        json.dumps([{"role": "caller", "text": "<b>Hi</b>, it's Carol"}]),
    )
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(app.base + "/") as response:
            page = await response.text()
            assert response.status == 200 and 'id="signin"' in page and "/static/app.css" in page
        for path in PAGES[1:]:
            async with anonymous.get(app.base + path, allow_redirects=False) as response:
                assert response.status == 302 and response.headers["Location"] == "/", path
        async with anonymous.get(app.base + "/connect/google?area=gmail") as response:
            assert response.status == 401 and "/static/app.css" in await response.text()
        async with anonymous.get(app.base + "/static/../webchat.py") as response:
            assert response.status == 404
        async with anonymous.get(app.base + "/static/vendor/uPlot.iife.min.js") as response:
            assert response.status == 200 and "javascript" in response.headers["Content-Type"]
    bea = await identity.create_account(app.db, "Bea")
    await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
    other, _ = await signed_in(app, "bea")
    async with other:  # another account's call is not found
        for path in ("/calls/CAweb1", "/answering/calls/CAans1"):
            async with other.get(app.base + path) as response:
                assert response.status == 404, path
        async with other.get(app.base + "/calls") as response:
            assert "CAweb1" not in await response.text()
    # The nightly judge graded Ada's call turn; a grade of another account's stays off her plot.
    turn = await app.db.fetchval("SELECT turn_id FROM calls WHERE call_sid = 'CAweb1'")
    grades = [("honesty", "fail", app.account_id), ("tool_choice", "pass", app.account_id),
              ("tone", "n/a", app.account_id), ("safety", "fail", bea.id)]  # fmt: skip
    for point, grade, who in grades:
        await app.db.execute(
            "INSERT INTO quality_grades (turn_id, point, grade, reason, account_id, model, tier)"
            " VALUES ($1, $2, $3, 'why', $4, 'gpt-5-mini', 'small')",
            turn, point, grade, who,
        )  # fmt: skip
    session, _ = await signed_in(app)
    async with session:
        for path in PAGES:
            async with session.get(app.base + path) as response:
                page = await response.text()
                assert response.status == 200, path
                assert "/static/app.css" in page and 'aria-label="Pages"' in page, path
                assert "script-src 'self';" in response.headers["Content-Security-Policy"]
                assert response.headers["Cache-Control"] == "no-store"
        async with session.get(app.base + "/plots") as response:
            figures = (await response.text()).split('id="figures">')[1].split("</script>")[0]
        [day] = json.loads(figures)["latency"]
        assert (day["count"], day["p50"], round(day["p99"])) == (3, 510.0, 873)
        assert json.loads(figures)["usage"][0]["input_tokens"] == 1200
        graded = json.loads(figures)["grades"]
        assert graded["points"][:2] == ["tool_choice", "tool_arguments"]
        [model] = graded["models"]
        rates = dict(zip(graded["points"], model["pass_rate"], strict=True))
        assert model["model"] == "small/gpt-5-mini"
        assert (rates["tool_choice"], rates["honesty"], rates["tone"], rates["safety"]) == (100.0, 0.0, None, None)
        async with session.get(app.base + "/calls/CAweb1") as response:
            page = await response.text()
            assert "Add milk to my list" in page and "Milk is on your list." in page and "Add todo" in page
            assert "median 510 ms" in page
            breakdown = page.split('id="latency-breakdown"')[1].split("</table>")[0]
            assert '<tr data-part="model_ms"><td>model: speech stopped -&gt; first audio</td><td>3</td>' in breakdown
            assert "<td>530.0</td><td>540.0</td>" in breakdown  # endpointing: median, max
            assert 'data-part="tool_ms"' not in breakdown  # no tool ran: no row
        async with session.get(app.base + "/answering/calls/CAans1") as response:
            page = await response.text()
            assert response.status == 200 and "/static/app.css" in page
            assert "&lt;b&gt;Hi&lt;/b&gt;, it&#39;s Carol" in page and "left a message" in page
        for path in (
            "/calls/CAnope",
            "/calls/%00",
            "/calls/" + "A" * 65,
            "/answering/calls/%00",
            "/answering/calls/x%27",
        ):
            async with session.get(app.base + path) as response:
                assert response.status == 404, path
        async with session.get(app.base + "/") as response:
            page = await response.text()
            assert 'id="call-button"' in page and "Up to 8000 characters" in page


async def test_an_answering_message_shows_what_twilio_said_of_the_caller(app: WebApp):
    db = app.db
    for sid, line_type, name, verstat in (("CAlook1", "mobile", "<i>ACME</i> Dental", "TN-Validation-Passed-B"),
                                          ("CAlook2", None, None, None)):  # fmt: skip
        await db.execute(
            "INSERT INTO calls (call_sid, account_id, route, status, stir_verstat) VALUES ($1, $2, 'answering',"
            " 'completed', $3)", sid, app.account_id, verstat,
        )  # fmt: skip
        await db.execute(
            "INSERT INTO answering_calls (call_sid, account_id, caller, summary, line_type, caller_name_lookup)"
            " VALUES ($1, $2, '+15550111', 'left a message', $3, $4)", sid, app.account_id, line_type, name,
        )  # fmt: skip
        await db.execute(
            "INSERT INTO answering_messages (call_sid, account_id, caller_name, callback_number, reason, urgency)"
            " VALUES ($1, $2, 'Nora', '+15550111', 'the cleaning', 'normal')", sid, app.account_id,
        )  # fmt: skip
    session, _ = await signed_in(app)
    async with session:
        for path in ("/calls/CAlook1", "/answering/calls/CAlook1"):
            async with session.get(app.base + path) as response:
                page = await response.text()
                assert response.status == 200, path
            message = page.split('id="message"')[1].split("</div>")[0]
            assert "the cleaning" in message and 'id="screening"' in message, path
            assert '<span data-signal="line_type">mobile</span>' in message, path
            # The registered name is the carrier's text, not Pepper's: escaped.
            assert '<span data-signal="caller_name">&lt;i&gt;ACME&lt;/i&gt; Dental</span>' in message, path
            assert "TN-Validation-Passed-B (partial attestation" in message, path
        for path in ("/calls/CAlook2", "/answering/calls/CAlook2"):  # nothing looked up, no verdict: nothing shown
            async with session.get(app.base + path) as response:
                page = await response.text()
                assert response.status == 200 and "the cleaning" in page and 'id="screening"' not in page, path
    bea = await identity.create_account(db, "Bea")
    await access.set_web_password(db, bea.id, "bea", PASSWORD)
    other, _ = await signed_in(app, "bea")
    async with other:  # another account sees none of it
        for path in ("/calls/CAlook1", "/answering/calls/CAlook1"):
            async with other.get(app.base + path) as response:
                assert response.status == 404 and "ACME" not in await response.text(), path


async def test_the_call_page_plots_each_reply_and_the_calls_page_recent_calls(app: WebApp):
    """Server-drawn SVG: a stacked bar per reply (endpointing, model less its tools, tools, relay)
    from the recorded figures, and recent calls' median and p99; a call without replies, an older
    record and a garbled one render without a plot, another account's call is not plotted."""
    await some_records(app)  # CAweb1: three replies, recorded before the per-reply parts were kept
    stats = {"model_ms": [400.0, 900.0], "relay_ms": [0.2, 0.4], "response_ms": [400.2, 900.4],
             "endpointing_ms": [520.0, 540.0], "tool_ms": [300.0],
             "reply_endpointing_ms": [520.0, 540.0], "reply_tool_ms": [0.0, 300.0]}  # fmt: skip
    bea = await identity.create_account(app.db, "Bea")
    insert = ("INSERT INTO calls (call_sid, account_id, route, status, stats, started_at)"
              " VALUES ($1, $2, 'owner', 'completed', $3::jsonb, now() + $4 * interval '1 minute')")  # fmt: skip
    for sid, who, figures, minutes in (("CAbars", app.account_id, stats, 1), ("CAquiet", app.account_id, {}, 2),
                                       ("CAjunk", app.account_id, {"model_ms": "x", "relay_ms": [1, "y"]}, 3),
                                       ("CAbea", bea.id, {**stats, "model_ms": [7777.0]}, 4)):  # fmt: skip
        await app.db.execute(insert, sid, who, json.dumps(figures), minutes)
    session, _ = await signed_in(app)
    async with session:
        async with session.get(app.base + "/calls/CAbars") as response:
            assert response.status == 200
            figure = (await response.text()).split('<figure id="reply-latency">')[1].split("</figure>")[0]
        bars = figure.split('<g class="reply"')[1:]
        assert len(bars) == 2 and "<script" not in figure and "http" not in figure.replace("http://www.w3.org", "")
        assert 'data-reply="2" data-total-ms="1440.4"' in bars[1]
        for part, ms in (("endpointing_ms", "540.0"), ("model_ms", "600.0"), ("tool_ms", "300.0"), ("relay_ms", "0.4")):
            assert f'data-part="{part}" data-ms="{ms}"' in bars[1], part
        assert 'data-part="tool_ms"' not in bars[0]  # no tool ran in the first reply: no segment
        assert "they show as 0" not in figure
        async with session.get(app.base + "/calls/CAweb1") as response:
            figure = (await response.text()).split('<figure id="reply-latency">')[1].split("</figure>")[0]
        assert len(figure.split('<g class="reply"')) - 1 == 3 and "they show as 0" in figure
        for sid in ("CAquiet", "CAjunk"):
            async with session.get(app.base + "/calls/" + sid) as response:
                page = await response.text()
                assert response.status == 200 and "reply-latency" not in page, sid
        async with session.get(app.base + "/calls") as response:
            assert response.status == 200
            figure = (await response.text()).split('<figure id="recent-latency">')[1].split("</figure>")[0]
        model, relay = figure.split('data-series="model_ms"')[1], figure.split('data-series="relay_ms"')[1]
        model = model.split("</svg>")[0]
        assert model.count('<g class="call"') == 2  # CAweb1 and CAbars; not the quiet, garbled or Bea's
        assert 'data-call="CAbars" data-p50-ms="650.0" data-p99-ms="895.0"' in model
        assert 'data-call="CAweb1" data-p50-ms="500.0"' in model
        assert 'data-call="CAbars" data-p50-ms="0.3" data-p99-ms="0.398"' in relay
        assert "CAbea" not in figure and "7777" not in figure


async def test_the_reply_streams_in_pieces_and_the_working_indicator_names_the_tool(app: WebApp):
    todo = await app.db.fetchval(
        "INSERT INTO todos (account_id, title) VALUES ($1, 'feed the cat') RETURNING id", app.account_id
    )
    words = "The **cat** is fed and the to-do is ticked off."
    app.model.script(reply_tools(("complete_todo", {"id": todo})), reply_text(words, pace=0.02))
    session, headers = await signed_in(app)
    async with session, session.get(app.base + "/api/events?progress=1") as stream:
        assert (await post(session, app.base + "/api/messages", headers, {"text": "I fed the cat"}))[0] == 202
        seen: list[tuple[str, dict]] = []
        buffer = ""
        async for raw in stream.content:
            buffer += raw.decode()
            if buffer.count("event: message") >= 2 and buffer.endswith("\n\n"):
                break
        kind = "message"
        for line in buffer.splitlines():
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                seen.append((kind, json.loads(line.removeprefix("data: "))))
                kind = "message"
    working = [d for k, d in seen if k == "working"]
    assert [(w["tool"], w["label"]) for w in working] == [("complete_todo", "Complete todo")]
    deltas = [d["text"] for k, d in seen if k == "delta"]
    assert len(deltas) >= 2 and "".join(deltas) == words  # in pieces, and nothing lost
    kinds = [k for k, _ in seen]
    assert kinds.index("working") < kinds.index("delta")
    reply = next(d for k, d in seen if k == "message" and d["direction"] == "outbound")
    assert reply["html"] == "<p>The <strong>cat</strong> is fed and the to-do is ticked off.</p>"
    inbound = next(d for k, d in seen if k == "message" and d["direction"] == "inbound")
    assert inbound["html"] is None and inbound["channel"] == "web"
    # Without progress=1 a client sees only messages, as before.
    async with aiohttp.ClientSession(cookie_jar=session.cookie_jar) as again:
        async with again.get(app.base + "/api/events?after=0") as stream:
            first = await stream.content.readuntil(b"\n\n")
            while b"event:" not in first:
                first = await stream.content.readuntil(b"\n\n")
            assert first.startswith(b"id: ") and b"event: message" in first


def test_markdown_replies_are_sanitised():
    html = to_html('**hi** <script>alert(1)</script> [x](javascript:alert(1)) <img src=x onerror="alert(1)">')
    assert "<strong>hi</strong>" in html
    for bad in ("<script", "javascript:", "onerror", "<img"):
        assert bad not in html
    assert to_html("`a<b>`") == "<p><code>a&lt;b&gt;</code></p>"


async def test_a_draft_card_is_edited_and_sent_through_the_tools_rules(app: WebApp):
    session, headers = await signed_in(app)
    async with session:
        card = await a_draft(app, session, "See you at noon.")
        assert (card["kind"], card["to"], card["subject"], card["from"]) == (
            "email",
            [BOB_EMAIL],
            "Friday",
            "pepper@p.test",
        )
        assert card["held"] is False
        url = f"{app.base}/api/drafts/email/{card['id']}"
        edit = {"to": [BOB_EMAIL], "cc": [], "subject": "Friday lunch", "body": "See you at one, not noon."}
        # Garbage.
        for body in (b"\xff\xfe", "[]", {"to": "bob", "cc": [], "subject": "s", "body": "b"},
                     {**edit, "body": "x" * 20001}, {**edit, "body": "nul\x00"}, {**edit, "to": ["not an address"]},
                     {**edit, "body": "  "}):  # fmt: skip
            status, answer = await post(session, url + "/edit", headers, body)
            assert status == 400, (body, answer)
        for bad in ("/api/drafts/email/abc/edit", "/api/drafts/email/99999999999999999999/send",
                    "/api/drafts/sms/1/send", f"/api/drafts/email/{card['id']}/explode"):  # fmt: skip
            assert (await post(session, app.base + bad, headers, edit))[0] in (404, 400), bad
        # Forgeries: no session, a wrong CSRF token, another account's session.
        async with aiohttp.ClientSession() as anonymous:
            assert (await post(anonymous, url + "/send", {}))[0] == 401
        assert (await post(session, url + "/send", {"X-CSRF-Token": "forged"}))[0] == 403
        bea = await identity.create_account(app.db, "Bea")
        await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
        other, other_headers = await signed_in(app, "bea")
        async with other:
            assert (await post(other, url + "/edit", other_headers, edit))[0] == 404
            assert (await post(other, url + "/send", other_headers))[0] == 404
            assert (await post(other, url + "/discard", other_headers))[0] == 404
            async with other.get(app.base + "/api/drafts") as response:
                assert (await response.json())["drafts"] == []
        assert app.smtp.received == []
        # The recipient rules of the tool hold: an address Pepper cannot verify is refused.
        status, answer = await post(session, url + "/edit", headers, {**edit, "to": ["eve@example.net"]})
        assert status == 200 and answer["draft"]["to"] == ["eve@example.net"]
        status, answer = await post(session, url + "/send", headers)
        assert status == 422 and "eve@example.net" in answer["message"] and app.smtp.received == []
        # The edit is what goes out.
        status, answer = await post(session, url + "/edit", headers, edit)
        assert status == 200 and answer["draft"]["subject"] == "Friday lunch"
        status, answer = await post(session, url + "/send", headers)
        assert (status, answer["message"]) == (200, "Sent.")
        [mail] = app.smtp.received
        assert mail.message["Subject"] == "Friday lunch"
        assert mail.message.get_content().strip() == "See you at one, not noon."
        assert BOB_EMAIL in mail.rcpt_to
        # Duplicates: a second send sends nothing; the card is gone.
        assert (await post(session, url + "/send", headers))[0] == 404
        assert (await post(session, url + "/discard", headers))[0] == 404
        assert len(app.smtp.received) == 1
        async with session.get(app.base + "/api/drafts") as response:
            assert (await response.json())["drafts"] == []


async def test_a_discarded_draft_sends_nothing(app: WebApp):
    session, headers = await signed_in(app)
    async with session:
        card = await a_draft(app, session, "Maybe Saturday instead?")
        url = f"{app.base}/api/drafts/email/{card['id']}"
        assert (await post(session, url + "/discard", headers))[0] == 200
        assert (await post(session, url + "/discard", headers))[0] == 404
        assert (await post(session, url + "/send", headers))[0] == 404
        assert app.smtp.received == []
        assert await app.db.fetchval("SELECT status FROM email_messages") == "discarded"


async def test_the_approvals_queue_sends_a_mail_a_scheduled_run_held(app: WebApp):
    session, headers = await signed_in(app)
    async with session:
        card = await a_draft(app, session, "Your weekly report is attached.", held=True)
        assert card["held"] is True
        async with session.get(app.base + "/api/approvals") as response:
            [item] = (await response.json())["approvals"]
        assert (item["kind"], item["id"], item["approve_label"]) == ("held-mail", card["id"], "Send")
        async with session.get(app.base + "/approvals") as response:
            page = await response.text()
            assert (
                "Your weekly report is attached." in page and f"/api/approvals/held-mail/{card['id']}/approve" in page
            )
        url = f"{app.base}/api/approvals/held-mail/{card['id']}"
        assert (await post(session, app.base + "/api/approvals/held-mail/abc/approve", headers))[0] == 404
        assert (await post(session, app.base + "/api/approvals/nope/1/approve", headers))[0] == 404
        assert (await post(session, url + "/maybe", headers))[0] == 404
        assert (await post(session, url + "/approve", {"X-CSRF-Token": "forged"}))[0] == 403
        async with aiohttp.ClientSession() as anonymous:
            assert (await post(anonymous, url + "/approve", {}))[0] == 401
        bea = await identity.create_account(app.db, "Bea")
        await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
        other, other_headers = await signed_in(app, "bea")
        async with other:
            assert (await post(other, url + "/approve", other_headers))[0] == 404
        assert app.smtp.received == []
        status, answer = await post(session, url + "/approve", headers)
        assert (status, answer["message"]) == (200, "Sent.")
        assert (await post(session, url + "/approve", headers))[0] == 404  # decided already
        [mail] = app.smtp.received
        assert mail.message.get_content().strip() == "Your weekly report is attached."


async def test_run_now_adds_one_due_run_of_the_persons_own_task(app: WebApp):
    now = datetime.now(UTC)
    schedule = parse_schedule("every day at 07:30", now=now, timezone="UTC")
    async with app.db.transaction() as conn:
        task = await create_task(conn, app.account_id, title="Brief me", prompt="brief", schedule=schedule, now=now)
    bea = await identity.create_account(app.db, "Bea")
    await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
    session, headers = await signed_in(app)
    async with session:
        url = f"{app.base}/api/tasks/{task.id}/run"
        for bad in ("/api/tasks/abc/run", "/api/tasks/-1/run", "/api/tasks/99999999999999999999/run"):
            assert (await post(session, app.base + bad, headers))[0] == 400
        assert (await post(session, app.base + "/api/tasks/999999/run", headers))[0] == 404
        assert (await post(session, url, {"X-CSRF-Token": "forged"}))[0] == 403
        other, other_headers = await signed_in(app, "bea")
        async with other:
            assert (await post(other, url, other_headers))[0] == 404
        status, answer = await post(session, url, headers)
        assert status == 202 and answer["run_id"]
        status, answer = await post(session, url, headers)
        assert status == 200 and answer["duplicate"] is True
        due = await app.db.fetch("SELECT status FROM task_runs WHERE task_id = $1 AND reason = 'run now'", task.id)
        assert len(due) <= 1  # one extra run at most (the scheduler may have claimed it already)
        async with session.get(app.base + "/tasks") as response:
            page = await response.text()
            assert "Brief me" in page and f"/api/tasks/{task.id}/run" in page


async def test_the_person_edits_their_half_of_the_dossier(app: WebApp):
    session, headers = await signed_in(app)
    async with session:
        url = app.base + "/api/dossier"
        for body in (b"\xff", "[]", {"text": 5}, {"text": "nul\x00"}):
            assert (await post(session, url, headers, body))[0] == 400
        assert (await post(session, url, headers, {"text": "x" * 100_000}))[0] in (400, 413)
        assert (await post(session, url, {"X-CSRF-Token": "forged"}, {"text": "forged"}))[0] == 403
        async with aiohttp.ClientSession() as anonymous:
            assert (await post(anonymous, url, {}, {"text": "anonymous"}))[0] == 401
        status, answer = await post(session, url, headers, {"text": "I am vegetarian. <b>Call me Ada.</b>"})
        assert status == 200 and answer["changed"] is True
        status, answer = await post(session, url, headers, {"text": "I am vegetarian. <b>Call me Ada.</b>"})
        assert status == 200 and answer["changed"] is False  # a duplicate records no revision
        await app.db.execute("INSERT INTO dossier_notes (account_id, body) VALUES ($1, 'likes tea')", app.account_id)
        async with session.get(app.base + "/dossier") as response:
            page = await response.text()
        assert "I am vegetarian. &lt;b&gt;Call me Ada.&lt;/b&gt;" in page and "likes tea" in page
        assert page.count("<td>web") == 1
        assert await app.db.fetchval("SELECT count(*) FROM dossier_revisions") == 1


async def test_an_8001_character_message_is_refused_with_the_limit(app: WebApp):
    session, headers = await signed_in(app)
    async with session:
        status, answer = await post(session, app.base + "/api/messages", headers, {"text": "x" * 8001})
        assert status == 413 and "8000" in answer["message"]
        assert await app.db.fetchval("SELECT count(*) FROM messages") == 0


async def test_progress_crosses_processes_in_pieces_and_garbage_is_ignored(db: Database):
    """The publisher's own connection announces; a listening feed (another process in
    production) hands the pieces to its subscribers in order; a long piece is split under
    NOTIFY's payload limit and joins back; malformed announcements are dropped."""
    from gateway.live import PROGRESS_CHANNEL, LiveFeed, ProgressPublisher

    conversation, turn = uuid4(), str(uuid4())
    feed, publisher = LiveFeed(db.dsn), ProgressPublisher(db.dsn)
    await feed.start()
    try:
        async with feed.subscribe(conversation) as queue:
            for garbage in ("not json", "[]", json.dumps({"conversation_id": str(conversation), "turn_id": turn,
                                                          "kind": "shout", "text": "x"})):  # fmt: skip
                await db.execute("SELECT pg_notify($1, $2)", PROGRESS_CHANNEL, garbage)
            long = "é" * 2500
            ids = {"conversation_id": str(conversation), "turn_id": turn}
            publisher.publish({**ids, "kind": "tool", "text": "complete_todo"})
            publisher.publish({**ids, "kind": "delta", "text": long})
            publisher.publish({**ids, "kind": "delta", "text": " done"})
            got = [await asyncio.wait_for(queue.get(), 10)]
            while "".join(e["text"] for e in got if e["kind"] == "delta") != long + " done":
                got.append(await asyncio.wait_for(queue.get(), 10))
        assert got[0] == {"turn_id": turn, "kind": "tool", "text": "complete_todo"}
        assert len(got) >= 4  # the long piece went out in three announcements
        assert queue.empty()
    finally:
        await publisher.close()
        await feed.stop()


async def test_the_approvals_queue_approves_an_mcp_tool_as_shown_and_shows_what_changed(app: WebApp):
    """The MCP kind of the queue: a new tool waits, approving pins the definition shown, a change
    after that holds it with the change listed, and a click on a definition that changed again
    since the page was shown approves nothing."""
    from core.adapters.mcp.client import ToolDefinition
    from core.records import mcp as records
    from core.tools.mcp import fingerprint

    def listed(description: str, read_only: bool) -> tuple[str, dict, str]:
        tool = ToolDefinition("search", description, {"type": "object", "properties": {"q": {"type": "string"}}},
                              None, {"readOnlyHint": read_only})  # fmt: skip
        return tool.name, tool.as_dict(), fingerprint(tool)

    server = await records.add_server(app.db, app.account_id, "tracker", {"url": "http://127.0.0.1:9/mcp"}, None)
    await records.record_listing(app.db, server, [listed("Search the tracker.", True)])
    session, headers = await signed_in(app)
    async with session:

        async def queue() -> list[dict]:
            async with session.get(app.base + "/api/approvals") as response:
                return [a for a in (await response.json())["approvals"] if a["kind"] == "mcp-tool"]

        [item] = await queue()
        assert item["title"].startswith("search on tracker (new; reads only")
        assert "Search the tracker." in item["detail"]
        async with session.get(app.base + "/approvals") as response:
            assert f"/api/approvals/mcp-tool/{item['id']}/approve" in await response.text()
        url = f"{app.base}/api/approvals/mcp-tool/{item['id']}"
        assert (await post(session, url + "/approve", {"X-CSRF-Token": "forged"}))[0] == 403
        assert (await post(session, app.base + "/api/approvals/mcp-tool/garbage/approve", headers))[0] == 404
        status, answer = await post(session, url + "/approve", headers)
        assert status == 200 and answer["message"].startswith("Approved search on tracker")
        assert (await post(session, url + "/approve", headers))[0] == 404  # decided already
        assert await queue() == []
        [row] = await records.tools_of(app.db, server)
        assert row.state == "approved" and row.approved["description"] == "Search the tracker."

        # The server turns the read into a write: held, with what changed.
        await records.record_listing(app.db, server, [listed("Search and delete.", False)])
        [held] = await queue()
        assert "(changed; may write or act" in held["title"]
        assert '"readOnlyHint": true} -> {"readOnlyHint": false}' in held["detail"]
        assert "description:" in held["detail"]
        # ... and changes it once more before the click: the shown definition is not the listed one.
        await records.record_listing(app.db, server, [listed("Search, delete and email.", False)])
        assert (await post(session, f"{app.base}/api/approvals/mcp-tool/{held['id']}/approve", headers))[0] == 404
        [row] = await records.tools_of(app.db, server)
        assert row.state == "held" and row.approved["description"] == "Search the tracker."
        [latest] = await queue()
        assert (await post(session, f"{app.base}/api/approvals/mcp-tool/{latest['id']}/reject", headers))[0] == 200
        [row] = await records.tools_of(app.db, server)
        assert row.state == "rejected" and row.approved is None


async def test_a_member_sets_their_own_calendar_sharing_level_per_room(app: WebApp):
    from core.records import rooms
    from core.tools.areas.calendar.store import ensure_pepper_calendar

    room = await rooms.create_room(app.db, "!family:rooms.test", "Family <home>")
    elsewhere = await rooms.create_room(app.db, "!work:rooms.test", "Work")
    bea = await identity.create_account(app.db, "Bea")
    await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
    for account in (app.account_id, bea.id):
        await rooms.add_member(app.db, room.id, account)
    ada_cal = await ensure_pepper_calendar(app.db, app.account_id)
    bea_cal = await ensure_pepper_calendar(app.db, bea.id)
    await rooms.set_share(app.db, room.id, bea.id, bea_cal, "free_busy")
    session, headers = await signed_in(app)
    async with session:
        async with session.get(app.base + "/rooms") as response:
            page = await response.text()
        assert response.status == 200 and "Family &lt;home&gt;" in page and "Work" not in page
        assert f'data-post="/api/rooms/{room.id}/shares"' in page and "<script>" not in page
        assert page.count("<select") == 1  # Ada's one calendar; Bea's is not shown to her
        url = f"{app.base}/api/rooms/{room.id}/shares"
        good = {"calendar": str(ada_cal), "level": "titles"}
        for body in (b"\xff", "[]", {"calendar": str(ada_cal)}, {"calendar": 5, "level": "titles"},
                     {"calendar": "not-an-id", "level": "titles"}, {**good, "level": "all of it"},
                     {**good, "account": str(bea.id)}, {**good, "member": "Bea"}):  # fmt: skip
            assert (await post(session, url, headers, body))[0] == 400, body
        assert (await post(session, app.base + "/api/rooms/nope/shares", headers, good))[0] == 400
        # Forgeries: no CSRF, no session, another member's calendar, a room Ada is not in.
        assert (await post(session, url, {"X-CSRF-Token": "forged"}, good))[0] == 403
        async with aiohttp.ClientSession() as anonymous:
            assert (await post(anonymous, url, {}, good))[0] == 401
        status, answer = await post(session, url, headers, {"calendar": str(bea_cal), "level": "everything"})
        assert status == 404 and answer["error"] == "no-such-calendar"
        elsewhere_url = f"{app.base}/api/rooms/{elsewhere.id}/shares"
        assert (await post(session, elsewhere_url, headers, good))[0] == 404
        assert await rooms.shares(app.db, room.id) == {(bea.id, bea_cal): "free_busy"}

        status, answer = await post(session, url, headers, good)
        assert status == 200 and answer["changed"] is True
        status, answer = await post(session, url, headers, good)
        assert status == 200 and answer["changed"] is False  # a duplicate changes nothing
        assert await rooms.shares(app.db, room.id) == {
            (bea.id, bea_cal): "free_busy",
            (app.account_id, ada_cal): "titles",
        }
        async with session.get(app.base + "/rooms") as response:
            assert '<option value="titles" selected>' in await response.text()


async def test_a_text_a_scheduled_run_held_back_is_a_card_to_edit_discard_or_send(app: WebApp):
    rows = [("k1", "Happy birthday!"), ("k2", "See you Sunday")]
    for key, body in rows:
        await app.db.execute(
            "INSERT INTO outbound_texts (account_id, key, channel, to_number, from_number, contact, body, status)"
            " VALUES ($1, $2, 'sms', '+14155550123', '+14155550100', 'Sam', $3, 'draft')",
            app.account_id, key, body,
        )  # fmt: skip
    session, headers = await signed_in(app)
    async with session:
        async with session.get(app.base + "/api/drafts") as response:
            cards = [d for d in (await response.json())["drafts"] if d["kind"] == "text"]
        assert [(c["to"], c["body"], c["held"]) for c in cards] == [
            (["+14155550123"], "Happy birthday!", True),
            (["+14155550123"], "See you Sunday", True),
        ]
        first, second = (f"{app.base}/api/drafts/text/{c['id']}" for c in cards)
        edit = {"to": [], "cc": [], "subject": "", "body": "Happy birthday, Sam!"}
        for bad in ({**edit, "body": "  "}, {**edit, "body": "x" * 1001}, "[]"):  # garbage
            assert (await post(session, first + "/edit", headers, bad))[0] == 400, bad
        bea = await identity.create_account(app.db, "Bea")
        await access.set_web_password(app.db, bea.id, "bea", PASSWORD)
        other, other_headers = await signed_in(app, "bea")
        async with other:  # another person's session: no such draft
            for action in ("edit", "send", "discard"):
                assert (await post(other, f"{first}/{action}", other_headers, edit))[0] == 404
        status, answer = await post(session, first + "/edit", headers, edit)
        assert status == 200 and answer["draft"]["body"] == "Happy birthday, Sam!"
        # Twilio is not set up on this server: the send is refused with the reason, nothing goes out.
        status, answer = await post(session, first + "/send", headers)
        assert status == 422 and "texting" in answer["message"]
        assert (await post(session, second + "/discard", headers))[0] == 200
        assert (await post(session, second + "/discard", headers))[0] == 404  # a duplicate: already gone
    statuses = [r["status"] for r in await app.db.fetch("SELECT status FROM outbound_texts ORDER BY id")]
    assert statuses == ["draft", "discarded"]
