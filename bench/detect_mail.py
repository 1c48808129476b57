"""The mail-event detector reading a Gmail mailbox (the loopback Google peer): 50 messages in the
window, every fifth an invitation (inline ``text/calendar`` and ``invite.ics``), the others with
a date and time or none.

Each run is ``run_detectors`` with every detector promoted and nothing on the calendar. Three
kinds of run, alternated: **first read** (the read-once cache emptied: list, 50 gets and 10
attachment gets), **repeat** (the cache kept: one list call), and the **baseline**: the same run
with Pepper's inbox only (no Gmail). Prints the median and p99 and the Gmail calls per run.

    PYTHONPATH=. .venv/bin/python bench/detect_mail.py [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import UTC, datetime, timedelta

from core.identity import add_handle, create_account
from core.quality.detectors import SUGGESTERS, promote
from core.suggestions import run_detectors
from core.suggestions.mail import DEFAULT_SOURCES, SEEN
from core.testing.figures import ms_figures
from core.testing.google_api_peer import GoogleApiPeer
from core.testing.postgres import bench_database
from core.tools.connectors import GMAIL_READONLY, Connectors
from core.tools.google_api import exchange_code
from core.vault import Vault, generate_key

NOW = datetime(2026, 3, 2, 7, 0, tzinfo=UTC)  # a Monday
INVITE = (
    "BEGIN:VCALENDAR\r\nVERSION:2.0\r\nMETHOD:REQUEST\r\nPRODID:-//bench//EN\r\nBEGIN:VEVENT\r\nUID:{uid}\r\n"
    "DTSTAMP:20260301T000000Z\r\nDTSTART:20260305T170000Z\r\nDTEND:20260305T180000Z\r\nSUMMARY:Invited {uid}\r\n"
    "END:VEVENT\r\nEND:VCALENDAR\r\n"
)


async def bench(runs: int) -> None:
    async with bench_database() as db:
        async with GoogleApiPeer() as google:
            google.now = NOW
            connectors = Connectors(
                google_api_url=google.url, google_token_url=google.token_url, google_client_id="client-id",
                google_client_secret="client-secret", allow_private_hosts=True, vault=Vault(generate_key()),
            )  # fmt: skip
            account = await create_account(db, "Bench", timezone="Europe/Paris")
            await add_handle(db, account.id, "email", "ada@example.org", verified=True)
            code = google.issue_code("https://pepper.test/cb", GMAIL_READONLY)
            await exchange_code(db, connectors, account.id, code, "https://pepper.test/cb")
            for i in range(50):
                when = NOW - timedelta(hours=3 * i + 1)
                if i % 5 == 0:
                    google.add_mail(f"s{i}@example.org", f"Invitation {i}", "You are invited.", when=when,
                                    invitation=INVITE.format(uid=f"u{i}"))  # fmt: skip
                else:
                    text = f"Dinner {i} on 4 March at 19:30?" if i % 2 else f"Just a message {i}, " * 40
                    google.add_mail(f"s{i}@example.org", f"Mail {i}", text, when=when)
            for name in SUGGESTERS:
                await promote(db, name, NOW)
            kinds: dict[str, list[float]] = {"first read": [], "repeat": [], "baseline": []}
            calls: dict[str, int] = {}
            report = None
            for n in range(runs + 3):
                for kind in kinds:
                    if kind == "first read":
                        SEEN.clear()
                    before = len(google.requests)
                    t = time.perf_counter()
                    sources = DEFAULT_SOURCES if kind == "baseline" else None
                    report = await run_detectors(db, connectors, account.id, NOW, sources=sources)
                    if kind == "repeat":
                        assert report.found.get("mail-event") == 30, report  # 10 invitations, 20 dated
                    if n >= 3:  # warm-up
                        kinds[kind].append((time.perf_counter() - t) * 1000)
                    calls[kind] = len(google.requests) - before
            assert report is not None and not report.unavailable, report
        found = report.found.get("mail-event")
        print(f"{runs} runs of each; mail-event found in the last run (Pepper's inbox only): {found}")
        for kind, times in kinds.items():
            print(f"  {kind:<11} {ms_figures(times)}   Gmail calls per run: {calls[kind]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(bench(parser.parse_args().runs))


if __name__ == "__main__":
    main()
