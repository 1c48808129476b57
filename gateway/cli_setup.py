"""``pepper setup``: a first run that asks for the owner, the PIN and a model provider (and,
optionally, Twilio and the public URL), writes ``pepper.toml`` (mode 0600), makes or finds the
owner's account, and ends with what ``pepper doctor`` prints.

Interactive when ``--name`` is not given: each question is one line on stdin (secrets are read
without echo on a terminal); a wrong answer is explained and asked again. With ``--name`` every
answer comes from the flags (``--pin-stdin`` reads the PIN as one line of stdin, ``--api-key-env``
names the variable holding the provider's key), and a wrong one is a one-line error before anything
is written. Running it again finds the account and updates the file in place (other keys kept).
Secrets are written to the file only, never printed.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import tomllib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from core import identity
from core.errors import ConfigError, InvalidInput, PepperError
from core.settings import Settings
from core.store import open_store
from core.store.queries import Queries

PROVIDERS = ("openai", "anthropic", "google", "compatible")
# Where each provider's key goes in pepper.toml, and the variable that holds it otherwise.
KEY_FIELDS = {"openai": "openai_api_key", "anthropic": "anthropic_api_key", "google": "gemini_api_key"}
KEY_VARIABLES = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY", "google": "GEMINI_API_KEY"}
ATTEMPTS = 3


class SetupError(PepperError):
    code = "setup-failed"


def add_commands(sub: Any) -> None:
    setup = sub.add_parser("setup", help="a first run: the owner, PIN and model provider, written to pepper.toml")
    setup.add_argument("--name", help="the owner's name (given: no questions, every answer from the flags)")
    setup.add_argument("--timezone", default=None, help="IANA zone, e.g. Europe/London (default UTC)")
    setup.add_argument("--phone", help="the owner's mobile number (stored verified)")
    setup.add_argument("--pin-stdin", action="store_true", help="read the owner PIN as one line of stdin")
    setup.add_argument("--provider", choices=PROVIDERS, help="the model provider")
    setup.add_argument("--base-url", help="the OpenAI-compatible endpoint (--provider compatible)")
    setup.add_argument("--model", help="the model name (required with --provider compatible)")
    setup.add_argument("--api-key-env", help="the environment variable holding the provider's API key")
    setup.add_argument("--twilio-account-sid", help="Twilio account SID (AC...)")
    setup.add_argument("--twilio-auth-token-env", help="the environment variable holding the Twilio auth token")
    setup.add_argument("--public-url", help="the public https URL Twilio reaches Pepper at")


async def run(args: argparse.Namespace, settings: Settings, db: Queries, out: Callable[[str], None]) -> bool:
    return False  # `pepper setup` runs before the store opens (gateway.cli calls ``setup``)


def config_path() -> Path:
    explicit = os.environ.get("PEPPER_CONFIG")
    return Path(explicit).expanduser() if explicit else Path("pepper.toml")


class _Answers:
    """Questions on stdin, one line each; secrets without echo on a terminal."""

    def __init__(self) -> None:
        self.tty = sys.stdin.isatty()

    def ask(self, question: str, default: str | None = None, *, secret: bool = False) -> str:
        shown = f"{question} [{default}]: " if default else f"{question}: "
        if secret and self.tty:
            answer = getpass.getpass(shown)
        else:
            print(shown, end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line:
                raise SetupError(f"setup stopped: no answer to {question!r}; nothing was written")
            answer = line.strip()
        return answer or (default or "")

    def until_valid(self, question: str, check: Callable[[str], str], default: str | None = None, **kw: Any) -> str:
        for _ in range(ATTEMPTS):
            try:
                return check(self.ask(question, default, **kw))
            except (InvalidInput, SetupError) as exc:
                print(f"  {exc.message}", file=sys.stderr)
        raise SetupError(f"setup stopped after {ATTEMPTS} wrong answers to {question!r}; nothing was written")


def _name(value: str) -> str:
    if not value.strip():
        raise InvalidInput("a name is needed")
    return value.strip()


def _zone(value: str) -> str:
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(f"unknown time zone {value!r}; write one like Europe/London or America/New_York") from None
    return value


def _provider(value: str) -> str:
    value = value.strip().lower()
    if value not in PROVIDERS:
        raise InvalidInput(f"choose one of {', '.join(PROVIDERS)}")
    return value


def _url(value: str, what: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidInput(f"{what} starts with http:// or https:// and names a server")
    return value.strip().rstrip("/")


def _pin(phones: list[str]) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not identity.PIN_PATTERN.match(value):
            raise InvalidInput("a PIN is 4 to 12 digits")
        reason = identity.weak_pin_reason(value, phones)
        if reason:
            raise InvalidInput(reason)
        return value

    return check


def _from_env(variable: str, what: str) -> str:
    value = os.environ.get(variable, "")
    if not value:
        raise SetupError(f"{variable} is not set; it should hold the {what}")
    return value


def _collect(args: argparse.Namespace, region: str) -> dict[str, Any]:
    """Every answer, checked, before anything is written."""
    a: dict[str, Any] = {}
    phone_check = lambda v: identity.normalize_phone(v, region)  # noqa: E731
    if args.name is not None:  # flags only
        a["name"] = _name(args.name)
        a["timezone"] = _zone(args.timezone or "UTC")
        a["phone"] = phone_check(args.phone) if args.phone else None
        if args.pin_stdin:
            a["pin"] = _pin([a["phone"]] if a["phone"] else [])(sys.stdin.readline().strip())
        if args.provider is None:
            raise SetupError("give --provider openai, anthropic, google or compatible")
        a["provider"] = args.provider
        if args.provider == "compatible":
            if not args.base_url or not args.model:
                raise SetupError("--provider compatible needs --base-url and --model")
            a["base_url"] = _url(args.base_url, "--base-url")
        a["model"] = args.model
        a["api_key"] = _from_env(args.api_key_env, "provider's API key") if args.api_key_env else None
        a["twilio_account_sid"] = args.twilio_account_sid
        if args.twilio_auth_token_env:
            a["twilio_auth_token"] = _from_env(args.twilio_auth_token_env, "Twilio auth token")
        a["public_url"] = _url(args.public_url, "--public-url") if args.public_url else None
        return a
    ask = _Answers()
    a["name"] = ask.until_valid("Your name", _name)
    a["timezone"] = ask.until_valid("Your time zone", _zone, args.timezone or "UTC")
    a["phone"] = ask.until_valid("Your mobile number, with +country code (Enter to skip)",
                                 lambda v: phone_check(v) if v else "") or None  # fmt: skip
    a["pin"] = _ask_pin(ask, [a["phone"]] if a["phone"] else [])
    a["provider"] = ask.until_valid(f"Model provider ({', '.join(PROVIDERS)})", _provider, "openai")
    if a["provider"] == "compatible":
        a["base_url"] = ask.until_valid("Its base URL, e.g. http://127.0.0.1:11434/v1", lambda v: _url(v, "the URL"))
        a["model"] = ask.until_valid("The model name, e.g. llama3.2", _name)
        a["api_key"] = ask.ask("Its API key (Enter if it needs none)", secret=True) or None
    else:
        a["model"] = None
        variable = KEY_VARIABLES[a["provider"]]
        a["api_key"] = ask.ask(f"API key (Enter to leave it to {variable} in the environment)", secret=True) or None
    a["twilio_account_sid"] = ask.ask("Twilio account SID, AC... (Enter to skip Twilio)") or None
    if a["twilio_account_sid"]:
        a["twilio_auth_token"] = ask.ask("Twilio auth token", secret=True) or None
        a["public_url"] = ask.until_valid("Public https URL Twilio reaches Pepper at", lambda v: _url(v, "the URL"))
    return a


def _ask_pin(ask: _Answers, phones: list[str]) -> str | None:
    check = _pin(phones)
    for _ in range(ATTEMPTS):
        answer = ask.ask("Owner PIN, 4 to 12 digits, for calls (Enter to set it later)", secret=True)
        if not answer:
            return None
        try:
            pin = check(answer)
        except InvalidInput as exc:
            print(f"  {exc.message}", file=sys.stderr)
            continue
        if ask.tty and ask.ask("Repeat the PIN", secret=True) != pin:
            print("  the two PINs differ", file=sys.stderr)
            continue
        return pin
    raise SetupError(f"setup stopped after {ATTEMPTS} refused PINs; nothing was written")


def _settings_table(a: dict[str, Any], existing: dict[str, Any]) -> dict[str, Any]:
    table = dict(existing)
    models = dict(table.get("models") or {})
    provider = a["provider"]
    if provider == "compatible":
        models["compatible_base_url"] = a["base_url"]
        models["compatible_model"] = a["model"]
        if a.get("api_key"):
            models["compatible_api_key"] = a["api_key"]
    else:
        if a.get("api_key"):
            table[KEY_FIELDS[provider]] = a["api_key"]
        if a.get("model"):
            models["tiers"] = {tier: {"model": f"{provider_prefix(provider)}{a['model']}"}
                               for tier in ("small", "medium", "large")}  # fmt: skip
    if models:
        table["models"] = models
    for key in ("twilio_account_sid", "twilio_auth_token", "public_url"):
        if a.get(key):
            table[key] = a[key]
    return table


def provider_prefix(provider: str) -> str:
    return {"openai": "openai:", "anthropic": "anthropic:", "google": "google:"}[provider]


def to_toml(table: dict[str, Any]) -> str:
    """A small TOML writer for settings: scalars, nested tables, arrays of scalars or tables."""
    lines: list[str] = []
    _write_table(table, [], lines)
    return "\n".join(lines).lstrip("\n") + "\n"


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise ConfigError(f"cannot write a {type(value).__name__} to TOML")


def _key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else json.dumps(key)


def _write_table(table: dict[str, Any], path: list[str], lines: list[str]) -> None:
    scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in table.items() if isinstance(v, dict)}
    if path and (scalars or not tables):
        lines += ["", "[" + ".".join(_key(p) for p in path) + "]"]
    lines += [f"{_key(k)} = {_value(v)}" for k, v in scalars.items()]
    for key, sub in tables.items():
        _write_table(sub, [*path, key], lines)


def write_config(path: Path, text: str) -> None:
    """Replace the file in one step, readable by this user only (it holds secrets)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


async def setup(
    args: argparse.Namespace,
    out: Callable[[str], None],
    load: Callable[[argparse.Namespace], Settings],
    doctor: Callable[[Settings], Awaitable[int]],
) -> int:
    settings = load(args)  # the settings before: the region numbers are read in, a broken file named
    path = config_path()
    existing: dict[str, Any] = {}
    if path.is_file():
        with path.open("rb") as f:
            existing = tomllib.load(f)
    answers = _collect(args, settings.default_region)
    write_config(path, to_toml(_settings_table(answers, existing)))
    out(f"wrote {path} (readable by you only; secrets in it are not shown here)")
    if path != Path("pepper.toml") or "PEPPER_CONFIG" in os.environ:
        out(f"set PEPPER_CONFIG={path.resolve()} for the next commands")
    settings = load(args)
    async with open_store(settings, serving=False) as db:
        await _owner(db, answers, settings.default_region, out)
    out("")
    return await doctor(settings)


async def _owner(db: Queries, a: dict[str, Any], region: str, out: Callable[[str], None]) -> None:
    found = await identity.accounts_named(db, a["name"])
    if len(found) > 1:
        raise SetupError(f"{len(found)} accounts are named {a['name']!r}; rename one (pepper account rename)")
    if found:
        account = found[0]
        out(f"found the account of {account.name} ({account.id})")
    else:
        account = await identity.create_account(db, a["name"], timezone=a["timezone"])
        out(f"created the account of {account.name} ({account.id}, {account.timezone})")
    if a.get("phone"):
        handle = await identity.find_handle(db, "phone", a["phone"], default_region=region)
        if handle is not None and handle.account_id != account.id:
            raise SetupError("that phone number already belongs to another account")
        if handle is None:
            handle = await identity.add_handle(db, account.id, "phone", a["phone"], verified=True)
        elif not handle.verified:
            handle = await identity.set_handle_verified(db, "phone", handle.value, True)
        out(f"phone {handle.value} is {account.name}'s, verified")
    if a.get("pin"):
        await identity.set_pin(db, account.id, a["pin"])
        out(f"PIN set for {account.name}")
    elif not account.has_pin:
        out(f"no PIN yet: set one with `pepper pin set {json.dumps(account.name)}` before taking calls")
