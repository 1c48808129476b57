"""The web chat in a real headless Chromium: sign in, send, watch the reply stream in, reload, see history.

Needs Debian's ``chromium`` and ``chromium-driver`` (``scripts/test`` installs them). Selenium is
pointed at /usr/bin/chromedriver, so it never tries to download a driver.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from core import access, identity
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from gateway.server import running_app

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver (scripts/test installs them)"
)


@pytest.fixture
def driver() -> Iterator[object]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="pepper-chromium-")
    for flag in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
        "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}",
    ):  # fmt: skip
        options.add_argument(flag)
    browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    browser.set_page_load_timeout(30)
    try:
        yield browser
    finally:
        browser.quit()
        shutil.rmtree(profile, ignore_errors=True)


async def wait_for(predicate, within: float = 20.0):  # type: ignore[no-untyped-def]
    from selenium.common.exceptions import WebDriverException

    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            value = await asyncio.to_thread(predicate)
        except WebDriverException:  # the page is between loads: its elements come and go
            value = None
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("the page never got there")
        await asyncio.sleep(0.1)


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

            await asyncio.to_thread(driver.get, base + "/chat")
            login = await wait_for(lambda: driver.find_element(By.ID, "login").is_displayed() and driver)
            login.find_element(By.ID, "login").send_keys("ada")
            driver.find_element(By.ID, "password").send_keys("correct horse battery")
            await asyncio.to_thread(driver.find_element(By.ID, "signin-button").click)

            box = await wait_for(lambda: driver.find_element(By.ID, "text").is_displayed() and driver)
            box.find_element(By.ID, "text").send_keys("I fed the cat")
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
