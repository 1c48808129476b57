"""Debian's Chromium under Selenium, for the browser tests (imported by name: ``from browser_support import ...``).

Needs ``chromium`` and ``chromium-driver`` (``scripts/test`` installs them). Selenium is pointed at
/usr/bin/chromedriver, so it never tries to download a driver. Screenshots go to
``$PEPPER_TEST_OUTPUT`` (else ``screenshots/`` in pytest's temporary directory).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")
needs_chromium = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver (scripts/test installs them)"
)
FLAGS = (
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
    "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip


@contextmanager
def chromium(*extra: str) -> Iterator[Any]:
    """A headless Chromium with its own profile, and ``extra`` flags."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    # One Chromium at a time on the machine: with the suite's two workers, two started at once and
    # one never came up ("chrome not reachable"). The wait blocks the caller's event loop, which
    # is harmless here: a browser test's server has nothing in flight before its browser exists.
    lock = open(Path(tempfile.gettempdir()) / "pepper-test-chromium.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="pepper-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}", *extra):
        options.add_argument(flag)
    try:
        browser = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
        browser.set_page_load_timeout(30)
        try:
            yield browser
        finally:
            browser.quit()
            shutil.rmtree(profile, ignore_errors=True)
    finally:
        lock.close()  # releases the lock


async def wait_for(predicate, within: float = 20.0, every: float = 0.1):  # type: ignore[no-untyped-def]
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
        await asyncio.sleep(every)


def output_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where browser tests leave their screenshots."""
    configured = os.environ.get("PEPPER_TEST_OUTPUT")
    path = Path(configured) if configured else tmp_path_factory.getbasetemp() / "screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


async def sign_in(driver: Any, base: str, login: str, password: str) -> None:
    """Open the chat page and sign in through its form; returns once the message box shows."""
    from selenium.webdriver.common.by import By

    await asyncio.to_thread(driver.get, base + "/chat")
    form = await wait_for(lambda: driver.find_element(By.ID, "login").is_displayed() and driver)
    form.find_element(By.ID, "login").send_keys(login)
    driver.find_element(By.ID, "password").send_keys(password)
    await asyncio.to_thread(driver.find_element(By.ID, "signin-button").click)
    await wait_for(lambda: driver.find_element(By.ID, "text").is_displayed())
