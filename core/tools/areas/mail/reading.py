"""Reading mail: Gmail (read-only scope), every IMAP mailbox the person connected, and Pepper's own
inbox (mail that reached Pepper's address), behind one interface (:class:`Source`).

A query is written in Gmail's search syntax. Gmail gets it as it is; IMAP and Pepper's inbox get
the subset :func:`parse_query` understands (``from:``, ``to:``, ``subject:``, ``is:unread``,
``is:read``, ``after:``/``before:`` dates, ``newer_than:``/``older_than:`` with d/m/y, and free
words), and the result names any operator they ignored.

Every message reaches the model through ``core.untrusted.mail_block``: labelled untrusted, its
sender and text quoted. A result says "found nothing" only when every source answered; a source
that failed is named in the result, and its mail is said to be missing.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import logging
import re
import shlex
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from email.utils import getaddresses, parseaddr, parsedate_to_datetime
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

from core.adapters import imap
from core.errors import InvalidInput, PepperError
from core.mailtext import html_to_text, strip_quoted
from core.records import connections, inbox
from core.store.queries import Queries
from core.tools.connectors import GMAIL_READONLY, MAILBOX, Connectors, opened_secret, seal
from core.tools.google_api import GoogleClient, google_connection
from core.tools.registry import Tool, ToolContext, ToolOutcome
from core.untrusted import mail_block

log = logging.getLogger(__name__)

SNIPPET_CHARS = 400
THREAD_CHARS = 4000
SUMMARY_CHARS = 600
MAX_RESULTS = 25


# --- The query -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    text: str
    senders: tuple[str, ...] = ()
    recipients: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    unread: bool | None = None
    since: date | None = None
    before: date | None = None
    folder: str = ""  # in:... (IMAP and Pepper's inbox read only received mail, the INBOX)
    ignored: tuple[str, ...] = ()  # operators only Gmail understands

    def outside_inbox(self) -> str:
        """Why a mailbox of received mail only matches nothing ("" when it may match)."""
        if self.folder in ("", "inbox", "anywhere"):
            return ""
        return f"reads only received mail, so in:{self.folder} matches none of it"


_AGE = re.compile(r"^(\d{1,4})([dmy])$")


def _date(value: str) -> date:
    try:
        return date.fromisoformat(value.replace("/", "-"))
    except ValueError:
        parts = value.replace("-", "/").split("/")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            return date(int(parts[0]), int(parts[1]), int(parts[2]))
        raise InvalidInput(f"{value!r} is not a date (write 2025/03/27)") from None


def _age(value: str, today: date) -> date:
    found = _AGE.match(value.lower())
    if found is None:
        raise InvalidInput(f"{value!r} is not an age (write 2d, 3m or 1y)")
    n, unit = int(found[1]), found[2]
    return today - timedelta(days=n * {"d": 1, "m": 30, "y": 365}[unit])


def parse_query(text: str, today: date) -> Query:
    """The Gmail-syntax query as the subset IMAP and Pepper's inbox can run. ``InvalidInput`` for
    an unclosed quote or a bad date."""
    try:
        tokens = shlex.split(text)
    except ValueError:
        raise InvalidInput("the search has an unclosed quote") from None
    found: dict[str, list[str]] = {"from": [], "to": [], "subject": [], "words": [], "ignored": []}
    unread: bool | None = None
    since: date | None = None
    before: date | None = None
    folder = ""
    for token in tokens:
        key, sep, value = token.partition(":")
        key = key.lower()
        if not sep or not value or not re.fullmatch(r"[a-z_]+", key):
            found["words"].append(token)
        elif key in ("from", "to", "subject"):
            found[key].append(value)
        elif key == "is" and value.lower() in ("unread", "read"):
            unread = value.lower() == "unread"
        elif key == "in":
            folder = value.lower()
        elif key in ("after", "since"):
            since = _date(value)
        elif key == "before":
            before = _date(value)
        elif key == "newer_than":
            since = _age(value, today)
        elif key == "older_than":
            before = _age(value, today)
        else:
            found["ignored"].append(token)
    return Query(
        text, tuple(found["from"]), tuple(found["to"]), tuple(found["subject"]), tuple(found["words"]),
        unread, since, before, folder, tuple(found["ignored"]),
    )  # fmt: skip


# --- One message, from any source ------------------------------------------------------------------


@dataclass(frozen=True)
class Mail:
    thread: str  # what mail_read_thread takes: "<source key>:<id>"
    sender_name: str
    sender: str
    to: tuple[str, ...]
    subject: str
    sent_at: datetime | None
    text: str
    unread: bool | None  # None: the source keeps no read state


@dataclass
class Found:
    mails: list[Mail] = field(default_factory=list)
    matched: int = 0
    note: str = ""


class Source:
    """One mailbox. ``key`` starts its thread references; ``name`` is how results name it."""

    key: str
    name: str

    async def search(self, query: Query, limit: int) -> Found:
        raise NotImplementedError

    async def thread(self, ref: str) -> list[Mail]:
        raise NotImplementedError


def _day_start(day: date) -> datetime:
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


# --- Gmail -------------------------------------------------------------------------------------------


def _gmail_text(payload: dict[str, Any]) -> str:
    """The plain text of a Gmail message payload (its parts walked), else its HTML as text."""
    found: dict[str, str] = {}

    def walk(part: dict[str, Any]) -> None:
        mime = part.get("mimeType", "")
        data = (part.get("body") or {}).get("data")
        if data and mime in ("text/plain", "text/html") and mime not in found:
            found[mime] = base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)).decode("utf-8", "replace")
        for child in part.get("parts") or ():
            walk(child)

    walk(payload)
    if "text/plain" in found:
        return found["text/plain"].strip()
    return html_to_text(found["text/html"], drop_quotes=False) if "text/html" in found else ""


def gmail_mail(message: dict[str, Any]) -> Mail:
    headers = {h["name"].lower(): h["value"] for h in (message.get("payload") or {}).get("headers", ())}
    name, address = parseaddr(headers.get("from", ""))
    try:
        sent_at = parsedate_to_datetime(headers["date"]) if headers.get("date") else None
    except (TypeError, ValueError):
        sent_at = None
    if sent_at is None and message.get("internalDate"):
        sent_at = datetime.fromtimestamp(int(message["internalDate"]) / 1000, UTC)
    return Mail(
        thread=f"gmail:{message.get('threadId') or message.get('id')}",
        sender_name=name,
        sender=address.lower(),
        to=tuple(a.lower() for _, a in getaddresses([headers.get("to", "")]) if a),
        subject=headers.get("subject", ""),
        sent_at=sent_at,
        text=_gmail_text(message.get("payload") or {}) or message.get("snippet", ""),
        unread="UNREAD" in (message.get("labelIds") or ()),
    )


class GmailSource(Source):
    key = "gmail"
    name = "Gmail"

    def __init__(self, client: GoogleClient):
        self.client = client

    async def search(self, query: Query, limit: int) -> Found:
        listed = await self.client.call(
            "GET", "/gmail/v1/users/me/messages", params={"q": query.text, "maxResults": limit}
        )
        ids = [m["id"] for m in listed.get("messages") or ()][:limit]
        messages = await asyncio.gather(
            *(self.client.call("GET", f"/gmail/v1/users/me/messages/{i}", params={"format": "full"}) for i in ids)
        )
        matched = max(int(listed.get("resultSizeEstimate") or 0), len(ids))
        return Found([gmail_mail(m) for m in messages], matched)

    async def thread(self, ref: str) -> list[Mail]:
        found = await self.client.call("GET", f"/gmail/v1/users/me/threads/{ref}", params={"format": "full"})
        return [gmail_mail(m) for m in found.get("messages") or ()]


# --- IMAP ---------------------------------------------------------------------------------------------


def _criteria(query: Query) -> imap.Criteria:
    return imap.Criteria(
        query.senders, query.recipients, query.subjects, query.words, query.unread, query.since, query.before
    )


def _imap_mail(key: str, mail: imap.Mail) -> Mail:
    return Mail(
        f"{key}:{mail.uid}", mail.sender_name, mail.sender, mail.to, mail.subject, mail.sent_at, mail.text, mail.unread
    )


class ImapSource(Source):
    def __init__(self, connection_id: UUID, label: str, account: imap.ImapAccount):
        self.key = f"imap-{connection_id.hex[:8]}"
        self.name = f"IMAP {label}"
        self.account = account

    async def search(self, query: Query, limit: int) -> Found:
        if query.outside_inbox():
            return Found([], 0, query.outside_inbox())
        mails, matched = await imap.search(self.account, _criteria(query), limit)
        note = f"ignored {' '.join(query.ignored)}" if query.ignored else ""
        return Found([_imap_mail(self.key, m) for m in mails], matched, note)

    async def thread(self, ref: str) -> list[Mail]:
        if not ref.isdigit():
            raise InvalidInput(f"{ref!r} is not a message of {self.name}")
        return [_imap_mail(self.key, m) for m in await imap.thread(self.account, int(ref))]


# --- Pepper's own inbox ---------------------------------------------------------------------------


def _own_mail(row: Any) -> Mail:
    meta = row["meta"] if isinstance(row["meta"], dict) else json.loads(row["meta"] or "{}")
    return Mail(
        f"inbox:{row['id']}",
        meta.get("sender_name") or "",
        meta.get("sender") or "",
        (meta["recipient"],) if meta.get("recipient") else (),
        meta.get("subject") or "",
        row["created_at"],
        meta.get("text") or "",
        None,
    )


class OwnInboxSource(Source):
    key = "inbox"
    name = "Pepper's inbox"

    def __init__(self, db: Queries, account_id: UUID):
        self.db, self.account_id = db, account_id

    async def search(self, query: Query, limit: int) -> Found:
        if query.outside_inbox():
            return Found([], 0, query.outside_inbox())
        notes = [f"ignored {' '.join(query.ignored)}"] if query.ignored else []
        if query.unread is not None:
            notes.append("keeps no read state: is:unread and is:read match none of its mail")
            return Found([], 0, "; ".join(notes))
        rows, matched = await inbox.own_mail(
            self.db, self.account_id, senders=query.senders, recipients=query.recipients, subjects=query.subjects,
            words=query.words, since=_day_start(query.since) if query.since else None,
            before=_day_start(query.before) if query.before else None, limit=limit,
        )  # fmt: skip
        return Found([_own_mail(r) for r in rows], matched, "; ".join(notes))

    async def thread(self, ref: str) -> list[Mail]:
        if not ref.isdigit():
            raise InvalidInput(f"{ref!r} is not a message of Pepper's inbox")
        return [_own_mail(r) for r in await inbox.own_thread(self.db, self.account_id, int(ref))]


class OneAtATime:
    """A turn's database connection shared by sources that run at once: one statement at a time
    (a connection runs one; a pool would not need this, a turn's connection does)."""

    def __init__(self, db: Queries):
        self._db = db
        self._lock = asyncio.Lock()

    async def execute(self, query: str, *args: Any) -> str:
        async with self._lock:
            return await self._db.execute(query, *args)

    async def fetch(self, query: str, *args: Any) -> list[Any]:
        async with self._lock:
            return await self._db.fetch(query, *args)

    async def fetchrow(self, query: str, *args: Any) -> Any:
        async with self._lock:
            return await self._db.fetchrow(query, *args)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async with self._lock:
            return await self._db.fetchval(query, *args)


# --- Which sources a person has -------------------------------------------------------------------


async def imap_account(db: Queries, connectors: Connectors, row: Any) -> imap.ImapAccount:
    config = row["config"] if isinstance(row["config"], dict) else json.loads(row["config"] or "{}")
    secret = await opened_secret(db, connectors, row["id"], row) or {}
    return imap.ImapAccount(
        config["host"], int(config["port"]), config["username"], secret.get("password", ""),
        config.get("security", "ssl"), timeout=connectors.http_timeout,
    )  # fmt: skip


async def sources_for(db: Queries, connectors: Connectors, account_id: UUID) -> tuple[list[Source], list[str]]:
    """The person's mailboxes (Gmail first, then IMAP ones, then Pepper's inbox), and those that
    could not even be opened (a secret that does not open), named."""
    db = OneAtATime(db)  # the sources run at once, and may share one connection
    sources: list[Source] = []
    broken: list[str] = []
    gmail = await google_connection(db, account_id, GMAIL_READONLY)
    if gmail is not None:
        sources.append(GmailSource(GoogleClient(db, connectors, gmail)))
    for row in await connections.imap_connections(db, account_id):
        try:
            sources.append(ImapSource(row["id"], row["label"], await imap_account(db, connectors, row)))
        except (PepperError, KeyError, ValueError) as exc:
            log.warning("imap connection cannot be opened: %s", type(exc).__name__)
            broken.append(f"IMAP {row['label']} (its stored settings do not open: connect it again)")
    sources.append(OwnInboxSource(db, account_id))
    return sources, broken


LABEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._@-]{0,39}$")
HOST_PATTERN = re.compile(r"^[A-Za-z0-9.-]{1,253}$|^\[[0-9A-Fa-f:.]+\]$")


async def _check_host(connectors: Connectors, host: str, port: int) -> None:
    """A mailbox on the machine's own network is refused unless private hosts are allowed (tests):
    the same rule as feeds and calendars."""
    if connectors.allow_private_hosts:
        return
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise InvalidInput(f"the IMAP host {host!r} does not resolve") from exc
    if any(not ipaddress.ip_address(str(info[4][0])).is_global for info in infos):
        raise InvalidInput(f"the IMAP host {host!r} is on a private network")


async def connect_imap(
    db: Queries, connectors: Connectors, account_id: UUID, label: str, *, host: str, port: int | None,
    username: str, password: str, security: str = "ssl",
) -> tuple[UUID, bool, int]:  # fmt: skip
    """Sign in to the mailbox (INBOX opened read-only) and only then store it, the password sealed:
    its connection id, whether it is new (connecting again updates the same one) and how many
    messages INBOX holds. ``InvalidInput`` for bad settings, ``ImapLoginRefused`` for a wrong
    password, ``ImapError`` when the server cannot be reached: nothing is stored on any of them."""
    label, host, username = label.strip(), host.strip().lower(), username.strip()
    if not HOST_PATTERN.match(host):
        raise InvalidInput(f"{host!r} is not a host name")
    if not LABEL_PATTERN.match(label):
        raise InvalidInput("name the mailbox with letters, digits, spaces or . _ @ - (at most 40 characters)")
    if security not in imap.SECURITY:
        raise InvalidInput(f"security must be one of {', '.join(imap.SECURITY)}")
    if port is None:
        port = 993 if security == "ssl" else 143
    if not 0 < port < 65536:
        raise InvalidInput(f"{port} is not a port")
    if not username or not password:
        raise InvalidInput("the IMAP user name and password are both needed")
    if security == "none" and not connectors.allow_private_hosts:
        raise InvalidInput("a mailbox password is sent only over TLS: use --security ssl or starttls")
    connectors.require_vault()  # refuse before signing in, not after
    await _check_host(connectors, host, port)
    account = imap.ImapAccount(host, port, username, password, security, timeout=connectors.http_timeout)
    count = await imap.check(account)
    config = json.dumps({"host": host, "port": port, "username": username, "security": security})
    connection_id, created = await connections.store_imap(
        db, account_id, label, host, username, config, seal(connectors, {"password": password})
    )
    return connection_id, created, count


async def check_mailbox(db: Queries, connectors: Connectors, row: Any) -> int:
    """Sign in to a stored IMAP mailbox (``pepper doctor --online``); how many messages INBOX holds."""
    try:
        account = await imap_account(db, connectors, row)
    except (KeyError, ValueError) as exc:
        raise InvalidInput("its stored settings do not open: connect it again") from exc
    return await imap.check(account)


# --- What the model reads ----------------------------------------------------------------------------


def _when(moment: datetime | None, tz: Any) -> str:
    return moment.astimezone(tz).strftime("%a %d %b %Y %H:%M") if moment else "unknown"


def render(source: str, mail: Mail, chars: int, tz: Any) -> str:
    sender = f"{mail.sender_name} <{mail.sender}>" if mail.sender_name else mail.sender or "unknown"
    fields = [("Thread", mail.thread), ("Date", _when(mail.sent_at, tz)), ("Subject", mail.subject or "(none)")]
    if mail.to:
        fields.append(("To", ", ".join(mail.to)))
    if mail.unread is not None:
        fields.append(("Unread", "yes" if mail.unread else "no"))
    text = mail.text if len(mail.text) <= chars else mail.text[:chars] + " [...]"
    return mail_block(source, sender, fields, text or "(no text)")


Search = Callable[[Source], Awaitable[Found]]


async def gather(sources: list[Source], run: Search) -> tuple[list[tuple[Source, Found]], list[str]]:
    """Run ``run`` on every source at once; what each answered, and each failed source named."""

    async def one(source: Source) -> Found:
        return await run(source)

    results = await asyncio.gather(*(one(s) for s in sources), return_exceptions=True)
    answered: list[tuple[Source, Found]] = []
    failed: list[str] = []
    for source, result in zip(sources, results, strict=True):
        if isinstance(result, PepperError):
            failed.append(f"{source.name} ({result.message})")
        elif isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result
            log.exception("mail source failed: %s", source.key, exc_info=result)
            failed.append(f"{source.name} (an unexpected error)")
        else:
            answered.append((source, result))
    return answered, failed


def report(
    what: str, answered: list[tuple[Source, Found]], failed: list[str], limit: int, tz: Any
) -> tuple[str, str]:  # fmt: skip
    """The result text and its status: ``ok``, ``empty`` (every source answered, nothing
    matched) or ``failed`` (no source answered)."""
    if not answered:
        return f"could not read mail: {'; '.join(failed)}. Nothing was checked, so say so.", "failed"
    items = [(source, mail) for source, found in answered for mail in found.mails]
    far_past = datetime.min.replace(tzinfo=UTC)
    items.sort(key=lambda i: i[1].sent_at or far_past, reverse=True)
    shown = items[:limit]
    matched = sum(found.matched for _, found in answered)
    checked = ", ".join(f"{s.name} ({f.matched} matched{'; ' + f.note if f.note else ''})" for s, f in answered)
    lines = [f"{what}. Checked: {checked}."]
    if failed:
        lines.append(
            f"NOT checked, failed: {'; '.join(failed)}. Their mail is missing from this answer: tell the person."
        )
    if not items:
        if failed:
            lines.append("No mail matched in the mailboxes that answered; that is not a complete answer.")
            return "\n".join(lines), "ok"
        return f"{what}: no mail matched, and every mailbox answered. Checked: {checked}", "empty"
    if matched > len(shown):
        lines.append(f"Showing the newest {len(shown)} of {matched}.")
    lines += [render(source.name, mail, SNIPPET_CHARS, tz) for source, mail in shown]
    return "\n".join(lines), "ok"


def split_ref(ref: str, sources: list[Source]) -> tuple[Source, str]:
    key, sep, rest = ref.strip().partition(":")
    for source in sources:
        if source.key == key and sep and rest:
            return source, rest
    known = ", ".join(s.key for s in sources)
    raise InvalidInput(f"{ref!r} is not a thread from a search here (threads start with one of: {known})")


def thread_text(source: Source, mails: list[Mail], tz: Any, *, summary: bool) -> str:
    if summary:
        people = sorted({m.sender for m in mails if m.sender})
        first, last = mails[0].sent_at, mails[-1].sent_at
        head = (
            f"Thread {mails[0].thread} in {source.name}: {len(mails)} message(s) from {_when(first, tz)} to "
            f"{_when(last, tz)}, between {', '.join(people) or 'unknown senders'}; each message's new text only "
            "(quoted replies cut). Summarise it for the person: who wants what, what is decided, what is open."
        )
        trimmed = [replace(m, text=strip_quoted(m.text)) for m in mails]
        return "\n".join([head, *(render(source.name, m, SUMMARY_CHARS, tz) for m in trimmed)])
    head = f"Thread {mails[0].thread} in {source.name}: {len(mails)} message(s), oldest first."
    return "\n".join([head, *(render(source.name, m, THREAD_CHARS, tz) for m in mails)])


# --- The tools ------------------------------------------------------------------------------------------

_LIMIT = {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS}
_THREAD = {"type": "string", "minLength": 3, "maxLength": 200}


def make_read_tools(connectors: Connectors, area: str) -> tuple[Tool, ...]:
    async def _sources(ctx: ToolContext) -> tuple[list[Source], list[str]]:
        return await sources_for(ctx.db, connectors, ctx.session.account_id)

    async def _look(ctx: ToolContext, what: str, query: Query, limit: int) -> ToolOutcome:
        sources, broken = await _sources(ctx)
        answered, failed = await gather(sources, lambda s: s.search(query, limit))
        text, status = report(what, answered, [*broken, *failed], limit, ZoneInfo(ctx.session.timezone))
        return ToolOutcome(status, text)  # type: ignore[arg-type]

    async def _search(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            query = parse_query(args["query"], ctx.now.astimezone(ZoneInfo(ctx.session.timezone)).date())
        except InvalidInput as exc:
            return ToolOutcome.failed(exc.message)
        return await _look(ctx, f"mail matching {args['query']!r}", query, args.get("limit", 10))

    async def _unread(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        days = args.get("days", 2)
        today = ctx.now.astimezone(ZoneInfo(ctx.session.timezone)).date()
        text = f"is:unread in:inbox newer_than:{days}d"
        query = Query(text, unread=True, since=today - timedelta(days=days))
        return await _look(ctx, f"unread mail of the last {days} day(s)", query, args.get("limit", 20))

    async def _thread(ctx: ToolContext, args: dict[str, Any], *, summary: bool) -> ToolOutcome:
        sources, broken = await _sources(ctx)
        try:
            source, ref = split_ref(args["thread"], sources)
            mails = await source.thread(ref)
        except InvalidInput as exc:
            return ToolOutcome.failed(exc.message + (f" (not readable now: {'; '.join(broken)})" if broken else ""))
        except PepperError as exc:
            return ToolOutcome.failed(f"could not read the thread from {source.name}: {exc.message}")
        if not mails:
            return ToolOutcome.failed(f"{source.name} has no thread {args['thread']!r} (it may have been deleted)")
        return ToolOutcome.ok(thread_text(source, mails, ZoneInfo(ctx.session.timezone), summary=summary))

    async def _read(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return await _thread(ctx, args, summary=False)

    async def _summarise(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        return await _thread(ctx, args, summary=True)

    def tool(name: str, description: str, properties: dict[str, Any], required: list[str], handler: Any) -> Tool:
        return Tool(
            name=name,
            description=description,
            parameters={
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
            handler=handler,
            area=area,
            needs_connection=MAILBOX,
            outside_text="mail",
        )

    return (
        tool(
            "mail_search",
            "Search the person's mail (Gmail, IMAP, Pepper's inbox) with Gmail query syntax: from: to: subject: "
            "is:unread after:2025/03/01 before: newer_than:7d, words. Read-only.",
            {"query": {"type": "string", "minLength": 1, "maxLength": 300}, "limit": _LIMIT},
            ["query"],
            _search,
        ),
        tool(
            "mail_list_unread",
            "List the person's unread mail of the last days (default 2), newest first. Read-only.",
            {"days": {"type": "integer", "minimum": 1, "maximum": 31}, "limit": _LIMIT},
            [],
            _unread,
        ),
        tool(
            "mail_read_thread",
            "Read a whole mail thread by the thread reference a search gave (e.g. gmail:...). Read-only.",
            {"thread": _THREAD},
            ["thread"],
            _read,
        ),
        tool(
            "mail_summarise_thread",
            "A thread's messages cut to their new text, to summarise; by the thread reference. Read-only.",
            {"thread": _THREAD},
            ["thread"],
            _summarise,
        ),
    )
