"""The web app in a real headless Chromium (Debian's chromium and chromium-driver, as
``test_browser_chat.py``): sign in, watch a reply stream in word by word after the working
indicator names the tool, edit and send a draft card (the loopback SMTP server receives exactly
the edited text), an 8,001-character message refused with the limit and kept in the box, and the
approvals queue approving a held mail. A screenshot of every page goes to ``$PEPPER_TEST_OUTPUT``
(default: ``screenshots`` in pytest's temporary directory). One browser and one server for all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import chromium, needs_chromium, output_dir
from browser_support import wait_for as browser_wait_for
from web_app_support import PASSWORD, some_records, web_app

from core.store import Database
from core.testing.peers import reply_text, reply_tools

pytestmark = needs_chromium
STREAMED = "Done: the cat is fed, the to-do is ticked off, and your Friday draft is ready below."


@pytest.fixture
def driver() -> Iterator[object]:
    with chromium("--window-size=1100,900") as browser:
        yield browser


@pytest.fixture
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return output_dir(tmp_path_factory)


async def wait_for(predicate, within: float = 20.0):  # type: ignore[no-untyped-def]
    """``browser_support.wait_for``, polling faster: the test watches a reply grow word by word."""
    return await browser_wait_for(predicate, within, every=0.05)


SNAPSHOT = """
const working = document.getElementById('working');
const streaming = document.querySelector('#log .msg.streaming .body');
const replies = [...document.querySelectorAll('#log .msg.outbound:not(.streaming) .body')].map(e => e.textContent);
return {working: working.hidden ? null : working.textContent, streaming: streaming ? streaming.textContent : null,
        replies};
"""


async def test_the_web_app_in_a_browser(db: Database, db_url: str, driver, shots: Path):  # type: ignore[no-untyped-def]
    from selenium.webdriver.common.by import By

    async with web_app(db, db_url) as app:
        todo = await db.fetchval(
            "INSERT INTO todos (account_id, title) VALUES ($1, 'feed the cat') RETURNING id", app.account_id
        )
        await some_records(app)

        def shot(name: str) -> None:
            driver.save_screenshot(str(shots / f"{name}.png"))

        # Sign in at the home page.
        await asyncio.to_thread(driver.get, app.base + "/")
        await wait_for(lambda: driver.find_element(By.ID, "login").is_displayed())
        await asyncio.to_thread(shot, "sign-in")
        driver.find_element(By.ID, "login").send_keys("ada")
        driver.find_element(By.ID, "password").send_keys(PASSWORD)
        await asyncio.to_thread(driver.find_element(By.ID, "signin-button").click)
        await wait_for(lambda: driver.find_element(By.ID, "status").text == "connected")

        # A tool runs (the indicator names it), then the reply streams in word by word.
        app.model.script(reply_tools(("complete_todo", {"id": todo})), reply_text(STREAMED, delay=0.8, pace=0.12))
        driver.find_element(By.ID, "text").send_keys("I fed the cat; and draft Bob a note about Friday")
        await asyncio.to_thread(driver.find_element(By.ID, "send-button").click)
        draft_id = await app.draft("See you at noon.")  # what the turn's mail skill would save
        states: list[dict] = []
        while True:
            state = await asyncio.to_thread(driver.execute_script, SNAPSHOT)
            if not states or state != states[-1]:
                states.append(state)
                if state["working"] and len([s for s in states if s["working"]]) == 1:
                    await asyncio.to_thread(shot, "chat-working")
            if STREAMED in state["replies"]:
                break
            assert len(states) < 500
        assert any(s["working"] == "Working: Complete todo…" for s in states)
        partial = [s["streaming"] for s in states if s["streaming"]]
        assert len(set(partial)) >= 3, partial  # seen growing, word by word
        assert all(STREAMED.startswith(p) for p in partial)
        assert all(not s["working"] for s in states[states.index(next(s for s in states if s["streaming"])) :])

        # The draft card: edit it, send it; the SMTP server receives exactly the edited text.
        card = await wait_for(lambda: driver.find_element(By.CSS_SELECTOR, f'.draft[data-draft="{draft_id}"]'))
        await asyncio.to_thread(shot, "chat-draft-card")
        card.find_element(By.CSS_SELECTOR, "button.edit").click()
        body = card.find_element(By.CSS_SELECTOR, "textarea[name=body]")
        body.clear()
        edited = "See you at one, not noon.\nBring the plans."
        body.send_keys(edited)
        await asyncio.to_thread(card.find_element(By.CSS_SELECTOR, "button.save").click)
        fresh = await wait_for(
            lambda: next(
                (c for c in driver.find_elements(By.CSS_SELECTOR, f'.draft[data-draft="{draft_id}"]')
                 if c.find_element(By.CSS_SELECTOR, ".draft-body").text == edited), None,
            )
        )  # fmt: skip
        await asyncio.to_thread(fresh.find_element(By.CSS_SELECTOR, "button.send").click)
        await wait_for(lambda: fresh.find_element(By.CSS_SELECTOR, ".result").text == "Sent.")
        [mail] = app.smtp.received
        # Exactly the edited text (the wire's line endings are CRLF).
        assert mail.message.get_content().replace("\r\n", "\n").strip() == edited

        # 8,001 characters: a clear error before sending, and the text stays in the box.
        before = await db.fetchval("SELECT count(*) FROM messages")
        driver.execute_script(
            "const b = document.getElementById('text'); b.value = 'x'.repeat(8001);b.dispatchEvent(new Event('input'));"
        )
        await asyncio.to_thread(driver.find_element(By.ID, "send-button").click)
        limit = driver.find_element(By.ID, "limit")
        assert "over" in limit.get_attribute("class") and "at most 8000" in limit.text
        assert len(driver.find_element(By.ID, "text").get_property("value")) == 8001
        await asyncio.to_thread(shot, "chat-too-long")
        await asyncio.sleep(0.3)
        assert await db.fetchval("SELECT count(*) FROM messages") == before

        # A send that fails says so and offers a retry, which sends it once.
        driver.execute_script("document.getElementById('text').value = ''")
        app.model.script(reply_text("Yes, here."))
        await asyncio.to_thread(driver.set_network_conditions, offline=True, latency=0, throughput=0)
        long_word = "Supercalifragilistic" * 15  # 300 letters without a break
        driver.find_element(By.ID, "text").send_keys(f"Are you there? {long_word}")
        await asyncio.to_thread(driver.find_element(By.ID, "send-button").click)
        failed = await wait_for(lambda: driver.find_element(By.CSS_SELECTOR, "#log .msg.failed"))
        assert "Not sent" in failed.text and failed.find_element(By.CSS_SELECTOR, "button.retry").is_displayed()
        await asyncio.to_thread(shot, "chat-send-failed")
        await asyncio.to_thread(driver.delete_network_conditions)
        await asyncio.to_thread(failed.find_element(By.CSS_SELECTOR, "button.retry").click)
        await wait_for(lambda: "Yes, here." in (driver.execute_script(SNAPSHOT))["replies"])
        assert await db.fetchval("SELECT count(*) FROM messages WHERE body = $1", f"Are you there? {long_word}") == 1
        assert not driver.find_elements(By.CSS_SELECTOR, "#log .msg.failed")
        # The long word wraps inside its bubble: nothing overflows the page sideways.
        assert driver.execute_script("const l = document.getElementById('log'); return l.scrollWidth <= l.clientWidth")

        # The approvals queue approves a mail a scheduled run held, and an MCP tool its server
        # changed after it was approved (held), shown with what changed.
        held = await app.draft("Your weekly report, as every Monday.", held=True)
        tool = await held_mcp_tool(db, app.account_id)
        await asyncio.to_thread(driver.get, app.base + "/approvals")
        button = await wait_for(lambda: driver.find_element(By.CSS_SELECTOR, f'.approval[data-id="{held}"] .approve'))
        changed = driver.find_element(By.CSS_SELECTOR, f'.approval[data-id="{tool}"]')
        assert "Search and delete." in changed.text and "readOnlyHint" in changed.text
        await asyncio.to_thread(shot, "approvals")
        await asyncio.to_thread(button.click)
        await wait_for(lambda: not driver.find_elements(By.CSS_SELECTOR, f'.approval[data-id="{held}"]'))
        await asyncio.to_thread(driver.find_element(By.CSS_SELECTOR, f'.approval[data-id="{tool}"] .approve').click)
        await wait_for(lambda: driver.find_element(By.ID, "nothing-waiting"))
        assert len(app.smtp.received) == 2
        assert app.smtp.received[1].message.get_content().strip() == "Your weekly report, as every Monday."
        from core.records import mcp as mcp_records

        [row] = await mcp_records.account_tools(db, app.account_id)
        assert row.state == "approved" and row.approved["description"] == "Search and delete."

        # A calendar suggestion (its detector promoted) is accepted from the same queue: the
        # todo gets its slot on the calendar.
        from datetime import UTC, datetime

        from core.quality.detectors import promote
        from core.suggestions import cards, run_detectors
        from gateway.web_api import run_owner_tool

        for title in ("Plan the trip (1h)", "Call the bank (30 min)"):
            todo = await run_owner_tool(app.services, app.account_id, "add_todo", {"title": title})
            assert todo.succeeded
        await promote(db, "todo-slot", datetime.now(UTC))
        await run_detectors(db, app.services.harness.connectors, app.account_id, datetime.now(UTC))
        card, bank = sorted(await cards(db, app.account_id), key=lambda c: "bank" in c.title)
        # The chat shows it as a card, as it shows drafts.
        await asyncio.to_thread(driver.get, app.base + "/")
        shown = await wait_for(
            lambda: driver.find_element(By.CSS_SELECTOR, f'.card.suggestion[data-suggestion="{card.id}"]')
        )
        assert "Find time for" in shown.text and shown.find_element(By.CSS_SELECTOR, ".accept").text == "Accept"
        await asyncio.to_thread(shot, "chat-suggestion")
        dismiss = driver.find_element(By.CSS_SELECTOR, f'.card.suggestion[data-suggestion="{bank.id}"] .dismiss')
        await asyncio.to_thread(dismiss.click)
        await wait_for(lambda: "will not come back" in driver.find_element(
            By.CSS_SELECTOR, f'.card.suggestion[data-suggestion="{bank.id}"] .result').text)  # fmt: skip
        await asyncio.to_thread(driver.get, app.base + "/approvals")
        accept = await wait_for(
            lambda: driver.find_element(
                By.CSS_SELECTOR, f'section[data-kind="suggestion"] [data-id="{card.id}"] .approve'
            )
        )
        assert accept.text == "Accept" and "Find time for" in driver.page_source
        await asyncio.to_thread(accept.click)
        await wait_for(lambda: driver.find_element(By.ID, "nothing-waiting"))
        assert await db.fetchval("SELECT count(*) FROM calendar_events WHERE title = 'Plan the trip (1h)'") == 1

        # Every other page, in the one look.
        for path, name, marker in (
            ("/calls", "calls", "calls"), ("/calls/CAweb1", "call", "transcript"), ("/tasks", "tasks", "Brief me"),
            ("/dossier", "dossier", "owner-text"), ("/plots", "plots", "plot-latency"),
            ("/settings", "settings", "doctor"), ("/connect/google?area=gmail", "connect", "Not set up"),
        ):  # fmt: skip
            await asyncio.to_thread(driver.get, app.base + path)
            await wait_for(lambda marker=marker: marker in driver.page_source)
            assert driver.find_elements(By.CSS_SELECTOR, "header.top h1"), path
            if name == "plots":  # drawn by the shipped uPlot, offline
                await wait_for(lambda: driver.find_elements(By.CSS_SELECTOR, "#plot-latency .uplot canvas"))
            await asyncio.to_thread(shot, name)


async def held_mcp_tool(db, account_id) -> str:  # type: ignore[no-untyped-def]
    """A tool of an MCP server, approved, then listed again changed (held): its approvals id."""
    from core.adapters.mcp.client import ToolDefinition
    from core.records import mcp as records
    from core.tools.mcp import fingerprint
    from gateway.web_api import McpTools

    def listed(description: str, read_only: bool) -> tuple[str, dict, str]:
        tool = ToolDefinition("search", description, {"type": "object"}, None, {"readOnlyHint": read_only})
        return tool.name, tool.as_dict(), fingerprint(tool)

    server = await records.add_server(db, account_id, "tracker", {"url": "http://127.0.0.1:9/mcp"}, None)
    await records.record_listing(db, server, [listed("Search the tracker.", True)])
    await records.decide(db, server, "search", approve=True)
    await records.record_listing(db, server, [listed("Search and delete.", False)])
    [row] = await records.pending_approvals(db, account_id)
    return McpTools._id(row)
