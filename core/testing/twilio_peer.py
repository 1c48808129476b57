"""A loopback Twilio for tests: signs webhooks the way Twilio does and serves the REST API Pepper calls.

    async with TwilioPeer(auth_token="...") as twilio:
        settings = Settings(twilio_api_url=twilio.api_url, ...)
        await twilio.deliver_message(app_url, public_url, "/twilio/sms", From=..., To=..., Body=...)
        twilio.sent  # messages Pepper asked to send, in order

Signatures come from ``core.adapters.twilio.signatures.sign`` (the SDK's computation) over the *public* URL,
while the request itself goes to the loopback address, exactly as behind a proxy.
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from email.utils import formatdate
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from core.adapters.twilio.signatures import sign

# What Twilio reports for a message that reaches the phone, in order.
RECEIPTS = ("sent", "delivered")


def new_sid(prefix: str) -> str:
    return prefix + secrets.token_hex(16)


@dataclass
class SentMessage:
    sid: str
    to: str
    from_: str
    body: str
    status_callback: str | None
    account_sid: str
    auth: str | None
    received_at: float = field(default_factory=time.time)  # wall clock, when the peer got the request
    status: str = "queued"  # as Twilio sees it: the last receipt it reported (whether or not Pepper got it)


@dataclass
class PlacedCall:
    """A call Pepper asked Twilio to place (REST ``Calls``), as the peer recorded it."""

    sid: str
    to: str
    from_: str
    url: str
    status_callback: str | None
    status_events: list[str]
    machine_detection: str | None
    send_digits: str | None
    auth: str | None
    sequence: int = 0
    received_at: float = field(default_factory=time.time)  # wall clock, when the peer got the request
    # DTMF the far end heard (``<Play digits>`` and ``SendDigits``), one entry per press, in order.
    digits_heard: list[str] = field(default_factory=list)


@dataclass
class TwilioPeer:
    auth_token: str
    account_sid: str = "AC" + "1" * 32
    sent: list[SentMessage] = field(default_factory=list)
    # Statuses the automatic receipts got back (``send_receipts``), one per receipt.
    receipt_statuses: list[int] = field(default_factory=list)
    _faults: list[tuple[int, int]] = field(default_factory=list)
    # Seconds a message create takes to answer after the message is recorded in ``sent`` (a slow
    # API under load: the message is on its way before Pepper hears back).
    response_delay: float = 0.0
    _runner: web.AppRunner | None = None
    _receipts: tuple[str, str, tuple[str, ...]] | None = None
    _receipt_session: aiohttp.ClientSession | None = None
    _receipt_tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _hold: tuple[int, asyncio.Event] | None = None
    held: int = 0  # message creates waiting now for ``release_sends`` (not yet in ``sent``)
    _answers_held: asyncio.Event | None = None
    # Message list requests that fail (``fail_lists``), and how many lists were read.
    _list_faults: int = 0
    lists: int = 0
    port: int = 0
    # Calls Pepper placed, live calls it gave new TwiML (``(CallSid, twiml)``), Lookup v2 answers by
    # number (``(line type, caller name)``) and the numbers looked up.
    calls: list[PlacedCall] = field(default_factory=list)
    updates: list[tuple[str, str]] = field(default_factory=list)
    lookup_answers: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)
    looked_up: list[str] = field(default_factory=list)

    async def __aenter__(self) -> TwilioPeer:
        app = web.Application()
        app.router.add_post("/2010-04-01/Accounts/{account}/Messages.json", self._create_message)
        app.router.add_get("/2010-04-01/Accounts/{account}/Messages.json", self._list_messages)
        app.router.add_get("/2010-04-01/Accounts/{account}.json", self._fetch_account)
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls.json", self._create_call)
        app.router.add_post("/2010-04-01/Accounts/{account}/Calls/{sid}.json", self._update_call)
        app.router.add_get("/v2/PhoneNumbers/{number}", self._lookup)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.receipts_done()
        if self._receipt_session is not None:
            await self._receipt_session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail_next(self, status: int = 400, code: int = 21610) -> None:
        """The next message create answers with this HTTP status and Twilio error code."""
        self._faults.append((status, code))

    def hold_sends(self, after: int) -> None:
        """Message creates after the first ``after`` wait (unanswered) until ``release_sends``."""
        self._hold = (after, asyncio.Event())

    def release_sends(self) -> None:
        if self._hold is not None:
            self._hold[1].set()
            self._hold = None

    def hold_answers(self) -> None:
        """Message creates from now on are taken (in ``sent``, on their way to the phone) but not
        answered until ``release_answers``: a sender killed meanwhile never learns the MessageSid."""
        self._answers_held = asyncio.Event()

    def release_answers(self) -> None:
        if self._answers_held is not None:
            self._answers_held.set()
            self._answers_held = None

    def fail_lists(self, count: int = 1) -> None:
        """The next ``count`` message list requests answer 503."""
        self._list_faults += count

    async def _list_messages(self, request: web.Request) -> web.Response:
        """Messages.json as Twilio lists it, newest first, filtered by ``To`` and ``From``."""
        if not self._authorized(request):
            return web.json_response({"code": 20003, "message": "Authenticate", "status": 401}, status=401)
        self.lists += 1
        if self._list_faults:
            self._list_faults -= 1
            return web.json_response({"code": 20500, "message": "fault injected by the test", "status": 503},
                                     status=503)  # fmt: skip
        to, from_ = request.query.get("To"), request.query.get("From")
        size = int(request.query.get("PageSize", "50"))
        found = [m for m in reversed(self.sent) if (to is None or m.to == to) and (from_ is None or m.from_ == from_)]
        uri = f"/2010-04-01/Accounts/{self.account_sid}/Messages.json"
        return web.json_response({
            "messages": [self._message_json(m) for m in found[:size]], "end": min(size, len(found)) - 1,
            "first_page_uri": uri, "next_page_uri": None, "page": 0, "page_size": size, "previous_page_uri": None,
            "start": 0, "uri": uri,
        })  # fmt: skip

    def _message_json(self, message: SentMessage) -> dict[str, object]:
        created = formatdate(message.received_at, usegmt=True).replace("GMT", "+0000")
        return {"sid": message.sid, "status": message.status, "to": message.to, "from": message.from_,
                "body": message.body, "account_sid": message.account_sid, "num_segments": "1",
                "direction": "outbound-api", "date_created": created, "date_updated": created,
                "date_sent": None}  # fmt: skip

    async def _fetch_account(self, request: web.Request) -> web.Response:
        """The account, for its own SID and auth token only (Basic auth, as Twilio checks it)."""
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode("ascii")
        sid = request.match_info["account"]
        if request.headers.get("Authorization") != f"Basic {expected}" or sid != self.account_sid:
            return web.json_response(
                {"code": 20003, "message": "Authenticate", "more_info": "https://www.twilio.com/docs/errors/20003",
                 "status": 401}, status=401,
            )  # fmt: skip
        return web.json_response(
            {"sid": sid, "friendly_name": "Pepper test account", "status": "active", "type": "Full",
             "auth_token": self.auth_token, "date_created": None, "date_updated": None, "owner_account_sid": sid,
             "uri": f"/2010-04-01/Accounts/{sid}.json", "subresource_uris": {}},
        )  # fmt: skip

    async def _create_message(self, request: web.Request) -> web.Response:
        form = await request.post()
        if self._hold is not None and len(self.sent) >= self._hold[0]:
            self.held += 1
            try:
                await self._hold[1].wait()
            finally:
                self.held -= 1
        if self._faults:
            status, code = self._faults.pop(0)
            return web.json_response(
                {"code": code, "message": "fault injected by the test", "status": status}, status=status
            )
        message = SentMessage(
            sid=new_sid("SM"),
            to=str(form.get("To")),
            from_=str(form.get("From")),
            body=str(form.get("Body", "")),
            status_callback=form.get("StatusCallback"),  # type: ignore[arg-type]
            account_sid=request.match_info["account"],
            auth=request.headers.get("Authorization"),
        )
        self.sent.append(message)
        if self.response_delay:
            await asyncio.sleep(self.response_delay)
        if self._answers_held is not None:
            await self._answers_held.wait()
        if self._receipts is not None and message.status_callback:
            task = asyncio.create_task(self._report(message), name=f"twilio-receipts-{message.sid}")
            self._receipt_tasks.add(task)
            task.add_done_callback(self._receipt_tasks.discard)
        return web.json_response(
            {"sid": message.sid, "status": "queued", "to": message.to, "from": message.from_, "body": message.body,
             "account_sid": message.account_sid, "num_segments": "1", "direction": "outbound-api"},
            status=201,
        )  # fmt: skip

    def _authorized(self, request: web.Request) -> bool:
        expected = base64.b64encode(f"{self.account_sid}:{self.auth_token}".encode()).decode("ascii")
        return request.headers.get("Authorization") == f"Basic {expected}"

    async def _create_call(self, request: web.Request) -> web.Response:
        form = await request.post()
        if not self._authorized(request):
            return web.json_response({"code": 20003, "message": "Authenticate", "status": 401}, status=401)
        if not form.get("To") or not form.get("From") or not (form.get("Url") or form.get("Twiml")):
            return web.json_response({"code": 21205, "message": "Url, To and From are required", "status": 400},
                                     status=400)  # fmt: skip
        if self._faults:
            status, code = self._faults.pop(0)
            return web.json_response({"code": code, "message": "fault injected by the test", "status": status},
                                     status=status)  # fmt: skip
        placed = PlacedCall(
            sid=new_sid("CA"), to=str(form["To"]), from_=str(form["From"]), url=str(form.get("Url", "")),
            status_callback=form.get("StatusCallback"),  # type: ignore[arg-type]
            status_events=[str(v) for v in form.getall("StatusCallbackEvent", [])],
            machine_detection=form.get("MachineDetection"),  # type: ignore[arg-type]
            send_digits=form.get("SendDigits"),  # type: ignore[arg-type]
            auth=request.headers.get("Authorization"),
        )  # fmt: skip
        self.calls.append(placed)
        return web.json_response(self._call_json(placed, "queued"), status=201)

    def _call_json(self, placed: PlacedCall, status: str) -> dict[str, object]:
        return {"sid": placed.sid, "account_sid": self.account_sid, "to": placed.to, "from": placed.from_,
                "status": status, "direction": "outbound-api", "api_version": "2010-04-01",
                "uri": f"/2010-04-01/Accounts/{self.account_sid}/Calls/{placed.sid}.json"}  # fmt: skip

    async def _update_call(self, request: web.Request) -> web.Response:
        form = await request.post()
        if not self._authorized(request):
            return web.json_response({"code": 20003, "message": "Authenticate", "status": 401}, status=401)
        sid = request.match_info["sid"]
        self.updates.append((sid, str(form.get("Twiml", ""))))
        placed = next((c for c in self.calls if c.sid == sid), None)
        body = self._call_json(placed, "in-progress") if placed else {
            "sid": sid, "account_sid": self.account_sid, "status": "in-progress"}  # fmt: skip
        return web.json_response(body)

    async def _lookup(self, request: web.Request) -> web.Response:
        if not self._authorized(request):
            return web.json_response({"code": 20003, "message": "Authenticate", "status": 401}, status=401)
        number = request.match_info["number"]
        self.looked_up.append(number)
        line_type, name = self.lookup_answers.get(number, (None, None))
        return web.json_response({
            "phone_number": number, "valid": True, "country_code": "US", "calling_country_code": "1",
            "national_format": number, "validation_errors": [],
            "caller_name": {"caller_name": name, "caller_type": "CONSUMER" if name else None, "error_code": None},
            "line_type_intelligence": {"type": line_type, "carrier_name": None, "error_code": None,
                                       "mobile_country_code": None, "mobile_network_code": None},
            "url": f"https://lookups.twilio.com/v2/PhoneNumbers/{number}",
        })  # fmt: skip

    async def wait_for_calls(self, count: int, within: float = 10.0) -> list[PlacedCall]:
        deadline = asyncio.get_running_loop().time() + within
        while len(self.calls) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {count} placed call(s), got {len(self.calls)}")
            await asyncio.sleep(0.01)
        return self.calls[:count]

    async def wait_for_updates(self, count: int, within: float = 10.0) -> list[tuple[str, str]]:
        deadline = asyncio.get_running_loop().time() + within
        while len(self.updates) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {count} call update(s), got {len(self.updates)}")
            await asyncio.sleep(0.01)
        return self.updates[:count]

    def call_form(self, placed: PlacedCall, status: str, **extra: str) -> dict[str, str]:
        """The form Twilio posts about a call it placed (its TwiML request or a status callback)."""
        return {"CallSid": placed.sid, "AccountSid": self.account_sid, "From": placed.from_, "To": placed.to,
                "CallStatus": status, "Direction": "outbound-api", "ApiVersion": "2010-04-01", **extra}  # fmt: skip

    async def call_status(
        self, local_base: str, public_base: str, placed: PlacedCall, status: str, **extra: str
    ) -> tuple[int, str]:
        """Post a status callback for a placed call (numbered as Twilio numbers them)."""
        assert placed.status_callback, "Pepper placed this call without a status callback"
        assert placed.status_callback.startswith(public_base), placed.status_callback
        params = self.call_form(placed, status, SequenceNumber=str(placed.sequence), **extra)
        placed.sequence += 1
        return await self.post_form(local_base, public_base, urlsplit(placed.status_callback).path, params)

    async def answer_call(
        self, local_base: str, public_base: str, placed: PlacedCall, answered_by: str
    ) -> tuple[int, str]:
        """The callee (``human``) or their voicemail (``machine_end_beep``...) answers: the status
        callbacks Twilio sends, then its request for TwiML with ``AnsweredBy``; the TwiML."""
        await self.call_status(local_base, public_base, placed, "ringing")
        if placed.send_digits:  # keys Twilio presses once the call connects (REST ``SendDigits``)
            await self.play_digits(placed, placed.send_digits)
        assert placed.url.startswith(public_base), placed.url
        params = self.call_form(placed, "in-progress", AnsweredBy=answered_by)
        return await self.post_form(local_base, public_base, urlsplit(placed.url).path, params)

    async def stream_ended(
        self, local_base: str, public_base: str, placed: PlacedCall, action_url: str | None
    ) -> tuple[int, str]:
        """What Twilio does when a ``<Connect><Stream>`` of a placed call ends (the media socket
        closed): it asks the ``<Connect action>`` (without one, the call moves on to the next verb)
        and runs the TwiML that comes back, in order, up to the first ``<Connect>``: each
        ``<Play digits>`` is played to the far end (``digits_heard``; ``w`` waits 0.5 s). The
        TwiML is returned: a ``<Connect><Stream>`` in it is the call's next stream."""
        if action_url is None:
            return 0, ""
        assert action_url.startswith(public_base), action_url
        status, text = await self.post_form(local_base, public_base, urlsplit(action_url).path,
                                            self.call_form(placed, "in-progress"))  # fmt: skip
        if status != 200:
            return status, text
        for verb in ET.fromstring(text):
            if verb.tag == "Connect" or verb.tag == "Hangup":
                break
            digits = verb.get("digits") if verb.tag == "Play" else None
            if digits:
                await self.play_digits(placed, digits)
        return status, text

    async def play_digits(self, placed: PlacedCall, digits: str) -> None:
        """DTMF to the far end of a placed call, as ``<Play digits>`` plays it: ``w`` is a pause of
        half a second, any other character one key pressed."""
        for key in digits:
            if key == "w":
                await asyncio.sleep(0.5)
            else:
                placed.digits_heard.append(key)

    # --- Twilio -> Pepper ------------------------------------------------------------------------

    def sign(self, public_url: str, params: dict[str, str]) -> str:
        return sign(self.auth_token, public_url, params)

    async def post_form(
        self,
        local_base: str,
        public_base: str,
        path: str,
        params: dict[str, str],
        *,
        signature: str | None = None,
        session: aiohttp.ClientSession | None = None,
    ) -> tuple[int, str]:
        """POST a signed form to ``local_base + path``, signed over ``public_base + path``."""
        headers = {"X-Twilio-Signature": signature or self.sign(public_base + path, params)}
        owned = session is None
        session = session or aiohttp.ClientSession()
        try:
            async with session.post(local_base + path, data=params, headers=headers) as response:
                return response.status, await response.text()
        finally:
            if owned:
                await session.close()

    def inbound_message(self, *, sender: str, to: str, body: str, **extra: str) -> dict[str, str]:
        """The form Twilio posts for an incoming SMS (or WhatsApp, with ``whatsapp:`` addresses)."""
        return {
            "MessageSid": extra.pop("MessageSid", new_sid("SM")),
            "AccountSid": self.account_sid,
            "From": sender,
            "To": to,
            "Body": body,
            "NumMedia": "0",
            "NumSegments": "1",
            "SmsStatus": "received",
            "ApiVersion": "2010-04-01",
            **extra,
        }

    def send_receipts(self, local_base: str, public_base: str, statuses: tuple[str, ...] = RECEIPTS) -> None:
        """From now on, report ``statuses`` for every message Pepper sends, one after the other
        right after the send, as Twilio does (answers in ``receipt_statuses``)."""
        self._receipts = (local_base, public_base, statuses)

    async def receipts_done(self) -> None:
        """Wait for every automatic receipt under way."""
        while self._receipt_tasks:
            await asyncio.gather(*self._receipt_tasks, return_exceptions=True)

    async def _report(self, message: SentMessage) -> None:
        assert self._receipts is not None
        local_base, public_base, statuses = self._receipts
        if self._receipt_session is None:
            self._receipt_session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        session = self._receipt_session
        for status in statuses:
            message.status = status
            try:
                code, _ = await self.send_status(local_base, public_base, message, status, session=session)
            except aiohttp.ClientError:
                code = 0
            self.receipt_statuses.append(code)

    async def send_status(
        self,
        local_base: str,
        public_base: str,
        message: SentMessage,
        status: str,
        *,
        session: aiohttp.ClientSession | None = None,
    ) -> tuple[int, str]:
        """Report a delivery status for a message Pepper sent, to the callback it gave."""
        assert message.status_callback, "Pepper sent this message without a status callback"
        path = urlsplit(message.status_callback).path
        assert message.status_callback.startswith(public_base), message.status_callback
        params = {"MessageSid": message.sid, "MessageStatus": status, "AccountSid": self.account_sid,
                  "To": message.to, "From": message.from_}  # fmt: skip
        return await self.post_form(local_base, public_base, path, params, session=session)

    async def wait_for_sent(self, count: int, within: float = 10.0) -> list[SentMessage]:
        deadline = asyncio.get_running_loop().time() + within
        while len(self.sent) < count:
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"expected {count} sent message(s), got {len(self.sent)}")
            await asyncio.sleep(0.01)
        return self.sent[:count]
