"""The web chat in a real headless Chromium: sign in, send, watch the reply stream in, reload, see history.

Needs Debian's ``chromium`` and ``chromium-driver`` (``scripts/test`` installs them). Selenium is
pointed at /usr/bin/chromedriver, so it never tries to download a driver.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from browser_support import chromium, needs_chromium, sign_in, wait_for

from core import access, identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from gateway.server import running_app

pytestmark = needs_chromium


@pytest.fixture
def driver() -> Iterator[object]:
    with chromium() as browser:
        yield browser


async def test_sign_in_send_see_the_reply_reload_and_see_the_history(db: Database, db_url: str, driver):
    from selenium.webdriver.common.by import By

    ada = await identity.create_account(db, "Ada")
    await access.set_web_password(db, ada.id, "ada", "correct horse battery")
    todo = await db.fetchval("INSERT INTO todos (account_id, title) VALUES ($1, 'feed the cat') RETURNING id", ada.id)
    async with OpenAIPeer() as model:
        model.script(reply_tools(("complete_todo", {"id": todo})), reply_text("The cat is fed, ticked off."))
        async with running_app(Settings(database_url=db_url, openai_api_key="sk", openai_base_url=model.base_url,
                                        port=0), db) as (_app, port):  # fmt: skip
            base = f"http://127.0.0.1:{port}"

            def texts() -> list[str]:
                return [e.text.split("\n")[0] for e in driver.find_elements(By.CSS_SELECTOR, "#log .msg")]

            await sign_in(driver, base, "ada", "correct horse battery")
            driver.find_element(By.ID, "text").send_keys("I fed the cat")
            await asyncio.to_thread(driver.find_element(By.ID, "send-button").click)
            await wait_for(lambda: texts() == ["I fed the cat", "The cat is fed, ticked off."])

            # The page acknowledged the reply it showed: the staged write is committed.
            for _ in range(100):
                if await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is not None:
                    break
                await asyncio.sleep(0.05)
            assert await db.fetchval("SELECT done_at FROM todos WHERE id = $1", todo) is not None

            await asyncio.to_thread(driver.refresh)
            await wait_for(lambda: texts() == ["I fed the cat", "The cat is fed, ticked off."])
            assert await db.fetchval("SELECT count(*) FROM turns") == 1
