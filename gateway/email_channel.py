"""Email: signed Mailgun-style inbound webhooks, replies by SMTP from Pepper's own address.

One inbound mail: check the signature (hex HMAC-SHA256 of ``timestamp + token`` under the webhook
signing key) and the timestamp's age -> parse the form -> the sender must have proved the From
address (Mailgun's own DKIM or SPF verdict fields, aligned with the From domain; headers the
sender wrote never count, and a mail without the provider's verdict is refused) and it must be a
verified email handle -> in one transaction, claim the token (a reused token is refused) and
record the message as queued (``gateway.channels.receive``), keyed by its ``Message-Id`` (a
duplicate starts no second turn) -> 200 -> a turn worker (``gateway.worker``) runs the turn on
channel ``email`` (``gateway.channels``) -> ``EmailChannel`` replies by SMTP,
threaded (``In-Reply-To``, ``References``, ``Re:``), the owner always on CC -> the SMTP server
accepting the reply commits the turn's staged writes; a refusal drops them.

Status codes follow Mailgun's retry rules: 200 done, 406 refused for good (malformed, unknown or
unproven sender: Mailgun does not retry), 403 bad signature, stale or replayed, 413 too large.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from dataclasses import asdict, dataclass
from email.message import EmailMessage
from email.utils import formataddr, formatdate, getaddresses, make_msgid, parseaddr
from typing import Any
from uuid import UUID

from quart import Blueprint, Response, current_app, request

from core import identity
from core.conversation import conversation_for, record_outbound
from core.errors import InvalidInput, PepperError
from core.mailtext import html_to_text, strip_quoted
from core.records import inbox
from core.security import record_security_event
from core.settings import Settings
from gateway.channels import Claimed, Delivery, Limits, delivered, failed, receive
from gateway.limits import MAX_EMAIL_BYTES
from gateway.metrics_route import mark_duplicate
from gateway.services import Services
from gateway.webhooks import EMAIL

log = logging.getLogger(__name__)

# A signed webhook older (or further in the future) than this is refused; Mailgun re-signs retries.
MAX_WEBHOOK_AGE = 300
# What the model and the conversation get of one mail's text.
MAX_TEXT_CHARS = 20_000
MAX_TOKEN_LENGTH = 256
# How many earlier Message-Ids a reply's References keeps (the thread's root and the latest ones).
MAX_REFERENCES = 20
EMAIL_OPT_OUT_WORDS = frozenset({"STOP", "UNSUBSCRIBE"})
EMAIL_OPT_IN_WORDS = frozenset({"START"})


blueprint = Blueprint("email", __name__)


@dataclass(frozen=True)
class InboundMail:
    message_id: str  # "<...>" as in the header; derived from the content when the mail had none
    message_id_derived: bool
    sender_name: str
    sender: str  # the From address, lower-cased
    recipient: str  # the address it was sent to (Pepper's)
    subject: str
    text: str  # what the person wrote, quotes stripped
    in_reply_to: str | None
    references: tuple[str, ...]
    attachments: tuple[str, ...]
    automatic: bool  # an auto-reply, bounce or list mail: recorded, never answered
    # text/calendar attachments (an invitation's .ics), kept for the calendar's detectors
    # (core.suggestions), which parse them in code; never shown to a model.
    calendars: tuple[str, ...] = ()

    def body(self) -> str:
        """The message as recorded in the conversation and given to the model."""
        parts = []
        if self.subject:
            parts.append(f"Subject: {self.subject}")
        parts.append(self.text or "(no text)")
        if self.attachments:
            parts.append("[Attachments not read: " + ", ".join(self.attachments) + "]")
        return "\n\n".join(parts)


def _services() -> Services:
    return current_app.extensions["pepper"]


def _plain(text: str, status: int) -> Response:
    return Response(text + "\n", status=status, content_type="text/plain")


# --- signature -----------------------------------------------------------------------------------


def mailgun_signature(key: str, timestamp: str, token: str) -> str:
    """The signature Mailgun sends for ``timestamp`` and ``token`` under the webhook signing key."""
    return hmac.new(key.encode(), (timestamp + token).encode(), hashlib.sha256).hexdigest()


def signature_ok(settings: Settings, timestamp: str, token: str, signature: str) -> bool:
    """True only for a valid signature; a missing key or any missing piece fails closed."""
    key = settings.email_webhook_signing_key
    if key is None or not key.get_secret_value() or not timestamp or not token or not signature:
        return False
    expected = mailgun_signature(key.get_secret_value(), timestamp, token)
    return hmac.compare_digest(expected.encode(), signature.strip().lower().encode("utf-8", "replace"))


def fresh(timestamp: str, now: float | None = None) -> bool:
    try:
        sent = int(timestamp)
    except ValueError:
        return False
    return abs((time.time() if now is None else now) - sent) <= MAX_WEBHOOK_AGE


# --- parsing -------------------------------------------------------------------------------------


class _Headers:
    """Case-insensitive view of the form's header fields, then of ``message-headers`` (JSON pairs)."""

    def __init__(self, form: Any) -> None:
        self._fields = {k.lower(): k for k in form}
        self._form = form
        self._json: dict[str, list[str]] = {}
        try:
            pairs = json.loads(form.get("message-headers") or "[]")
        except ValueError:
            pairs = []
        for pair in pairs if isinstance(pairs, list) else []:
            if isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair):
                self._json.setdefault(pair[0].lower(), []).append(pair[1])

    def get(self, name: str) -> str:
        key = self._fields.get(name.lower())
        if key is not None and self._form.get(key):
            return str(self._form.get(key)).strip()
        values = self._json.get(name.lower())
        return values[0].strip() if values else ""

    def all(self, name: str) -> list[str]:
        return self._json.get(name.lower(), [])


def _message_ids(value: str) -> list[str]:
    ids, current = [], ""
    for char in value:
        if char == "<":
            current = "<"
        elif char == ">" and current:
            ids.append(current + ">")
            current = ""
        elif current:
            current += char
    if not ids and value.strip() and " " not in value.strip():
        ids.append("<" + value.strip().strip("<>") + ">")
    return [i for i in ids if len(i) > 2 and " " not in i]


def _domain(address: str) -> str:
    return address.rsplit("@", 1)[-1].lower().strip(".") if "@" in address else ""


def _aligned(authenticated: str, from_domain: str) -> bool:
    """Relaxed DMARC alignment, kept on the safe side without a public-suffix list.

    The authenticated domain is the From domain, a parent of it or a subdomain of it, and the
    shorter of the two has at least two labels (a bare top-level domain never aligns). Two
    siblings (``a.example.org`` and ``b.example.org``) do not align: DMARC would allow them through
    their organisational domain, but telling ``example.org`` from ``co.uk`` needs the suffix list.
    """
    a, f = authenticated.lower().strip("."), from_domain.lower().strip(".")
    if not a or not f:
        return False
    if a == f:
        return True
    shorter, longer = (a, f) if len(a) < len(f) else (f, a)
    return "." in shorter and longer.endswith("." + shorter)


def _form_values(form: Any, name: str, *, exact: bool = False) -> list[str]:
    """Every value the form carries under ``name`` (any letter case unless ``exact``)."""
    keys = [name] if exact else [k for k in form if k.lower() == name.lower()]
    values: list[str] = []
    for key in keys:
        if key in form:
            values += [str(v) for v in (form.getlist(key) if hasattr(form, "getlist") else [form[key]])]
    return values


def provider_field(form: Any, name: str) -> str | None:
    """The value Mailgun itself posted for its header ``name``, lower-cased; ``None`` when absent or unclear.

    Mailgun prepends its verdict headers to the mail and posts each as a form field. A mail whose
    sender wrote the same header carries it twice: the form then holds two fields, or the
    header list (``message-headers``) two entries, and which one is Mailgun's cannot be told.
    That is no verdict, as is a header list that disagrees with the field.
    """
    values = [v.strip() for v in _form_values(form, name)]
    listed = [v.strip() for v in _Headers(form).all(name)]
    if len(values) != 1 or len(listed) > 1 or (listed and listed[0] != values[0]):
        return None
    return values[0].lower()


def _signing_domain(form: Any) -> str | None:
    """The ``d=`` of the mail's only DKIM signature; ``None`` when it has none or several.

    Mailgun's form names no verified signing domain, only one verdict for the whole mail. With
    one signature that verdict is about it; with several, a forged signature for the From domain
    could sit next to a valid one for another domain, so none of them proves the From domain.
    """
    signatures = _Headers(form).all("DKIM-Signature") or _form_values(form, "DKIM-Signature")
    if len(signatures) != 1:
        return None
    domains = []
    for tag in signatures[0].replace("\r", " ").replace("\n", " ").replace("\t", " ").split(";"):
        name, _, value = tag.strip().partition("=")
        if name.strip().lower() == "d":
            domains.append(value.strip().lower())
    return domains[0] if len(domains) == 1 and domains[0] else None


def sender_problem(form: Any, from_address: str) -> str | None:
    """Why the From address is not proven, or ``None`` when it is (see ``sender_authenticated``)."""
    dkim, spf = provider_field(form, "X-Mailgun-Dkim-Check-Result"), provider_field(form, "X-Mailgun-Spf")
    if dkim is None and spf is None:
        return "the provider reported no DKIM or SPF verdict"
    from_domain = _domain(from_address)
    if dkim == "pass" and _aligned(_signing_domain(form) or "", from_domain):
        return None
    envelope = _form_values(form, "sender", exact=True)
    if spf == "pass" and len(envelope) == 1 and _aligned(_domain(envelope[0].strip()), from_domain):
        return None
    return "neither DKIM nor SPF passed for the From domain"


def sender_authenticated(form: Any, from_address: str) -> bool:
    """The provider checked that the mail really comes from the From domain.

    Only Mailgun's own fields count (``provider_field``): DKIM passed and the mail's one signature
    is for a domain aligned with the From domain, or SPF passed for the envelope sender Mailgun saw
    in the SMTP chat (the ``sender`` field) and that domain is aligned with the From domain.
    Headers in the mail (``Authentication-Results``, ``Received-SPF``, a second verdict header, a
    DKIM signature next to another one) never count, and no verdict is no proof.
    """
    return sender_problem(form, from_address) is None


def _automatic(headers: _Headers, from_address: str) -> bool:
    """RFC 3834 auto-replies, bounces and list mail: answering them risks a mail loop."""
    auto = headers.get("Auto-Submitted").lower()
    if auto and auto != "no":
        return True
    if headers.get("Precedence").lower() in ("bulk", "junk", "list", "auto_reply"):
        return True
    if headers.get("X-Autoreply") or headers.get("X-Autorespond") or headers.get("List-Id"):
        return True
    local = from_address.split("@", 1)[0]
    return local in ("mailer-daemon", "postmaster")


def _text(form: Any) -> str:
    stripped = (form.get("stripped-text") or "").strip()
    if stripped:
        return stripped
    plain = (form.get("body-plain") or "").strip()
    if plain:
        return strip_quoted(plain)
    html = (form.get("stripped-html") or "").strip()
    if html:
        text = html_to_text(html, drop_quotes=False)
        if text:
            return text
    html = (form.get("body-html") or "").strip()
    if html:
        return strip_quoted(html_to_text(html) or html_to_text(html, drop_quotes=False))
    return ""


def _attachments(form: Any, files: Any) -> tuple[str, ...]:
    names = [f.filename or "unnamed" for f in files.values()] if files else []
    try:
        count = int(form.get("attachment-count") or 0)
    except ValueError:
        count = 0
    names += ["unnamed"] * max(0, count - len(names))
    return tuple(names)


MAX_CALENDAR_PARTS, MAX_CALENDAR_BYTES = 5, 256 * 1024


def _calendars(files: Any) -> tuple[str, ...]:
    """The text of each iCalendar attachment (by type or ``.ics`` name), the first few, small ones."""
    out: list[str] = []
    for f in files.values() if files else ():
        kind = (getattr(f, "content_type", "") or "").split(";")[0].strip().lower()
        if kind != "text/calendar" and not (f.filename or "").lower().endswith(".ics"):
            continue
        data = f.read(MAX_CALENDAR_BYTES + 1)
        if len(data) <= MAX_CALENDAR_BYTES and len(out) < MAX_CALENDAR_PARTS:
            out.append(data.decode("utf-8", errors="replace"))
    return tuple(out)


def parse_inbound(form: Any, files: Any = None) -> InboundMail:
    """The mail in a Mailgun route form. Raises ``InvalidInput`` saying what is missing or wrong."""
    headers = _Headers(form)
    raw_from = form.get("from") or headers.get("From") or form.get("sender") or ""
    parsed = [(n, a) for n, a in getaddresses([raw_from]) if a]
    if not parsed:
        raise InvalidInput("the mail has no From address")
    name, address = parsed[0]
    try:
        address = identity.normalize_email(address)
    except InvalidInput:
        raise InvalidInput("the From address is not an email address") from None
    recipient = parseaddr(form.get("recipient") or headers.get("To") or "")[1]
    if not recipient:
        raise InvalidInput("the mail has no recipient")

    text = _text(form)
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS] + f"\n[… {len(text) - MAX_TEXT_CHARS} more characters not shown]"
    subject = " ".join((form.get("subject") or headers.get("Subject")).split())

    message_ids = _message_ids(headers.get("Message-Id"))
    derived = not message_ids
    if derived:
        # No Message-Id: the same mail still maps to the same key, so a retry starts no second turn.
        digest = hashlib.sha256(
            "\0".join((address, headers.get("Date"), subject, form.get("body-plain") or "", text)).encode()
        ).hexdigest()
        message_ids = [f"<{digest}@derived.pepper.invalid>"]
    in_reply_to = _message_ids(headers.get("In-Reply-To"))
    return InboundMail(
        message_id=message_ids[0],
        message_id_derived=derived,
        sender_name=name,
        sender=address,
        recipient=recipient.lower(),
        subject=subject,
        text=text,
        in_reply_to=in_reply_to[0] if in_reply_to else None,
        references=tuple(_message_ids(headers.get("References"))),
        attachments=_attachments(form, files),
        automatic=_automatic(headers, address),
        calendars=_calendars(files),
    )


# --- the webhook ---------------------------------------------------------------------------------


@blueprint.post(EMAIL.path)
async def email_webhook() -> Response:
    services = _services()
    settings, db = services.settings, services.db
    request.max_form_memory_size = MAX_EMAIL_BYTES  # long HTML parts; the body limit is set in gateway.limits
    form = await request.form
    files = await request.files

    timestamp, token = form.get("timestamp", ""), form.get("token", "")
    if not signature_ok(settings, timestamp, token, form.get("signature", "")) or len(token) > MAX_TOKEN_LENGTH:
        if settings.email_webhook_signing_key is None:
            log.error("refused an email webhook: PEPPER_EMAIL_WEBHOOK_SIGNING_KEY is not set")
        else:
            log.warning("refused an email webhook with a missing or invalid signature")
        await record_security_event(services.db, "email-signature-invalid", path=EMAIL.path)
        return _plain("invalid signature", 403)
    if not fresh(timestamp):
        log.warning("refused an email webhook with a stale timestamp")
        await record_security_event(services.db, "email-webhook-stale", path=EMAIL.path)
        return _plain("stale timestamp", 403)

    problem = ""
    try:
        # Off the event loop: turning a long HTML mail into text takes a while.
        mail: InboundMail | None = await asyncio.to_thread(parse_inbound, form, files)
    except InvalidInput as exc:
        mail, problem = None, str(exc)

    # (status, text, security event) when the mail is refused.
    refusal: tuple[int, str, str | None] | None = None
    created = skip = False
    message = handle = word = None
    async with db.transaction() as conn:
        if not await inbox.claim_webhook_token(conn, token, keep_seconds=2 * MAX_WEBHOOK_AGE):
            refusal = (403, "token already used", "email-token-reused")
        elif mail is None:
            refusal = (406, problem, None)
        elif settings.email_require_sender_auth and (unproven := sender_problem(form, mail.sender)) is not None:
            refusal = (
                406, f"the sender's address is not authenticated (DKIM/SPF): {unproven}", "email-sender-unauthenticated"
            )  # fmt: skip
        else:
            handle = await identity.find_handle(conn, "email", mail.sender)
            if handle is None or not handle.verified:
                # An address that belongs to no account (or is not verified) never reaches an agent.
                refusal = (406, "this address answers only the people it works for", None)
            else:
                word = None if mail.automatic else opt_keyword(mail)
                skip = mail.automatic or word is not None or await identity.is_blocked(conn, handle.id, "email")
                message, created = await receive(
                    conn, "email", handle.account_id, mail.body(), key=mail.message_id, handle_id=handle.id,
                    meta=asdict(mail), queued=not skip,
                )  # fmt: skip
                if created and word is not None:
                    # As with SMS, the consent change commits with the message that asked for it.
                    await identity.set_consent(
                        conn, handle.id, ("email",), opted_out=word == "STOP", source=f"email {word}"
                    )
    if refusal is not None:
        status, text, event = refusal
        log.warning("refused an inbound email: status=%s reason=%s", status, event or "not-accepted")
        if event is not None:
            await record_security_event(services.db, event, path=EMAIL.path)
        return _plain(text, status)
    assert mail is not None and message is not None and handle is not None
    if not created:
        mark_duplicate()
        return _plain("ok", 200)
    if mail.automatic:
        log.info("automatic mail recorded; not answered")
    elif word is not None:
        log.info("email %s recorded; no reply is sent", word)
    elif skip:
        log.info("mail recorded from a handle that opted out of email; no reply will be sent")
    return _plain("ok", 200)  # recorded as queued: a turn worker picks it up


def opt_keyword(mail: InboundMail) -> str | None:
    """``STOP`` when the subject or the first line is STOP or UNSUBSCRIBE, ``START`` for START.

    It blocks (or lifts the block on) mail to that address only, through the same consent record
    the SMS keywords use; a mail that is a keyword gets no turn and no reply.
    """
    first_line = next((line for line in mail.text.splitlines() if line.strip()), "")
    for candidate in (mail.subject, first_line):
        word = candidate.strip().rstrip(".!").upper()
        if word in EMAIL_OPT_OUT_WORDS:
            return "STOP"
        if word in EMAIL_OPT_IN_WORDS:
            return "START"
    return None


# --- the turn and the reply ----------------------------------------------------------------------


def reply_subject(subject: str) -> str:
    subject = subject.strip()
    if not subject:
        return "Re: your message"
    return subject if subject.lower().startswith("re:") else f"Re: {subject}"


def thread_references(mail: InboundMail) -> list[str]:
    """The inbound References plus its Message-Id: the root and the latest, at most ``MAX_REFERENCES``."""
    chain = list(mail.references)
    if mail.in_reply_to and mail.in_reply_to not in chain:
        chain.append(mail.in_reply_to)
    chain.append(mail.message_id)
    if len(chain) > MAX_REFERENCES:
        chain = [chain[0], *chain[-(MAX_REFERENCES - 1) :]]
    return chain


def build_reply(
    mail: InboundMail, body: str, *, from_name: str, from_address: str, owner: str, to_name: str = ""
) -> EmailMessage:
    """Pepper's threaded reply to ``mail``: to its sender, the owner on CC."""
    message = EmailMessage()
    message["From"] = formataddr((from_name, from_address))
    message["To"] = formataddr((to_name, mail.sender))
    message["Cc"] = owner
    message["Subject"] = reply_subject(mail.subject)
    message["Date"] = formatdate(usegmt=True)
    message["Message-ID"] = make_msgid(domain=from_address.rsplit("@", 1)[-1])
    if not mail.message_id_derived:
        message["In-Reply-To"] = mail.message_id
        message["References"] = " ".join(thread_references(mail))
    # RFC 3834: a generated answer; well-behaved auto-responders will not answer it back.
    message["Auto-Submitted"] = "auto-replied"
    message.set_content(body)
    return message


class EmailChannel:
    """Email (``gateway.channels.Channel``): a threaded reply by SMTP from Pepper's own address,
    the owner on CC; the SMTP server accepting it is the delivery."""

    name = "email"
    limits = Limits(inbound_chars=MAX_TEXT_CHARS)

    def can_reply(self, claimed: Claimed) -> bool:
        return bool(claimed.meta.get("message_id") and claimed.handle_id)

    async def deliver(self, services: Services, claimed: Claimed, turn_id: UUID | None, parts: list[str]) -> Delivery:
        db, meta = services.db, claimed.meta
        mail = InboundMail(**{**meta, "references": tuple(meta.get("references", ())),
                              "attachments": tuple(meta.get("attachments", ())),
                              "calendars": tuple(meta.get("calendars", ()))})  # fmt: skip
        [reply] = parts
        conversation_id = await conversation_for(db, claimed.account_id)
        mailer = services.mailer
        if mailer is None:
            log.error("cannot reply by email: PEPPER_SMTP_HOST and PEPPER_SMTP_FROM are not configured")
            return failed("smtp-not-configured")
        owner = await inbox.owner_address(db, claimed.account_id) or mail.sender
        message = build_reply(
            mail, reply, from_name=mailer.from_name, from_address=mailer.from_address, owner=owner,
            to_name=mail.sender_name,
        )  # fmt: skip
        try:
            await mailer.send(message, [mail.sender, owner])
        except PepperError as exc:
            log.error("sending an email reply failed: %s", exc.code)
            await record_outbound(
                db, conversation_id, "email", reply, turn_id=turn_id, provider_message_id=message["Message-ID"],
                delivery_status="failed",
            )  # fmt: skip
            return failed("smtp-refused", code=exc.code)
        await record_outbound(
            db, conversation_id, "email", reply, turn_id=turn_id, provider_message_id=message["Message-ID"],
            delivery_status="sent",
        )  # fmt: skip
        # The SMTP server accepted the reply: that is the delivery.
        return delivered(status="accepted-by-smtp")


EMAIL_CHANNEL = EmailChannel()
