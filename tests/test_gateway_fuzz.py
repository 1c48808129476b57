"""Every HTTP route, fuzzed from the server's own OpenAPI description (``/openapi.json``) with
schemathesis and hypothesis: well-formed and malformed requests, unsigned and signed, signed out
and signed in. Zero 5xx, zero unhandled exceptions in the log, every refused request a 4xx, and
nothing recorded for a refused one.

Examples are derandomized (the same cases each run) so a failure here is a finding to fix, never
a flake; the case that failed is printed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from core import access, identity
from core.adapters.twilio.signatures import sign
from core.settings import Settings
from core.store import Database
from core.testing.peers import OpenAIPeer
from core.testing.twilio_peer import TwilioPeer
from gateway.server import running_app
from gateway.webchat import COOKIE

TOKEN = "twilio-fuzz-auth-token"
PUBLIC = "https://pepper.example.org"
OWNER = "+14155552671"
LINE = "+14155550100"
EXAMPLES = 6  # per operation and mode: about 500 requests in all
# Recorded when a request is refused, by design: the security log says what was refused.
REFUSALS_LOGGED = {"security_events"}


@dataclass
class Fuzzed:
    mode: str
    method: str
    path: str
    status: int
    case: str
    location: str = ""

    @property
    def refused(self) -> bool:
        # The sign-in form answers a browser: a refusal sends it back to the page with the error.
        return 400 <= self.status < 500 or (self.status in {302, 303} and "error=" in self.location)


@dataclass
class Server:
    db: Database
    base: str
    doc: dict[str, Any]
    account_id: Any
    cookie: str
    csrf: str


@pytest.fixture
async def server(db: Database, db_url: str) -> AsyncIterator[Server]:
    ada = await identity.create_account(db, "Ada")
    await identity.add_handle(db, ada.id, "phone", OWNER, verified=True)
    await identity.assign_line(db, LINE, "personal", ada.id)
    cookie, session = await access.create_session(db, ada.id)
    async with TwilioPeer(auth_token=TOKEN) as twilio, OpenAIPeer() as model:
        config = Settings(
            database_url=db_url, public_url=PUBLIC, twilio_account_sid=twilio.account_sid, twilio_auth_token=TOKEN,
            twilio_api_url=twilio.api_url, openai_api_key="sk-test", openai_base_url=model.base_url, port=0,
        )  # fmt: skip
        async with running_app(config, db) as (_, port), httpx.AsyncClient() as client:
            base = f"http://127.0.0.1:{port}"
            doc = (await client.get(base + "/openapi.json")).json()
            yield Server(db, base, doc, ada.id, cookie, session.csrf_token)


def _fuzz(
    server: Server,
    *,
    modes: tuple[GenerationMode, ...],
    cookies: dict[str, str] | None = None,
    signed: bool = False,
    csrf: str | None = None,
    only: Callable[[Any], bool] = lambda op: True,
) -> list[Fuzzed]:
    """Run every operation's cases against the server (from a thread: the server runs on the test's
    event loop) and return each request's status."""
    schema = schemathesis.openapi.from_dict(server.doc)
    seen: list[Fuzzed] = []
    with requests.Session() as session:  # one kept-alive connection, not one per case
        for result in schema.get_all_operations():
            operation = result.ok()
            if only(operation):
                for mode in modes if _has_input(operation) else (GenerationMode.POSITIVE,):
                    _cases(server, operation, mode, seen, session, cookies=cookies, signed=signed, csrf=csrf)
    return seen


def _has_input(operation: Any) -> bool:
    """Whether a malformed request can be made of more than its path: a body or a query. (A path
    segment is text whatever it holds, and any text is fuzzed in the well-formed cases already.)"""
    raw = operation.definition.raw
    return "requestBody" in raw or any(p["in"] == "query" for p in raw.get("parameters", []))


def _cases(
    server: Server,
    operation: Any,
    mode: GenerationMode,
    seen: list[Fuzzed],
    session: requests.Session,
    *,
    cookies: Any,
    signed: bool,
    csrf: str | None,
) -> None:
    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
        suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate],
    )  # fmt: skip
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        headers = {"Origin": server.base}
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf  # past the CSRF check, into each handler's own parsing
        if signed and isinstance(case.body, dict) and operation.path.startswith("/twilio/"):
            form = {str(k): str(v) for k, v in case.body.items()}
            case.body = form
            headers["X-Twilio-Signature"] = sign(TOKEN, PUBLIC + case.formatted_path, form)
        response = case.call(
            base_url=server.base, session=session, headers=headers, cookies=cookies, timeout=15, allow_redirects=False
        )
        seen.append(Fuzzed(mode.value, operation.method.upper(), operation.path, response.status_code,
                           repr(case)[:600], ",".join(response.headers.get("location", []))))  # fmt: skip

    try:
        one()
    except Unsatisfiable:
        # Nothing to make malformed (a GET with no parameters): no negative cases exist.
        assert mode is GenerationMode.NEGATIVE


async def _row_counts(db: Database) -> dict[str, int]:
    tables = await db.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename NOT LIKE 'schema_%' ORDER BY 1"
    )
    return {row["tablename"]: await db.fetchval(f'SELECT count(*) FROM "{row["tablename"]}"') for row in tables}


def _tally(record: Callable[[str, object], None], seen: list[Fuzzed]) -> None:
    """What the case sent, for ``scripts/suite-fuzz``'s summary line (pytest's user properties)."""
    record("requests", len(seen))
    record("5xx", sum(f.status >= 500 for f in seen))
    record("refused", sum(f.refused for f in seen))


def _no_5xx(seen: list[Fuzzed]) -> None:
    failures = [f for f in seen if f.status >= 500]
    assert not failures, "\n".join(f"{f.method} {f.path} -> {f.status}: {f.case}" for f in failures[:5])


def _no_unhandled(caplog: pytest.LogCaptureFixture) -> None:
    unhandled = [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]
    assert not unhandled, "\n".join(f"{r.name}: {r.getMessage()}" for r in unhandled[:5])


async def test_the_description_lists_every_route_and_is_valid_openapi(server: Server):
    schema = schemathesis.openapi.from_dict(server.doc)
    operations = {(op.ok().method.upper(), op.ok().path) for op in schema.get_all_operations()}
    for must in [("POST", "/twilio/sms"), ("POST", "/api/messages"), ("GET", "/openapi.json"),
                 ("POST", "/api/drafts/{kind}/{draft_id}/{action}"), ("GET", "/healthz")]:  # fmt: skip
        assert must in operations
    assert len(operations) >= 40
    sms = server.doc["paths"]["/twilio/sms"]["post"]
    assert "X-Twilio-Signature" in [p["name"] for p in sms["parameters"]]
    assert "application/x-www-form-urlencoded" in sms["requestBody"]["content"]


async def test_unsigned_and_signed_out_requests_are_refused_with_4xx_and_leave_nothing(server, caplog, record_property):
    caplog.set_level(logging.WARNING)
    before = await _row_counts(server.db)
    seen = await asyncio.to_thread(_fuzz, server, modes=(GenerationMode.POSITIVE, GenerationMode.NEGATIVE))
    _tally(record_property, seen)
    assert len(seen) > 250
    _no_5xx(seen)
    # A change of state (any POST or DELETE) or the API, signed out or unsigned: refused.
    unrefused = [f for f in seen if (f.method != "GET" or f.path.startswith("/api/")) and not f.refused]
    assert not unrefused, "\n".join(f"{f.method} {f.path} -> {f.status}: {f.case}" for f in unrefused[:5])
    after = await _row_counts(server.db)
    changed = {t: (before[t], after.get(t)) for t in before if after.get(t) != before[t] and t not in REFUSALS_LOGGED}
    record_property("tables changed by refused requests", len(changed))
    assert not changed, f"refused requests left rows behind: {changed}"
    _no_unhandled(caplog)


async def test_signed_in_api_requests_never_answer_5xx(server, caplog, record_property):
    """Signed in (a session cookie, our own Origin), every API route takes fuzzed paths, queries
    and bodies; the event stream, which stays open by design, is left to the chat's own tests."""
    caplog.set_level(logging.WARNING)
    seen = await asyncio.to_thread(
        _fuzz, server, modes=(GenerationMode.POSITIVE, GenerationMode.NEGATIVE), cookies={COOKIE: server.cookie},
        csrf=server.csrf, only=lambda op: not op.definition.raw.get("x-pepper-stream") and op.path != "/chat/logout",
    )  # fmt: skip
    _tally(record_property, seen)
    assert len(seen) > 200
    _no_5xx(seen)
    assert any(f.status == 400 for f in seen), "no malformed body was told so"
    # With the session's CSRF token the state-changing requests reach their handlers: most answer
    # for themselves (400 malformed, 404 not found, 2xx done), not with the CSRF refusal.
    posts = [f for f in seen if f.method == "POST" and f.path.startswith("/api/")]
    assert posts and sum(f.status == 403 for f in posts) < len(posts) / 2, [(f.path, f.status) for f in posts[:20]]
    _no_unhandled(caplog)
    # Still signed in: the fuzzing did not end the session it used.
    assert await access.session_for(server.db, server.cookie) is not None


async def test_signed_twilio_webhooks_with_fuzzed_forms_never_answer_5xx(server, caplog, record_property):
    """Correctly signed, so they pass the signature check and reach the handlers' own parsing."""
    caplog.set_level(logging.WARNING)
    seen = await asyncio.to_thread(
        _fuzz, server, modes=(GenerationMode.POSITIVE, GenerationMode.NEGATIVE), signed=True,
        only=lambda op: op.path.startswith("/twilio/"),
    )  # fmt: skip
    _tally(record_property, seen)
    assert len(seen) > 30
    _no_5xx(seen)
    assert any(200 <= f.status < 300 for f in seen), "no signed webhook was accepted"
    _no_unhandled(caplog)
    assert urlsplit(PUBLIC).scheme == "https"
