"""What following a plain web page costs: CPU per check, and model calls per 100 checks.

A loopback site in its own process (so its CPU is not counted) serves a school calendar page:

* ``/same``: always the same page with an ETag, so a check sends ``If-None-Match`` and gets 304;
* ``/stamp``: the same text with a new timestamp in the footer each time, no validators, so every
  check reads the page, reduces it to text and finds the fingerprint unchanged;
* ``/changing``: new text every time, so every check makes its one extraction call (a scripted
  model, so the figure is Pepper's own CPU, not a model's) and matches the events;
* ``/weekly``: a page whose version the bench sets (``POST /version``); with and without ETag.

Prints, median and p99 of this process's CPU time (``time.process_time``) per check:
the baseline in the same run (a bare conditional GET through the same egress relay, answered 304),
an unchanged check (304), a fingerprint-equal check, a changed page; and what the relay's
``httpx`` client per fetch costs by itself, on the one shared TLS context, beside a client that
builds its own (httpx's default: the CA bundle loaded again, which was most of every figure). Then model calls per 100
checks of a page that changes once a week, checked every 6 hours (the default), over 10 weeks.

    PYTHONPATH=. .venv/bin/python bench/follow.py [--checks 200]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from core.following import pages, store
from core.following.checks import FollowConfig, Following
from core.identity import create_account
from core.store import Database
from core.testing.figures import p99
from core.testing.postgres import DatabaseFactory, test_server
from core.testing.scripted import ScriptedModels, calls
from core.web.egress import Egress, EgressPolicy
from core.web.tls import tls_context

ROW = "<li>{day} April 2025, 16:00: {title} at the leisure centre</li>"


def _page(version: int, stamp: str) -> str:
    items = "".join(ROW.format(day=d, title=f"Swim practice {version}" if d == 8 else f"Club night {d}")
                    for d in range(1, 29))  # fmt: skip
    menu = "".join(f'<li><a href="/section/{n}">Section {n} of the school site</a></li>' for n in range(150))
    news = "".join(f"<p>News item {n}: the school office reminds parents about uniform and lunches.</p>"
                   for n in range(60))  # fmt: skip
    head = "<html><head><title>Hillside term dates</title></head><body>"
    return f"{head}<nav><ul>{menu}</ul></nav><main><h1>Calendar</h1><ul>{items}</ul>{news}</main>" + (
        f"<footer>Generated {stamp}</footer></body></html>"
    )


def _site(port: int) -> None:
    from aiohttp import web

    state = {"n": 0, "weekly": 0}

    async def same(request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304, headers={"ETag": '"v1"'})
        return web.Response(text=_page(1, "fixed"), content_type="text/html", headers={"ETag": '"v1"'})

    async def stamp(request: web.Request) -> web.Response:
        state["n"] += 1
        return web.Response(text=_page(1, f"{time.time():.6f}"), content_type="text/html")

    async def changing(request: web.Request) -> web.Response:
        state["n"] += 1
        return web.Response(text=_page(state["n"], "x"), content_type="text/html")

    async def weekly(request: web.Request) -> web.Response:
        etag = f'"w{state["weekly"]}"'
        if request.query.get("etag") and request.headers.get("If-None-Match") == etag:
            return web.Response(status=304, headers={"ETag": etag})
        headers = {"ETag": etag} if request.query.get("etag") else {}
        return web.Response(text=_page(state["weekly"], f"{time.time():.6f}"), content_type="text/html",
                            headers=headers)  # fmt: skip

    async def version(request: web.Request) -> web.Response:
        state["weekly"] = int(request.query["v"])
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/same", same), web.get("/stamp", stamp), web.get("/changing", changing),
                    web.get("/weekly", weekly), web.post("/version", version)])  # fmt: skip
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, handle_signals=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _extraction(prompt: Any) -> Any:
    text = prompt.messages[0].content
    line = "8 April 2025, 16:00: Swim practice"
    start = text.index(line)
    quote = text[start : text.index(" at the leisure centre", start)]
    return calls((pages.EXTRACT_TOOL, {"events": [
        {"title": quote.split(": ", 1)[1], "date": "2025-04-08", "date_text": "8 April 2025", "start_time": "16:00",
         "quote": quote, "cancelled": False},
    ]}))  # fmt: skip


def _ms(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.3f} ms  p99 {p99(values) * 1000:7.3f} ms"


async def _cpu_per_check(following: Following, follow_id: int, n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        await following.db.execute("UPDATE follows SET next_check_at = now() - interval '1 s' WHERE id = $1", follow_id)
        started = time.process_time()
        [claimed] = await store.claim_due(following.db, following.owner, datetime.now(UTC),
                                          lease=timedelta(minutes=5), limit=1)  # fmt: skip
        await following.check(claimed)
        out.append(time.process_time() - started)
    return out


async def main(checks: int) -> None:
    port = _free_port()
    site = multiprocessing.get_context("spawn").Process(target=_site, args=(port,), daemon=True)
    site.start()
    base = f"http://127.0.0.1:{port}"
    egress = Egress(EgressPolicy(loopback_ports=frozenset({port})))
    for _ in range(100):
        try:
            await egress.fetch(base + "/same")
            break
        except Exception:
            await asyncio.sleep(0.1)
    with test_server() as dsn:
        factory = DatabaseFactory(dsn)
        await factory.prepare_template()
        db = await Database.open(await factory.create(), max_size=4)
        try:
            account = await create_account(db, "Bench", timezone="Europe/London")
            models = ScriptedModels(default=_extraction)
            following = Following(db, egress, models, config=FollowConfig(), owner="bench")
            ids = {}
            for path in ("same", "stamp", "changing"):
                follow, _ = await store.add(db, account.id, "page", f"{base}/{path}", path)
                ids[path] = follow.id
            for path in ids:  # warm up, and give /same its ETag and /stamp its fingerprint
                await _cpu_per_check(following, ids[path], 3)

            baseline: list[float] = []
            for _ in range(checks):
                started = time.process_time()
                response = await egress.fetch(base + "/same", headers={"If-None-Match": '"v1"'})
                baseline.append(time.process_time() - started)
                assert response.status == 304
            clients: list[float] = []  # what a fresh client with httpx's own TLS context would cost
            shared: list[float] = []  # the relay's client, on the one shared context (core.web.tls)
            for _ in range(max(20, checks // 10)):
                started = time.process_time()
                await httpx.AsyncClient(trust_env=False).aclose()
                clients.append(time.process_time() - started)
                started = time.process_time()
                await httpx.AsyncClient(trust_env=False, verify=tls_context()).aclose()
                shared.append(time.process_time() - started)
            before = len(models.received)
            unchanged = await _cpu_per_check(following, ids["same"], checks)
            equal = await _cpu_per_check(following, ids["stamp"], checks)
            assert len(models.received) == before, "an unchanged page made a model call"
            changed = await _cpu_per_check(following, ids["changing"], max(20, checks // 4))
            print(f"CPU per check of a {len(_page(1, 'x'))}-byte page ({checks} checks; {len(changed)} changed),"
                  " this process only (the site and Postgres run elsewhere):")  # fmt: skip
            print(f"  the relay's client (shared TLS context)    {_ms(shared)}")
            print(f"  beside: a client with its own TLS context  {_ms(clients)}")
            print(f"  baseline: bare conditional GET, 304        {_ms(baseline)}")
            print(f"  unchanged check (304, claim + record)      {_ms(unchanged)}")
            print(f"  fingerprint equal (page read, text same)   {_ms(equal)}")
            print(f"  changed page (text, 1 extraction, match)   {_ms(changed)}")

            for etag in (True, False):
                follow, _ = await store.add(db, account.id, "page", f"{base}/weekly?etag={'1' if etag else ''}", "w")
                calls_before, total, week = len(models.received), 0, -1
                start = datetime(2025, 1, 6, tzinfo=UTC)
                for n in range(10 * 7 * 4):  # every 6 hours for 10 weeks
                    clock = start + timedelta(hours=6 * n)
                    following.clock = lambda at=clock: at
                    if (clock - start).days // 7 != week:
                        week += 1
                        await egress.fetch(f"{base}/version?v={week}", method="POST")
                    await db.execute("UPDATE follows SET next_check_at = $2 WHERE id = $1", follow.id, clock)
                    total += await following.tick()
                made = len(models.received) - calls_before
                kind = "with ETag (most checks 304)" if etag else "without validators (fingerprint decides)"
                print(f"page changing weekly, {kind}: {made} model calls in {total} checks = "
                      f"{100 * made / total:.1f} per 100 checks")  # fmt: skip
        finally:
            await db.close()
            site.terminate()
            site.join(5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", type=int, default=200)
    asyncio.run(main(parser.parse_args().checks))
