"""The web chat's streaming: time to the first streamed token in the page, beside the model
peer's first delta.

A real headless Chromium (Debian's chromium and chromium-driver) signs in to a served Pepper
with a loopback OpenAI peer and sends messages one at a time. For each reply the peer records
when its stream's first frame went out (``time.time()``) and the page records (``Date.now()``,
the same machine's clock) when the first piece of the reply appeared in the chat. The figure is
the difference: what the harness, the progress announcement (``pg_notify`` from the turn worker),
the SSE feed and the page add on top of the model. The whole reply arriving (the recorded
message replacing the streamed text) is shown beside it.

    PYTHONPATH=. .venv/bin/python bench/webapp.py [--messages 30]
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile

from core import access, identity
from core.settings import Settings
from core.store import Database
from core.testing.figures import p99
from core.testing.peers import OpenAIPeer, reply_text
from core.testing.postgres import DatabaseFactory, test_server
from gateway.server import running_app

WATCH = """
window.__firsts = window.__firsts || [];
window.__wholes = window.__wholes || [];
if (!window.__watching) {
  window.__watching = true;
  new MutationObserver((changes) => {
    for (const change of changes) for (const node of change.addedNodes) {
      const el = node.nodeType === 3 ? node.parentElement : node;
      if (!el || !el.closest) continue;
      if (el.closest('.msg.streaming')) {
        const turn = el.closest('.msg.streaming').dataset.turn;
        if (!window.__firsts.some(f => f.turn === turn)) window.__firsts.push({turn, at: Date.now()});
      } else if (el.matches && el.matches('.msg.outbound')) {
        window.__wholes.push(Date.now());
      }
    }
  }).observe(document.getElementById('log'), {childList: true, subtree: true});
}
"""


def _browser():  # type: ignore[no-untyped-def]
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    profile = tempfile.mkdtemp(prefix="pepper-bench-")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", f"--user-data-dir={profile}"):  # fmt: skip
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=shutil.which("chromedriver")), options=options)


async def _until(check) -> None:  # type: ignore[no-untyped-def]
    """Poll ``check`` (a blocking browser call) in a thread, so the server in this loop runs on."""
    for _ in range(3000):
        if await asyncio.to_thread(check):
            return
        await asyncio.sleep(0.01)
    raise TimeoutError("the page never got there")


async def bench(messages: int) -> None:
    from selenium.webdriver.common.by import By

    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        url = await factory.create()
        db = await Database.open(url, max_size=10)
        driver = await asyncio.to_thread(_browser)
        try:
            ada = await identity.create_account(db, "Ada")
            await access.set_web_password(db, ada.id, "ada", "bench password")
            async with OpenAIPeer() as model:
                settings = Settings(database_url=url, openai_api_key="sk", openai_base_url=model.base_url, port=0)
                async with running_app(settings, db) as (_app, port):
                    await asyncio.to_thread(driver.get, f"http://127.0.0.1:{port}/")
                    await _until(lambda: driver.find_element(By.ID, "login").is_displayed())
                    await asyncio.to_thread(driver.find_element(By.ID, "login").send_keys, "ada")
                    await asyncio.to_thread(driver.find_element(By.ID, "password").send_keys, "bench password")
                    await asyncio.to_thread(driver.find_element(By.ID, "signin-button").click)
                    await _until(lambda: driver.find_element(By.ID, "status").text == "connected")
                    await asyncio.to_thread(driver.execute_script, WATCH)
                    added, whole = [], []
                    for n in range(messages + 3):
                        words = " ".join(f"word{i}" for i in range(40))
                        model.script(reply_text(words, pace=0.005))
                        await asyncio.to_thread(
                            driver.execute_script,
                            "document.getElementById('text').value = arguments[0];"
                            "document.getElementById('send').requestSubmit();",
                            f"message {n}",
                        )
                        await _until(lambda n=n: len(driver.execute_script("return window.__wholes")) > n)
                        first = (await asyncio.to_thread(driver.execute_script, "return window.__firsts"))[-1]["at"]
                        done = (await asyncio.to_thread(driver.execute_script, "return window.__wholes"))[n]
                        first, done = first / 1000, done / 1000
                        if n >= 3:  # warm-up
                            added.append((first - model.stream_starts[-1]) * 1000)
                            whole.append((done - model.stream_starts[-1]) * 1000)
            for label, values in (("first streamed token in the page after the peer's first delta", added),
                                  ("whole reply shown after the peer's first delta", whole)):  # fmt: skip
                values.sort()
                print(f"{label}: median {statistics.median(values):.1f} ms, p99 {p99(values):.1f} ms "
                      f"({len(values)} replies of 40 words, 5 ms apart)")  # fmt: skip
        finally:
            await asyncio.to_thread(driver.quit)
            await db.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30)
    args = parser.parse_args()
    asyncio.run(bench(args.messages))


if __name__ == "__main__":
    main()
