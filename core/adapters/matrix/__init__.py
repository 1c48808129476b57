"""Pepper's Matrix client, on matrix-nio (the only module that imports it).

A small surface in Pepper's own terms: log in, one ``/sync`` long poll at a time, send a text with
a transaction id, create a room, invite, join. nio's responses become plain values
(:class:`SyncBatch`, :class:`RoomEvent`); its error responses become :class:`MatrixError`.

Only what the homeserver says is trusted: an event's sender is the ``sender`` field the homeserver
put on it (it authenticated the sender's access token or checked the signature of the server it
came from); nothing a sender writes in the content can change who it is from.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from nio import (
    AsyncClient,
    AsyncClientConfig,
    ErrorResponse,
    InviteMemberEvent,
    InviteNameEvent,
    JoinResponse,
    LoginResponse,
    RegisterResponse,
    RoomCreateResponse,
    RoomGetStateEventResponse,
    RoomInviteResponse,
    RoomLeaveResponse,
    RoomMessagesResponse,
    RoomPreset,
    RoomSendResponse,
    SyncResponse,
)

from core.errors import PepperError

log = logging.getLogger(__name__)

# One long poll waits this long for news before the homeserver answers with none.
SYNC_TIMEOUT_MS = 30_000


class MatrixError(PepperError):
    """The homeserver refused or could not be reached; ``errcode`` is Matrix's (``M_FORBIDDEN``...)."""

    code = "matrix-error"
    retryable = True

    def __init__(self, message: str, *, errcode: str | None = None, retryable: bool = True) -> None:
        super().__init__(message, retryable=retryable)
        self.errcode = errcode


@dataclass(frozen=True)
class RoomEvent:
    """One ``m.room.message`` as the homeserver delivered it.

    ``mentions``: the user ids in the content's ``m.mentions`` (a proper mention, as Matrix clients
    send it when one picks a person), plus any named in ``formatted_body`` links; ``reply_to``: the
    event this one replies to (``m.relates_to.m.in_reply_to``)."""

    room_id: str
    event_id: str
    sender: str
    body: str
    origin_server_ts: int
    msgtype: str
    mentions: frozenset[str] = frozenset()
    reply_to: str | None = None
    edit: bool = False  # an ``m.replace`` edit of an earlier message


@dataclass(frozen=True)
class Invite:
    """Pepper was invited to ``room_id`` by ``inviter`` (the homeserver's ``sender`` of the
    invite's membership event); ``name``: the room's name as the invite shows it, if any."""

    room_id: str
    inviter: str | None
    name: str = ""


@dataclass(frozen=True)
class SyncBatch:
    next_batch: str
    events: list[RoomEvent] = field(default_factory=list)
    invites: list[Invite] = field(default_factory=list)  # rooms Pepper was invited to
    joined: list[str] = field(default_factory=list)  # rooms in this batch Pepper is joined to


def _mentions(content: dict[str, Any]) -> frozenset[str]:
    found: set[str] = set()
    m = content.get("m.mentions")
    if isinstance(m, dict) and isinstance(m.get("user_ids"), list):
        found |= {u for u in m["user_ids"] if isinstance(u, str)}
    formatted = content.get("formatted_body")
    if isinstance(formatted, str) and "matrix.to/#/@" in formatted:
        for part in formatted.split("matrix.to/#/")[1:]:
            user = part.split('"', 1)[0].split("'", 1)[0].split("?", 1)[0]
            if user.startswith("@"):
                found.add(user.replace("%3A", ":").replace("%3a", ":"))
    return frozenset(found)


def room_event(room_id: str, source: dict[str, Any]) -> RoomEvent | None:
    """A timeline event as Pepper keeps it, or None for anything that is not a readable text message
    (state events, reactions, redactions, garbage)."""
    if source.get("type") != "m.room.message":
        return None
    content, event_id, sender = source.get("content"), source.get("event_id"), source.get("sender")
    if not isinstance(content, dict) or not isinstance(event_id, str) or not isinstance(sender, str):
        return None
    body, msgtype = content.get("body"), content.get("msgtype")
    if not isinstance(body, str) or not isinstance(msgtype, str):
        return None
    relates = content.get("m.relates_to")
    reply_to = None
    edit = False
    if isinstance(relates, dict):
        in_reply = relates.get("m.in_reply_to")
        if isinstance(in_reply, dict) and isinstance(in_reply.get("event_id"), str):
            reply_to = in_reply["event_id"]
        edit = relates.get("rel_type") == "m.replace"
    ts = source.get("origin_server_ts")
    return RoomEvent(
        room_id, event_id, sender, body, ts if isinstance(ts, int) else 0, msgtype, _mentions(content), reply_to, edit
    )


def text_content(body: str, *, reply_to: str | None = None, mention: str | None = None) -> dict[str, Any]:
    """An ``m.text`` message's content; ``reply_to`` makes it a reply, ``mention`` a proper mention."""
    content: dict[str, Any] = {"msgtype": "m.text", "body": body}
    content["m.mentions"] = {"user_ids": [mention]} if mention else {}
    if reply_to:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": reply_to}}
    return content


def _invite(room_id: str, info: Any, me: str) -> Invite:
    # nio parses the invite's stripped state into events (and drops a member event's content
    # from ``source``): read their fields.
    inviter, name = None, ""
    for event in getattr(info, "invite_state", ()):
        if isinstance(event, InviteMemberEvent):
            if event.state_key == me and event.membership == "invite" and isinstance(event.sender, str):
                inviter = event.sender
        elif isinstance(event, InviteNameEvent) and isinstance(event.name, str):
            name = event.name.strip()[:100]
    return Invite(room_id, inviter, name)


def _check(response: Any, wanted: type, what: str) -> Any:
    if isinstance(response, wanted):
        return response
    if isinstance(response, ErrorResponse):
        errcode = response.status_code
        retryable = errcode in (None, "M_LIMIT_EXCEEDED", "M_UNKNOWN")
        raise MatrixError(f"{what}: {errcode or 'error'} {response.message or ''}".strip(), errcode=errcode,
                          retryable=retryable)  # fmt: skip
    raise MatrixError(f"{what}: unexpected answer {type(response).__name__}")


class MatrixClient:
    """One Matrix user's session on a homeserver. ``access_token`` and ``device_id`` from an earlier
    :meth:`login` resume it (the homeserver deduplicates transaction ids per device)."""

    def __init__(self, homeserver: str, user_id: str = "", *, access_token: str = "", device_id: str = "") -> None:
        config = AsyncClientConfig(encryption_enabled=False, store_sync_tokens=False, max_timeouts=2,
                                   request_timeout=SYNC_TIMEOUT_MS / 1000 + 30)  # fmt: skip
        self._client = AsyncClient(homeserver, user_id, device_id=device_id or None, store_path=None, config=config)
        if access_token:
            self._client.restore_login(user_id, device_id, access_token)

    @property
    def user_id(self) -> str:
        return self._client.user_id

    @property
    def access_token(self) -> str:
        return self._client.access_token

    @property
    def device_id(self) -> str:
        return self._client.device_id or ""

    async def _call(self, coro: Any) -> Any:
        try:
            return await coro
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise MatrixError(f"the homeserver could not be reached: {type(exc).__name__}") from exc

    async def login(self, password: str, device_name: str = "pepper") -> None:
        _check(await self._call(self._client.login(password, device_name=device_name)), LoginResponse, "login")

    async def register(self, username: str, password: str) -> None:
        """Register (on a homeserver with open registration: tests and benchmarks) and log in."""
        response = await self._call(self._client.register(username, password, device_name="pepper"))
        _check(response, RegisterResponse, "register")

    async def sync(self, since: str | None, *, timeout_ms: int = SYNC_TIMEOUT_MS) -> SyncBatch:
        """One ``/sync``: what happened after ``since`` (None: the first sync, recent history only)."""
        sync_filter = {"room": {"timeline": {"limit": 50}, "state": {"lazy_load_members": True}},
                       "presence": {"types": []}, "account_data": {"types": []}}  # fmt: skip
        # nio falls back to the token it last saw when ``since`` is None: the caller's token rules.
        self._client.next_batch = None
        self._client.loaded_sync_token = None
        response = await self._call(self._client.sync(timeout=timeout_ms, since=since, sync_filter=sync_filter))
        response = _check(response, SyncResponse, "sync")
        events: list[RoomEvent] = []
        for room_id, room in response.rooms.join.items():
            for event in room.timeline.events:
                source = getattr(event, "source", None)
                found = room_event(room_id, source) if isinstance(source, dict) else None
                if found is not None:
                    events.append(found)
        invites = [_invite(room_id, info, self.user_id) for room_id, info in response.rooms.invite.items()]
        return SyncBatch(response.next_batch, events, invites, list(response.rooms.join))

    async def send_text(
        self, room_id: str, body: str, txn_id: str, *, reply_to: str | None = None, mention: str | None = None
    ) -> str:
        """Post a text; the same ``txn_id`` again (same device) gets the first post's event id back."""
        content = text_content(body, reply_to=reply_to, mention=mention)
        response = await self._call(self._client.room_send(room_id, "m.room.message", content, tx_id=txn_id))
        return _check(response, RoomSendResponse, "send").event_id

    async def send_raw(self, room_id: str, content: dict[str, Any], txn_id: str) -> str:
        """Post any message content as is (tests: what a client other than Pepper may send)."""
        response = await self._call(self._client.room_send(room_id, "m.room.message", content, tx_id=txn_id))
        return _check(response, RoomSendResponse, "send").event_id

    async def history(self, room_id: str, limit: int = 50) -> list[RoomEvent]:
        """The room's last ``limit`` text messages, oldest first (``/messages``, not ``/sync``)."""
        response = await self._call(self._client.room_messages(room_id, limit=limit))
        response = _check(response, RoomMessagesResponse, "messages")
        found = [room_event(room_id, e.source) for e in response.chunk if isinstance(getattr(e, "source", None), dict)]
        return [e for e in reversed(found) if e is not None]

    async def create_room(self, name: str, invite: list[str], *, direct: bool = False) -> str:
        response = await self._call(self._client.room_create(
            name=name or None, invite=invite, is_direct=direct,
            preset=RoomPreset.trusted_private_chat if direct else RoomPreset.private_chat,
        ))  # fmt: skip
        return _check(response, RoomCreateResponse, "create room").room_id

    async def invite(self, room_id: str, user_id: str) -> None:
        _check(await self._call(self._client.room_invite(room_id, user_id)), RoomInviteResponse, "invite")

    async def join(self, room_id: str) -> None:
        _check(await self._call(self._client.join(room_id)), JoinResponse, "join")

    async def membership(self, room_id: str, user_id: str) -> str | None:
        """``user_id``'s membership of the room (``join``, ``invite``, ``leave``...), as the room's
        state says it; None when it has none."""
        response = await self._call(self._client.room_get_state_event(room_id, "m.room.member", user_id))
        if isinstance(response, RoomGetStateEventResponse):
            found = response.content.get("membership")
            return found if isinstance(found, str) else None
        if isinstance(response, ErrorResponse) and response.status_code == "M_NOT_FOUND":
            return None
        return _check(response, RoomGetStateEventResponse, "membership")

    async def leave(self, room_id: str) -> None:
        """Leave a room, or decline an invite to it."""
        _check(await self._call(self._client.room_leave(room_id)), RoomLeaveResponse, "leave")

    async def close(self) -> None:
        await asyncio.shield(self._client.close())
