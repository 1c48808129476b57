"""``pepper serve`` as a user runs it starts the research helper as one more child, without the
server's secrets, and its turn workers hand questions to it over the helper's socket."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from web_support import QUESTION, web_with_prices

from core import identity
from core.store import Database
from core.testing.peers import OpenAIPeer, reply_text, reply_tools
from core.testing.processes import alive, children_of, free_port, until, until_healthy
from core.testing.twilio_peer import TwilioPeer
from core.testing.web_peer import WebPeer

# These start the research helper (or pepper serve) as a process of its own.
pytestmark = pytest.mark.slow

TOKEN = "twilio-test-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER, LINE = "+14155552671", "+14155550100"
SECRET_KEY = "c2VjcmV0LWtleS1mb3ItdGVzdHMtb25seS0xMjM0NTY3ODk="


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


async def test_pepper_serve_runs_the_helper_apart_and_answers_through_it(
    db: Database, db_url: str, subprocess_env: dict[str, str], tmp_path: Path
) -> None:
    ada = await identity.create_account(db, "Grace")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await identity.assign_line(db, LINE, "personal", ada.id)
    port = free_port()
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model, WebPeer() as web:
        url = web_with_prices(web)
        env = {
            **subprocess_env, "DATABASE_URL": db_url, "PEPPER_SECRET_KEY": SECRET_KEY, "PEPPER_PUBLIC_URL": PUBLIC,
            "PEPPER_PORT": str(port), "TWILIO_ACCOUNT_SID": twilio.account_sid, "TWILIO_AUTH_TOKEN": TOKEN,
            "PEPPER_TWILIO_API_URL": twilio.api_url, "OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": model.base_url,
            "PEPPER_GRACEFUL_TIMEOUT": "5", "PEPPER_TURN_WORKERS": "1", "PEPPER_MEDIA_PROCESSES": "1",
            "PEPPER_SCHEDULER_ENABLED": "false", "PEPPER_MEMORY_JOBS_INTERVAL": "0", "PEPPER_DATA_DIR": str(tmp_path),
            "PEPPER_WEB_SEARCH_PROVIDER": "searxng", "PEPPER_SEARXNG_URL": web.url,
            "PEPPER_WEB_TEST_LOOPBACK_PORTS": f"[{web.port}]",
        }  # fmt: skip
        with (tmp_path / "serve.log").open("w") as log_file:
            server = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway.cli", "serve", env=env, stderr=log_file
            )
        try:
            [helper] = await until(lambda: children_of(server.pid, b"core.web.helper"), 60, "the research helper")
            environment = _environ(helper)
            assert "DATABASE_URL" not in environment and "PEPPER_SECRET_KEY" not in environment
            assert not any(db_url in v or SECRET_KEY in v for v in environment.values())

            model.script(
                reply_tools(("web_research", {"question": QUESTION})),
                reply_tools(("read_page", {"url": url})),
                reply_text(f"About $6,800 new. Sources: {url}"),
                reply_text(f"About $6,800 new (source: {url})."),
            )
            await until_healthy(f"http://127.0.0.1:{port}")
            async with aiohttp.ClientSession() as session:
                form = twilio.inbound_message(sender=OWNER, to=LINE, body="search the web: RTX 6000 Ada price?")
                status, _ = await twilio.post_form(f"http://127.0.0.1:{port}", PUBLIC, "/twilio/sms", form,
                                                   session=session)  # fmt: skip
                assert status == 200
                [sent] = await twilio.wait_for_sent(1, within=60)
            assert url in sent.body and "$6,800" in sent.body
            assert [p for _, p, _, _ in web.requests] == ["/rtx6000"]
        finally:
            server.send_signal(signal.SIGTERM)
            code = await asyncio.wait_for(server.wait(), 60)
        assert code == 0
        assert not alive(helper)  # the helper stopped with the server
