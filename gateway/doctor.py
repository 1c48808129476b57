"""``pepper doctor``: what is configured, what is missing, the database state and the webhook URLs.

It changes nothing. The exit status is non-zero only when the server could not run. It reads the
settings as ``pepper serve`` does (same files, environment and ``--host/--port/--data-dir`` flags).
With ``--online`` it also tries each configured credential against its provider with one cheap,
read-only call (:func:`check_online`), and a refused one makes the exit status 1.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parseaddr
from types import SimpleNamespace
from typing import Any

from pydantic import SecretStr

from core.errors import ConfigError, PepperError
from core.models.errors import ModelAuthError, ModelError
from core.models.router import KEY_NAMES, configured_providers, describe_tiers, tiers_from_settings
from core.settings import DEFAULT_TWILIO_API_URL, Settings
from core.store import StoreReport, inspect_store
from core.vault import KEY_FILE_NAME, check_keys
from gateway.budget import FEWER_CONNECTIONS, connections_needed
from gateway.webhooks import WEBHOOKS, public_url_for

OK, MISSING, BAD = "ok", "missing", "problem"
ONLINE_TIMEOUT = 20.0


@dataclass
class Check:
    area: str
    status: str  # OK, MISSING or BAD
    detail: str


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    store: StoreReport | None = None
    webhooks: list[tuple[str, str | None, str, bool]] = field(default_factory=list)
    online: list[Check] = field(default_factory=list)  # pepper doctor --online

    @property
    def can_serve(self) -> bool:
        return not any(c.status == BAD for c in self.checks)

    def add(self, area: str, status: str, detail: str) -> None:
        self.checks.append(Check(area, status, detail))


def _set(value: SecretStr | str | None) -> bool:
    if isinstance(value, SecretStr):
        return bool(value.get_secret_value())
    return bool(value)


def _provider(report: Report, name: str, key_var: str, key: SecretStr | None, base_var: str, base: str | None) -> None:
    if _set(key):
        where = f"{base_var}={base}" if base else "the provider's default endpoint"
        report.add(f"model: {name}", OK, f"{key_var} is set; calls go to {where}")
    else:
        report.add(f"model: {name}", MISSING, f"{key_var} is not set")


async def diagnose(settings: Settings, served_paths: set[str], *, inspect: bool = True) -> Report:
    """What is set up and what is missing. ``inspect=False`` leaves the store out (the running
    server's settings page: its own store is the one serving)."""
    report = Report()
    report.add("config file", OK, str(settings.config_file) if settings.config_file else "none (environment only)")
    report.add("listen", OK, f"http://{settings.host}:{settings.port}")

    if inspect:
        store = await inspect_store(settings)
        report.store = store
        if store.problem:
            report.add(f"database ({store.kind})", BAD, store.problem)
        else:
            parts = [f"{store.location}: {store.state}"]
            if store.pending_migrations is not None:
                parts.append(
                    f"schema version {store.schema_version or 0}, {store.pending_migrations} migration(s) "
                    "to apply at next start"
                )
            if store.accounts is not None:
                parts.append(f"{store.accounts} account(s), {len(store.lines)} Twilio line(s)")
            report.add(f"database ({store.kind})", OK, "; ".join(parts))
            if store.connection_limit is not None:
                wanted = connections_needed(settings)
                fits = wanted <= store.connection_limit
                report.add(
                    "database connections", OK if fits else BAD,
                    f"Pepper may open {wanted} of the {store.connection_limit} the server allows"
                    + ("" if fits else f"; {FEWER_CONNECTIONS}"),
                )  # fmt: skip

    _provider(report, "OpenAI", "OPENAI_API_KEY", settings.openai_api_key, "OPENAI_BASE_URL", settings.openai_base_url)
    _provider(
        report,
        "Anthropic",
        "ANTHROPIC_API_KEY",
        settings.anthropic_api_key,
        "ANTHROPIC_BASE_URL",
        settings.anthropic_base_url,
    )
    _provider(
        report,
        "Google Gemini",
        "GEMINI_API_KEY",
        settings.gemini_api_key,
        "GOOGLE_GEMINI_BASE_URL",
        settings.gemini_base_url,
    )
    if settings.models.compatible_base_url:
        report.add("model: OpenAI-compatible", OK, f"calls go to {settings.models.compatible_base_url}")
    tiers = tiers_from_settings(settings)
    if not tiers:
        report.add("models", MISSING, "no model provider is configured: conversations need one of the keys above")
    providers = set(configured_providers(settings))
    for name, line in describe_tiers(tiers):
        needed = {c.provider for c in tiers[name].mix} - providers
        status, detail = OK, line
        if needed:
            status = MISSING
            detail = f"{line} (set {', '.join(sorted(KEY_NAMES[p] for p in needed))})"
        report.add(f"model tier: {name}", status, detail)

    twilio_missing = [name for name, value in (
        ("TWILIO_ACCOUNT_SID", settings.twilio_account_sid),
        ("TWILIO_AUTH_TOKEN", settings.twilio_auth_token),
        ("PEPPER_PUBLIC_URL", settings.public_url),
    ) if not _set(value)]  # fmt: skip
    if twilio_missing:
        report.add(
            "channel: Twilio calls, SMS, WhatsApp",
            MISSING,
            f"set {', '.join(twilio_missing)} (the public URL is what Twilio signs)",
        )
    else:
        api = "" if settings.twilio_api_url == DEFAULT_TWILIO_API_URL else f"; REST API at {settings.twilio_api_url}"
        report.add("channel: Twilio calls, SMS, WhatsApp", OK, f"account {settings.twilio_account_sid}{api}")
    _email(report, settings)
    if settings.public_url and settings.public_url.startswith("http://"):
        report.add("public URL", MISSING, "PEPPER_PUBLIC_URL is plain http; Twilio needs https in production")
    _connections(report, settings)
    report.add(
        "speech: Deepgram",
        OK if _set(settings.deepgram_api_key) else MISSING,
        "DEEPGRAM_API_KEY is set"
        if _set(settings.deepgram_api_key)
        else "DEEPGRAM_API_KEY is not set (optional: the offline cascade uses local speech models)",
    )

    _voice(report, settings)
    _web(report, settings)
    if report.store is not None:  # the web app's settings page leaves the store out
        _slots(report, report.store)
    _rooms(report, settings)

    for hook in WEBHOOKS:
        report.webhooks.append((hook.name, public_url_for(settings, hook), hook.where, hook.path in served_paths))
    return report


def _slots(report: Report, store: StoreReport) -> None:
    """A slot setting whose occupant cannot answer (removed, renamed, never claimed the slot)."""
    from gateway.cli_slots import slots

    reg = slots()
    for where, slot, occupant in store.slot_settings:
        problem = None if occupant == "builtin" or slot not in reg.specs else reg.problem(slot, occupant)
        if problem is not None:
            report.add(f"slot: {slot} ({where})", MISSING,
                       f"{occupant} {problem}: using the default instead (pepper slot clear {slot})")  # fmt: skip
        else:
            report.add(f"slot: {slot} ({where})", OK, f"occupied by {occupant}")


def _voice(report: Report, settings: Settings) -> None:
    """What the server will do with calls: the same decision ``voice.engines`` makes when it builds
    the default engine (a missing key means every call on it apologises and hangs up)."""
    from voice.engines import engine_available, engine_unready, resolve_engine

    area, engine = "phone calls: voice engine", resolve_engine(settings)
    if not engine_available(engine):
        report.add(area, BAD, f"PEPPER_VOICE_ENGINE={engine} is not part of this build")
        return
    _transports(report, settings, engine)
    # The server's router has one adapter per configured provider (ModelRouter.from_settings);
    # the same names stand in for it here, without building SDK clients that would need closing.
    models = SimpleNamespace(adapters=configured_providers(settings))
    unready = engine_unready(settings, engine, models)
    if unready:
        report.add(area, MISSING, f"{engine} {unready}; until then every call on it hears an apology")
    else:
        report.add(area, OK, f"{engine} by default (a line may name another: pepper line engine)")


def _transports(report: Report, settings: Settings, default_engine: str) -> None:
    """How calls reach the voice model, by default and on each line that takes them over SIP direct."""
    from voice.engines import sip_line_problems

    needs = "SIP direct needs the gpt-live engine, OPENAI_API_KEY and OPENAI_WEBHOOK_SECRET"
    problems = sip_line_problems(default_engine, settings) if settings.voice_transport == "sip" else []
    report.add("phone calls: transport", MISSING if problems else OK,
               "; ".join(problems) if problems else f"{settings.voice_transport} by default (a line may name the"
               f" other: pepper line transport); {needs}")  # fmt: skip
    store = report.store
    kinds = {number: kind for number, kind, _ in store.lines} if store is not None else {}
    for number, engine, transport in store.line_voice if store is not None else ():
        if (transport or settings.voice_transport) != "sip":
            continue
        problems = sip_line_problems(engine or default_engine, settings, kinds.get(number, "personal"))
        report.add(f"phone calls: line {number}", MISSING if problems else OK,
                   "; ".join(problems) if problems else "over SIP direct on gpt-live")  # fmt: skip


def _web(report: Report, settings: Settings) -> None:
    from core.web.search import search_choice

    area = "web research"
    if settings.web_test_loopback_ports:
        report.add(area, BAD, "PEPPER_WEB_TEST_LOOPBACK_PORTS is set: it is for tests only and opens loopback ports")
        return
    try:
        provider = search_choice(settings)
    except ConfigError as exc:
        report.add(area, BAD, exc.message)
        return
    if provider is None:
        report.add(
            area,
            MISSING,
            "set BRAVE_API_KEY, TAVILY_API_KEY or PEPPER_SEARXNG_URL, or PEPPER_WEB_SEARCH_PROVIDER=hosted"
            " (optional; docs/research.md)",
        )
        return
    report.add(area, OK, f"{provider}; the research helper runs on the {settings.web_research_tier} tier")


def _rooms(report: Report, settings: Settings) -> None:
    """Where the rooms' homeserver is (docs/rooms.md); without a login Pepper cannot follow them."""
    area = "rooms: Matrix homeserver"
    if not settings.rooms_enabled:
        report.add(area, OK, "rooms are off (PEPPER_ROOMS_ENABLED=false)")
    elif settings.matrix_homeserver is None:
        where = settings.data_dir / "matrix" / "synapse"
        report.add(area, OK, f"embedded Synapse on 127.0.0.1:{settings.matrix_port} (users @name:"
                             f"{settings.matrix_server_name}), config in {where}")  # fmt: skip
    elif not settings.matrix_user.startswith("@"):
        report.add(area, MISSING, "PEPPER_MATRIX_USER must be Pepper's full Matrix ID (@name:server) on"
                                  f" {settings.matrix_homeserver}; until then rooms are off")  # fmt: skip
    elif not _set(settings.matrix_password) and not _set(settings.matrix_access_token):
        report.add(area, MISSING, f"set PEPPER_MATRIX_PASSWORD or PEPPER_MATRIX_ACCESS_TOKEN to log into"
                                  f" {settings.matrix_homeserver}; until then rooms are off")  # fmt: skip
    else:
        report.add(area, OK, f"{settings.matrix_homeserver} as {settings.matrix_user}")


def _email(report: Report, settings: Settings) -> None:
    area = "channel: email"
    if settings.smtp_from and "@" not in parseaddr(settings.smtp_from)[1]:
        report.add(area, BAD, "PEPPER_SMTP_FROM is not an email address (e.g. 'Pepper <pepper@example.org>')")
        return
    missing = [name for name, value in (
        ("PEPPER_EMAIL_WEBHOOK_SIGNING_KEY", settings.email_webhook_signing_key),
        ("PEPPER_PUBLIC_URL", settings.public_url),
        ("PEPPER_SMTP_HOST", settings.smtp_host),
        ("PEPPER_SMTP_FROM", settings.smtp_from),
    ) if not _set(value)]  # fmt: skip
    if missing:
        report.add(area, MISSING, f"set {', '.join(missing)} (inbound mail webhook and SMTP replies)")
        return
    where = f"{settings.smtp_host}:{settings.smtp_port} ({settings.smtp_security})"
    detail = f"replies from {settings.smtp_from} via {where}"
    if not settings.email_require_sender_auth:
        detail += "; sender DKIM/SPF check is OFF"
    report.add(area, OK, detail)


def _connections(report: Report, settings: Settings) -> None:
    _secret_key(report, settings)
    missing = [name for name, value in (
        ("PEPPER_GOOGLE_CLIENT_ID", settings.google_client_id),
        ("PEPPER_GOOGLE_CLIENT_SECRET", settings.google_client_secret),
        ("PEPPER_PUBLIC_URL", settings.public_url),
    ) if not _set(value)]  # fmt: skip
    if missing:
        report.add("connect: Google", MISSING, f"set {', '.join(missing)} to connect Google Calendar and Gmail")
    else:
        report.add("connect: Google", OK, f"client {settings.google_client_id}; redirect URI listed below")


def _secret_key(report: Report, settings: Settings) -> None:
    """The key connection secrets are sealed with, parsed as the vault will (never shown)."""
    area = "connection secrets"
    if settings.secret_key is not None and settings.secret_key.get_secret_value().strip():
        where, text = "PEPPER_SECRET_KEY", settings.secret_key.get_secret_value()
    else:
        key_file = settings.data_dir / KEY_FILE_NAME
        where = f"the key file {key_file}"
        try:
            text = key_file.read_text(encoding="ascii")
        except FileNotFoundError:
            report.add(area, OK, f"a key is made in {key_file} when the first secret is sealed (back it up)")
            return
        except (OSError, UnicodeDecodeError) as exc:
            report.add(area, BAD, f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}")
            return
    try:
        count = check_keys(text, where)
    except ConfigError as exc:
        report.add(area, BAD, f"{exc.message}; make one as docs/connections.md says, or fix the value")
        return
    extra = f" (and {count - 1} older key{'s' if count > 2 else ''} that still open)" if count > 1 else ""
    backup = "" if where == "PEPPER_SECRET_KEY" else " (back it up with the database)"
    report.add(area, OK, f"sealed with the key in {where}{extra}{backup}")


async def check_online(settings: Settings) -> list[Check]:
    """One read-only call per configured credential: Twilio's account fetch, each model provider's
    model list, an SMTP login, and a token refresh per stored Google connection. BAD says why."""
    checks: list[Check] = []

    async def attempt(area: str, call: Any, ok: Callable[[Any], str]) -> None:
        try:
            result = await asyncio.wait_for(call, ONLINE_TIMEOUT)
        except TimeoutError:
            checks.append(Check(area, BAD, f"no answer within {ONLINE_TIMEOUT:.0f} s"))
        except ModelError as exc:
            refused = exc.status in (401, 403) or isinstance(exc, ModelAuthError)
            checks.append(Check(area, BAD, f"the API key was refused (HTTP {exc.status})" if refused else exc.message))
        except PepperError as exc:
            checks.append(Check(area, BAD, exc.message))
        else:
            checks.append(Check(area, OK, ok(result)))

    if _set(settings.twilio_account_sid) and _set(settings.twilio_auth_token):
        from core.adapters.twilio.rest import check_account

        await attempt("online: Twilio", check_account(settings), lambda status: f"account {status}")
    from core.models.router import ModelRouter

    router = ModelRouter.from_settings(settings)
    try:
        for provider, adapter in router.adapters.items():
            listed: list[str] = []

            def works(names: list[str], listed: list[str] = listed) -> str:
                listed.extend(names)
                return f"the key works ({len(names)} model(s) listed)"

            await attempt(f"online: model {provider}", adapter.list_models(), works)
            if listed:
                checks.extend(voice_model_checks(settings, provider, listed))
    finally:
        for adapter in router.adapters.values():
            with contextlib.suppress(Exception):
                await adapter.aclose()
    if settings.smtp_host:
        from gateway.mailer import check_login

        who = "logged in" if settings.smtp_username else "connected (no PEPPER_SMTP_USERNAME to log in with)"
        await attempt("online: SMTP", check_login(settings), lambda _: f"{who} at {settings.smtp_host}")
    await _google_online(settings, attempt, checks)
    await _imap_online(settings, attempt, checks)
    return checks


def voice_model_checks(settings: Settings, provider: str, listed: list[str]) -> list[Check]:
    """Whether each voice model this provider's key would run (``core.models.voice_models``, as
    configured) is in the provider's model list. Google lists only its first page to the check:
    a model not on it is not known to be missing."""
    from core.models.voice_models import VOICE_MODELS

    names = {name.removeprefix("models/") for name in listed}
    out = []
    for model in VOICE_MODELS:
        if model.provider != provider:
            continue
        name = getattr(settings, model.setting)
        area = f"online: voice model {model.engine}"
        if name in names:
            out.append(Check(area, OK, f"{name} is offered"))
        elif provider == "google":
            out.append(Check(area, MISSING, f"{name} is not on the first page of models listed; not checked"))
        else:
            current = ", ".join(model.current)
            out.append(Check(area, BAD, f"{name} is not offered by {provider} (set {model.env}; current: {current})"))
    return out


async def _google_online(settings: Settings, attempt: Any, checks: list[Check]) -> None:
    if not (_set(settings.google_client_id) and _set(settings.google_client_secret)):
        return
    from core.records.connections import google_connections
    from core.store import open_store
    from core.tools.connectors import Connectors
    from core.tools.google_api import check_refresh

    try:
        async with open_store(settings, serving=False) as db:
            connectors = Connectors.from_settings(settings)
            for n, connection_id in enumerate(await google_connections(db), 1):
                await attempt(f"online: Google connection {n}", check_refresh(db, connectors, connection_id),
                              lambda _: "the token refreshes")  # fmt: skip
    except PepperError as exc:
        checks.append(Check("online: Google", BAD, f"cannot read the connections: {exc.message}"))


async def _imap_online(settings: Settings, attempt: Any, checks: list[Check]) -> None:
    """Sign in to each connected IMAP mailbox (INBOX opened read-only, nothing kept)."""
    from core.records.connections import imap_connections
    from core.store import open_store
    from core.tools.areas.mail import check_mailbox
    from core.tools.connectors import Connectors

    try:
        async with open_store(settings, serving=False) as db:
            connectors = Connectors.from_settings(settings)
            for row in await imap_connections(db):
                await attempt(f"online: IMAP mailbox {row['label']}", check_mailbox(db, connectors, row),
                              lambda count: f"signs in; INBOX holds {count} message(s)")  # fmt: skip
    except PepperError as exc:
        checks.append(Check("online: IMAP", BAD, f"cannot read the connections: {exc.message}"))


def render(report: Report) -> str:
    mark = {OK: "  ok     ", MISSING: "  --     ", BAD: "  FAIL   "}
    width = max(len(c.area) for c in report.checks)
    lines = ["Pepper doctor", ""]
    lines += [f"{mark[c.status]}{c.area.ljust(width)}  {c.detail}" for c in report.checks]
    if report.online:
        lines += ["", "Online checks (one read-only call each):"]
        width = max(len(c.area) for c in report.online)
        lines += [f"{mark[c.status]}{c.area.ljust(width)}  {c.detail}" for c in report.online]
    lines += ["", "Webhook URLs (paste each where it says):"]
    if all(url is None for _, url, _, _ in report.webhooks):
        lines.append("  set PEPPER_PUBLIC_URL (the https address Twilio and the mail provider reach) to see them")
    else:
        for name, url, where, served in report.webhooks:
            note = "" if served else "   [not served by this version yet]"
            lines.append(f"  {name:<15} {url}{note}")
            lines.append(f"  {'':<15} -> {where}")
    lines.append("")
    lines.append("ready to serve" if report.can_serve else "cannot serve: fix the FAIL lines above")
    failed = [c.area.removeprefix("online: ") for c in report.online if c.status == BAD]
    if failed:
        lines.append(f"online checks failed: {', '.join(failed)}")
    return "\n".join(lines)
