"""A loopback Google API for tests: the OAuth token endpoint, Calendar v3 events and Gmail v1
drafts, sends and reading (``users.messages.list`` with ``q=``, ``users.messages.get``,
``users.messages.attachments.get``, ``users.threads.get``), keeping state in memory like the real service.

Gmail reading answers 403 "insufficient authentication scopes", as Google does, unless the
access token was granted ``gmail.readonly``. :meth:`GoogleApiPeer.add_mail` puts a message in
the mailbox (the API's ``format=full`` shape: ``payload.headers``, base64url ``body.data``,
``labelIds`` with ``UNREAD`` and ``INBOX``); ``q`` understands from:, to:, subject:, is:unread,
is:read, in:inbox, in:sent, after:, before:, newer_than:, older_than: and free words, like Gmail's search.

``async with GoogleApiPeer() as google:`` then ``Connectors(google_api_url=google.url,
google_token_url=google.token_url, google_client_id=..., google_client_secret=...)``.
Recurring events are expanded into instances (``<id>_<UTC stamp>``) for ``singleEvents=true``.
``google.requests`` records (method, path, query, body) of every call; ``google.fail_next``
makes the next API call answer that status, ``google.failing`` every call while it is set.
``events.insert`` takes a client-chosen ``id`` (base32hex) and answers 409 when it is taken (a
deleted event's too); deleting a deleted event answers 410, patching one restores it with ``status``.

OAuth as Google runs it for a web-server app: ``GET /auth`` is the consent page (it consents at
once, or answers ``error=access_denied`` when ``google.deny`` is set) and redirects to the
``redirect_uri`` with a one-time code; ``POST /token`` accepts that code once, with the same
``redirect_uri`` and, when the consent had a PKCE challenge, the matching ``code_verifier``.
Tests that skip the consent page get a code from :meth:`GoogleApiPeer.issue_code`. Granted scopes
are those asked for plus earlier grants (``include_granted_scopes``), unless ``granted_scopes``
overrides them.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import re
import shlex
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from aiohttp import web
from dateutil.rrule import rrulestr

from core.testing.loopback import HttpPeer

STAMP = "%Y%m%dT%H%M%SZ"
# Any of these lets a token read Gmail (users.messages.list/get, users.threads.get).
READ_SCOPES = {
    "https://www.googleapis.com/auth/gmail.readonly", "https://www.googleapis.com/auth/gmail.modify",
    "https://mail.google.com/",
}  # fmt: skip
JSON_BODY = web.RequestKey("json_body", object)
BASE32HEX = re.compile(r"[a-v0-9]{5,1024}")


def _parse(value: dict[str, Any]) -> datetime:
    if value.get("dateTime"):
        moment = datetime.fromisoformat(value["dateTime"].replace("Z", "+00:00"))
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=ZoneInfo(value.get("timeZone", "UTC")))
        return moment
    return datetime.fromisoformat(value["date"]).replace(tzinfo=UTC)


class GoogleApiPeer(HttpPeer):
    def __init__(self, *, client_id: str = "client-id", client_secret: str = "client-secret"):
        self.client_id, self.client_secret = client_id, client_secret
        self.events: dict[str, dict[str, Any]] = {}
        self.instances: dict[str, dict[str, Any]] = {}  # instance overrides by instance id
        self.cancelled: set[str] = set()
        self.drafts: dict[str, dict[str, Any]] = {}
        self.sent: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, dict[str, str], Any]] = []
        self.tokens: set[str] = set()
        self.token_requests: list[dict[str, str]] = []
        self.granted_scopes: str | None = None  # None: what the consent asked for, plus earlier grants
        self.deny = False
        self.auth_requests: list[dict[str, str]] = []
        self.codes: dict[str, dict[str, str | None]] = {}  # issued, not yet used
        self.ever_granted: set[str] = set()
        self.revoked: list[str] = []
        self.fail_next: int | None = None
        self.failing: int | None = None
        self.mail: dict[str, dict[str, Any]] = {}  # Gmail messages by id, in the API's format=full shape
        self.attachments: dict[tuple[str, str], str] = {}  # (message id, attachment id) -> base64url data
        self.token_scopes: dict[str, set[str]] = {}
        self.now: datetime | None = None  # what newer_than: counts back from (None: the real clock)
        self._ids = itertools.count(1)

    @property
    def token_url(self) -> str:
        return f"{self.url}/token"

    def expire_tokens(self) -> None:
        self.tokens.clear()

    def middlewares(self) -> list[Any]:
        return [self._middleware]

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/auth", self._auth),
            web.post("/token", self._token),
            web.post("/revoke", self._revoke),
            web.get("/calendar/v3/calendars/{cal}/events", self._list),
            web.post("/calendar/v3/calendars/{cal}/events", self._insert),
            web.get("/calendar/v3/calendars/{cal}/events/{id}", self._get),
            web.patch("/calendar/v3/calendars/{cal}/events/{id}", self._patch),
            web.delete("/calendar/v3/calendars/{cal}/events/{id}", self._delete),
            web.post("/gmail/v1/users/me/drafts", self._draft),
            web.post("/gmail/v1/users/me/drafts/send", self._draft_send),
            web.post("/gmail/v1/users/me/messages/send", self._send),
            web.get("/gmail/v1/users/me/messages", self._messages_list),
            web.get("/gmail/v1/users/me/messages/{id}", self._messages_get),
            web.get("/gmail/v1/users/me/threads/{id}", self._threads_get),
            web.get("/gmail/v1/users/me/messages/{id}/attachments/{attachment}", self._attachment_get),
        ]

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body = None
        if request.can_read_body and request.content_type == "application/json":
            body = await request.json()
        self.requests.append((request.method, request.path, dict(request.query), body))
        if request.path in ("/token", "/auth", "/revoke"):
            return await handler(request)
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if token not in self.tokens:
            return _error(401, "Request had invalid authentication credentials.")
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return _error(status, "injected failure")
        if self.failing is not None:
            return _error(self.failing, "Backend Error")
        request[JSON_BODY] = body
        if request.method == "GET" and request.path.startswith("/gmail/v1/users/me/"):
            if not self.token_scopes.get(token, set()) & READ_SCOPES:
                return _error(403, "Request had insufficient authentication scopes.")
        return await handler(request)

    # OAuth.
    @property
    def auth_url(self) -> str:
        return f"{self.url}/auth"

    def issue_code(self, redirect_uri: str, scope: str | None = None, challenge: str | None = None) -> str:
        """A one-time authorization code, as if the person had consented to ``scope``."""
        code = f"code-{next(self._ids)}"
        self.codes[code] = {"redirect_uri": redirect_uri, "scope": scope or "", "challenge": challenge}
        return code

    async def _auth(self, request: web.Request) -> web.Response:
        query = dict(request.query)
        self.auth_requests.append(query)
        redirect_uri = query.get("redirect_uri", "")
        if query.get("client_id") != self.client_id or not redirect_uri or query.get("response_type") != "code":
            return web.Response(status=400, text="Error 400: invalid_request")
        back: dict[str, str] = {"state": query["state"]} if "state" in query else {}
        if self.deny:
            back["error"] = "access_denied"
        else:
            challenge = query.get("code_challenge") if query.get("code_challenge_method") == "S256" else None
            back["code"] = self.issue_code(redirect_uri, query.get("scope", ""), challenge)
            back["scope"] = query.get("scope", "")
        raise web.HTTPFound(f"{redirect_uri}?{urlencode(back)}")

    @property
    def revoke_url(self) -> str:
        return f"{self.url}/revoke"

    async def _revoke(self, request: web.Request) -> web.Response:
        token = str((await request.post()).get("token", ""))
        if token != "refresh-1" and token not in self.tokens:
            return web.json_response({"error": "invalid_token"}, status=400)
        self.revoked.append(token)
        self.tokens.clear()
        return web.Response(status=200)

    def _grant(self, issued: dict[str, str | None]) -> str:
        if self.granted_scopes is not None:
            return self.granted_scopes
        self.ever_granted.update((issued["scope"] or "").split())
        return " ".join(sorted(self.ever_granted))

    async def _token(self, request: web.Request) -> web.Response:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.token_requests.append(form)
        if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
            return web.json_response({"error": "invalid_client"}, status=401)
        out: dict[str, Any] = {"expires_in": 3600, "token_type": "Bearer"}
        if form.get("grant_type") == "authorization_code":
            issued = self.codes.pop(form.get("code", ""), None)
            if issued is None or issued["redirect_uri"] != form.get("redirect_uri"):
                return web.json_response({"error": "invalid_grant"}, status=400)
            if issued["challenge"] is not None:
                verifier = form.get("code_verifier", "").encode()
                expected = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=").decode()
                if expected != issued["challenge"]:
                    return web.json_response({"error": "invalid_grant", "error_description": "PKCE"}, status=400)
            out["refresh_token"] = "refresh-1"
            out["scope"] = self._grant(issued)
        elif form.get("refresh_token") != "refresh-1":
            return web.json_response({"error": "invalid_grant"}, status=400)
        token = f"token-{next(self._ids)}"
        self.tokens.add(token)
        scope = out.get("scope") or self.granted_scopes or " ".join(sorted(self.ever_granted))
        self.token_scopes[token] = set(scope.split())
        out["access_token"] = token
        return web.json_response(out)

    # Calendar.
    def _expand(self, event: dict[str, Any], lo: datetime, hi: datetime) -> list[dict[str, Any]]:
        if "recurrence" not in event:
            start, end = _parse(event["start"]), _parse(event["end"])
            return [event] if start < hi and end > lo else []
        tz = ZoneInfo(event["start"].get("timeZone", "UTC"))
        start, end = _parse(event["start"]).astimezone(tz), _parse(event["end"]).astimezone(tz)
        rule = rrulestr(event["recurrence"][0].removeprefix("RRULE:"), dtstart=start.replace(tzinfo=None))
        out = []
        for naive in rule.xafter(
            (lo - (end - start)).astimezone(tz).replace(tzinfo=None) - timedelta(days=1), inc=True
        ):
            occ = naive.replace(tzinfo=tz)
            if occ >= hi:
                break
            iid = f"{event['id']}_{occ.astimezone(UTC):{STAMP}}"
            if iid in self.cancelled:
                continue
            inst = {
                **{k: v for k, v in event.items() if k != "recurrence"},
                "id": iid,
                "recurringEventId": event["id"],
                "start": {"dateTime": occ.isoformat(), "timeZone": tz.key},
                "end": {"dateTime": (occ + (end - start)).isoformat(), "timeZone": tz.key},
            }
            inst.update(self.instances.get(iid, {}))
            if _parse(inst["end"]) > lo and _parse(inst["start"]) < hi:
                out.append(inst)
        return out

    async def _list(self, request: web.Request) -> web.Response:
        lo = datetime.fromisoformat(request.query["timeMin"])
        hi = datetime.fromisoformat(request.query["timeMax"])
        items = [i for e in self.events.values() if e.get("status") != "cancelled" for i in self._expand(e, lo, hi)]
        items.sort(key=lambda i: _parse(i["start"]))
        return web.json_response({"kind": "calendar#events", "items": items})

    async def _insert(self, request: web.Request) -> web.Response:
        body = dict(request[JSON_BODY])
        if "id" in body:  # a client-chosen id, as Google allows: base32hex, 5 to 1024 characters, never reused
            if not BASE32HEX.fullmatch(str(body["id"])):
                return _error(400, "Invalid resource id value.")
            if body["id"] in self.events:  # a deleted (cancelled) event keeps its id too
                return _error(409, "The requested identifier already exists.")
        else:
            body["id"] = f"ev{next(self._ids)}"
        body["status"] = "confirmed"
        body["organizer"] = {"email": "owner@example.com", "self": True}
        body["sendUpdates"] = request.query.get("sendUpdates", "none")
        self.events[body["id"]] = body
        return web.json_response(body)

    def _find(self, event_id: str) -> dict[str, Any] | None:
        if event_id in self.events:
            return self.events[event_id]
        master_id, _, stamp = event_id.rpartition("_")
        master = self.events.get(master_id)
        if master is None or event_id in self.cancelled:
            return None
        occ = datetime.strptime(stamp, STAMP).replace(tzinfo=UTC)
        for inst in self._expand(master, occ - timedelta(days=1), occ + timedelta(days=2)):
            if inst["id"] == event_id:
                return inst
        return None

    async def _get(self, request: web.Request) -> web.Response:
        found = self._find(request.match_info["id"])
        return web.json_response(found) if found else _error(404, "Not Found")

    async def _patch(self, request: web.Request) -> web.Response:
        event_id = request.match_info["id"]
        found = self._find(event_id)
        if found is None:
            return _error(404, "Not Found")
        change = dict(request[JSON_BODY])
        change["lastSendUpdates"] = request.query.get("sendUpdates", "none")
        if event_id in self.events:
            _merge(self.events[event_id], change)
        else:
            _merge(self.instances.setdefault(event_id, {}), change)
        return web.json_response(self._find(event_id) or {})

    async def _delete(self, request: web.Request) -> web.Response:
        event_id = request.match_info["id"]
        found = self._find(event_id)
        if found is None or found.get("status") == "cancelled":
            return _error(410, "Resource has been deleted")
        if event_id in self.events:
            self.events[event_id]["status"] = "cancelled"
            self.events[event_id]["lastSendUpdates"] = request.query.get("sendUpdates", "none")
        else:
            self.cancelled.add(event_id)
        return web.Response(status=204)

    # Gmail.
    async def _draft(self, request: web.Request) -> web.Response:
        draft_id = f"r{next(self._ids)}"
        self.drafts[draft_id] = {"id": draft_id, "message": request[JSON_BODY]["message"]}
        return web.json_response({"id": draft_id, "message": {"id": f"m{draft_id}"}})

    async def _draft_update(self, request: web.Request) -> web.Response:
        draft_id = request.match_info["id"]
        if draft_id not in self.drafts:
            return _error(404, "Not Found")
        self.drafts[draft_id] = {"id": draft_id, "message": request[JSON_BODY]["message"]}
        return web.json_response({"id": draft_id, "message": {"id": f"m{draft_id}"}})

    async def _draft_delete(self, request: web.Request) -> web.Response:
        if self.drafts.pop(request.match_info["id"], None) is None:
            return _error(404, "Not Found")
        return web.Response(status=204)

    async def _draft_send(self, request: web.Request) -> web.Response:
        draft = self.drafts.pop(request[JSON_BODY]["id"], None)
        if draft is None:
            return _error(404, "Not Found")
        self.sent.append(draft["message"])
        return web.json_response({"id": f"m{draft['id']}", "labelIds": ["SENT"]})

    async def _send(self, request: web.Request) -> web.Response:
        self.sent.append(request[JSON_BODY])
        return web.json_response({"id": f"m{next(self._ids)}", "labelIds": ["SENT"]})

    # Gmail reading.
    def add_mail(
        self, sender: str, subject: str, text: str, *, to: str = "owner@example.com", when: datetime | None = None,
        thread: str | None = None, unread: bool = True, html: bool = False, sent: bool = False,
        invitation: str | None = None,
    ) -> str:  # fmt: skip
        """Put a message in the mailbox (received ``when``, default now); returns its id. ``thread``:
        the id of a message (or thread) it replies to; ``sent``: one the person sent (label SENT).
        ``invitation``: an iCalendar text sent as Google Calendar sends one, an inline
        ``text/calendar`` part with its data and the same as an ``invite.ics`` attachment (an
        ``attachmentId``, read with ``users.messages.attachments.get``)."""
        message_id = f"{next(self._ids):x}0000"
        when = when or datetime.now(UTC)
        thread_id = self.mail[thread]["threadId"] if thread in self.mail else thread or message_id
        data = base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")
        mime = "text/html" if html else "text/plain"
        headers = [
            {"name": "From", "value": sender}, {"name": "To", "value": to}, {"name": "Subject", "value": subject},
            {"name": "Date", "value": format_datetime(when)},
            {"name": "Message-ID", "value": f"<{message_id}@mail.gmail.test>"},
        ]  # fmt: skip
        parts: list[dict[str, Any]] = [
            {"partId": "0", "mimeType": mime, "headers": [], "body": {"size": len(text), "data": data}}
        ]
        if invitation is not None:
            ics = base64.urlsafe_b64encode(invitation.encode()).decode().rstrip("=")
            attachment = f"att{next(self._ids)}"
            self.attachments[(message_id, attachment)] = ics
            parts += [
                {"partId": "1", "mimeType": "text/calendar", "filename": "", "headers": [],
                 "body": {"size": len(invitation), "data": ics}},
                {"partId": "2", "mimeType": "application/ics", "filename": "invite.ics", "headers": [],
                 "body": {"size": len(invitation), "attachmentId": attachment}},
            ]  # fmt: skip
        self.mail[message_id] = {
            "id": message_id, "threadId": thread_id,
            "labelIds": ["SENT"] if sent else ["INBOX", *(["UNREAD"] if unread else [])],
            "snippet": text[:100], "internalDate": str(int(when.timestamp() * 1000)), "sizeEstimate": len(text),
            "payload": {
                "mimeType": "multipart/alternative", "headers": headers,
                "parts": parts,
            },
        }  # fmt: skip
        return message_id

    def _matches(self, message: dict[str, Any], q: str) -> bool:
        headers = {h["name"].lower(): h["value"].lower() for h in message["payload"]["headers"]}
        when = datetime.fromtimestamp(int(message["internalDate"]) / 1000, UTC)
        text = base64.urlsafe_b64decode(message["payload"]["parts"][0]["body"]["data"] + "==").decode().lower()
        for token in shlex.split(q.lower()):
            key, sep, value = token.partition(":")
            if not sep:
                ok = token in text or token in headers.get("subject", "") or token in headers.get("from", "")
            elif key in ("from", "to", "subject"):
                ok = value in headers.get(key, "")
            elif key == "is":
                ok = ("UNREAD" in message["labelIds"]) == (value == "unread")
            elif key == "in":
                ok = value.upper() in message["labelIds"]
            elif key in ("after", "before"):
                day = datetime.strptime(value.replace("-", "/"), "%Y/%m/%d").replace(tzinfo=UTC)
                ok = when >= day if key == "after" else when < day
            elif key in ("newer_than", "older_than"):
                n, unit = int(value[:-1]), value[-1]
                edge = (self.now or datetime.now(UTC)) - timedelta(days=n * {"d": 1, "m": 30, "y": 365}[unit])
                ok = when >= edge if key == "newer_than" else when < edge
            else:
                return False
            if not ok:
                return False
        return True

    async def _messages_list(self, request: web.Request) -> web.Response:
        q = request.query.get("q", "")
        limit = int(request.query.get("maxResults", "100"))
        found = [m for m in self.mail.values() if self._matches(m, q)]
        found.sort(key=lambda m: int(m["internalDate"]), reverse=True)
        body: dict[str, Any] = {"resultSizeEstimate": len(found)}
        if found:
            body["messages"] = [{"id": m["id"], "threadId": m["threadId"]} for m in found[:limit]]
        return web.json_response(body)

    async def _messages_get(self, request: web.Request) -> web.Response:
        found = self.mail.get(request.match_info["id"])
        return web.json_response(found) if found else _error(404, "Requested entity was not found.")

    async def _attachment_get(self, request: web.Request) -> web.Response:
        data = self.attachments.get((request.match_info["id"], request.match_info["attachment"]))
        if data is None:
            return _error(404, "Requested entity was not found.")
        return web.json_response({"size": len(_unpad(data)), "data": data})

    async def _threads_get(self, request: web.Request) -> web.Response:
        thread_id = request.match_info["id"]
        messages = sorted(
            (m for m in self.mail.values() if m["threadId"] == thread_id), key=lambda m: int(m["internalDate"])
        )
        if not messages:
            return _error(404, "Requested entity was not found.")
        return web.json_response({"id": thread_id, "historyId": "1", "messages": messages})


def _unpad(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


def _merge(into: dict[str, Any], change: dict[str, Any]) -> None:
    """Patch semantics, as Google's: nested objects merge, ``null`` clears a field, lists replace."""
    for key, value in change.items():
        if value is None:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = {k: v for k, v in value.items() if v is not None} if isinstance(value, dict) else value


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message}}, status=status)


def dumps(value: Any) -> str:
    return json.dumps(value)
