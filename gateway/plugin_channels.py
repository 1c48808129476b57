"""Text channels from plugins (``kind = "channel"``, ``core.slots.plugins``), through the normal turn path.

A channel plugin is an object with ``name``, ``kind = "channel"``, ``send`` and one way in:

- ``send(address, text, key) -> str | None`` (async): send one reply message to ``address``;
  ``key`` is the same for the same part of the same reply (use it where the service can, to send
  a retried part once); the answer is the service's id for it, or None. Raising (or returning
  anything but a string or None) marks the reply failed. It is called by the turn worker that ran
  the turn, which is not always the process that holds a long-lived connection: send through the
  service's API, not through the connection.
- a **webhook provider**: ``routes(inbox) -> list[PluginRoute]``, served under
  ``/plugins/NAME/`` like a route plugin's (the route checks what its callers must prove: a
  signature, a token); or
- a **long-lived connection**: ``run(inbox)`` (async), run by :class:`ChannelSupervisor` in a
  task of its own in one process (the one that runs the scheduler). It should run until
  cancelled; when it raises or returns it is started again after a pause that doubles up to a
  minute (and resets once a run lasted a minute), so a failing one cannot take the others down.

Either way the plugin hands each message from a person to :meth:`ChannelInbox.receive`
(``address``, ``text``, the service's ``key`` for the message). The sender must be a verified
handle of kind ``plugin`` whose value is ``NAME:address`` (``pepper handle add ACCOUNT plugin
NAME:address --verified``): a message from anyone else is refused and nothing is recorded.
From there the message is a text message like an SMS: recorded once (a second delivery with the
same key records nothing), queued, answered by a turn worker through ``gateway.channels.Pipeline``
on channel ``plugin``, and the reply goes out with the plugin's ``send`` (``PluginChannel``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from core import identity
from core.conversation import conversation_for, record_outbound
from core.errors import InvalidInput
from core.slots.plugins import Plugin, PluginRoute, discover, of_kind
from core.store.queries import Queries
from gateway.channels import Claimed, Delivery, Limits, delivered, failed, receive
from gateway.services import Services

log = logging.getLogger(__name__)

CHANNEL = "plugin"
KIND = "channel"
MAX_TEXT = 8000  # characters of a message from a person
MAX_REPLY_PART = 4000
MAX_KEY = 200
RESTART_FIRST = 0.5  # seconds before a failed connection is started again; doubles up to RESTART_MAX
RESTART_MAX = 60.0
SEND_TIMEOUT = 30.0


class ChannelInbox:
    """Where a channel plugin hands the messages it receives (one inbox per plugin)."""

    def __init__(self, db: Queries, plugin: str) -> None:
        self._db = db
        self.plugin = plugin

    async def receive(self, address: Any, text: Any, key: Any) -> bool:
        """Record a message from ``address`` for a turn: True when recorded now, False when it was
        recorded before (the same ``key``). ``InvalidInput`` for garbage (say so to the service)
        and for a sender who is no verified handle of an account (nothing is recorded)."""
        if not isinstance(address, str) or not isinstance(text, str) or not isinstance(key, str):
            raise InvalidInput("a message needs an address, a text and a key, each a string")
        if not text.strip() or len(text) > MAX_TEXT or "\x00" in text:
            raise InvalidInput(f"a message's text is 1 to {MAX_TEXT} characters")
        if not key or len(key) > MAX_KEY:
            raise InvalidInput(f"a message's key is 1 to {MAX_KEY} characters")
        handle = await identity.find_handle(self._db, "plugin", f"{self.plugin}:{address}")
        if handle is None or not handle.verified:
            log.info("plugin channel message from an unknown sender refused: plugin=%s", self.plugin)
            raise InvalidInput("this sender is not linked to anyone here")
        _, created = await receive(
            self._db, CHANNEL, handle.account_id, text, key=f"{self.plugin}:in:{key}", handle_id=handle.id,
            meta={"plugin": self.plugin, "address": address},
        )  # fmt: skip
        return created


@dataclass
class PluginChannel:
    """The ``plugin`` text channel of ``gateway.channels``: a reply goes out through the plugin
    that received the message (named in its meta)."""

    plugins: dict[str, Plugin]

    @property
    def name(self) -> str:
        return CHANNEL

    @property
    def limits(self) -> Limits:
        return Limits(inbound_chars=MAX_TEXT, reply_part_chars=MAX_REPLY_PART)

    def _plugin(self, claimed: Claimed) -> Plugin | None:
        plugin = self.plugins.get(str(claimed.meta.get("plugin")))
        if plugin is None or plugin.kind != KIND or plugin.error is not None or not hasattr(plugin.obj, "send"):
            return None
        return plugin

    def can_reply(self, claimed: Claimed) -> bool:
        return isinstance(claimed.meta.get("address"), str) and self._plugin(claimed) is not None

    async def deliver(self, services: Services, claimed: Claimed, turn_id: UUID | None, parts: list[str]) -> Delivery:
        # Recorded under ``NAME:out:...`` and messages in under ``NAME:in:KEY``: a sender's key can
        # never take a reply's place in the unique (channel, provider id).
        plugin = self._plugin(claimed)
        assert plugin is not None  # can_reply said so
        address = claimed.meta["address"]
        conversation_id = await conversation_for(services.db, claimed.account_id)
        base = str(turn_id) if turn_id is not None else f"apology-{claimed.message_ids[0]}"
        sent = []
        for n, part in enumerate(parts):
            try:
                answer = await asyncio.wait_for(plugin.obj.send(address, part, f"{base}.{n}"), SEND_TIMEOUT)
            except Exception as exc:  # a plugin's failure fails this reply, nothing else
                log.warning("plugin channel send failed: plugin=%s error=%s", plugin.name, type(exc).__name__)
                return failed("send-failed", plugin=plugin.name, sent=n)
            if answer is not None and not isinstance(answer, str):
                return failed("send-malformed", plugin=plugin.name, sent=n)
            sent_id = f"{plugin.name}:out:{base}.{n}"
            await record_outbound(services.db, conversation_id, CHANNEL, part, turn_id=turn_id,
                                  provider_message_id=sent_id, delivery_status="sent")  # fmt: skip
            sent.append(answer)
        return delivered(plugin=plugin.name, ids=sent)


def channel_plugins(plugins: dict[str, Plugin] | None = None) -> dict[str, Plugin]:
    """The installed channel plugins that loaded, by name."""
    return {p.name: p for p in of_kind(plugins if plugins is not None else discover(), KIND)}


def channel_routes(plugins: dict[str, Plugin], db: Queries) -> list[tuple[Plugin, list[PluginRoute]]]:
    """The webhook routes of the channel plugins that have them, each plugin with its own inbox."""
    out = []
    for plugin in plugins.values():
        make = getattr(plugin.obj, "routes", None)
        if make is None:
            continue
        try:
            out.append((plugin, list(make(ChannelInbox(db, plugin.name)))))
        except Exception:
            log.exception("channel plugin routes failed to load: plugin=%s", plugin.name)
    return out


class ChannelSupervisor:
    """Runs each long-lived channel plugin (one with ``run``) in a task of its own, started again
    after a pause when it fails (see the module's docstring). ``failures`` counts them per plugin."""

    def __init__(self, db: Queries, plugins: dict[str, Plugin], *, clock: Callable[[], float] | None = None) -> None:
        self._db = db
        self._plugins = {n: p for n, p in plugins.items() if callable(getattr(p.obj, "run", None))}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self.failures: dict[str, int] = {}
        self._clock = clock

    @property
    def names(self) -> list[str]:
        return sorted(self._plugins)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        for name, plugin in self._plugins.items():
            if name not in self._tasks:
                self._tasks[name] = loop.create_task(self._keep(plugin), name=f"pepper-channel-{name}")

    async def _keep(self, plugin: Plugin) -> None:
        loop = asyncio.get_running_loop()
        clock = self._clock or loop.time
        pause = RESTART_FIRST
        inbox = ChannelInbox(self._db, plugin.name)
        while True:
            started = clock()
            try:
                await plugin.obj.run(inbox)
                log.warning("channel plugin connection ended; starting it again: plugin=%s", plugin.name)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures[plugin.name] = self.failures.get(plugin.name, 0) + 1
                log.error("channel plugin connection failed; starting it again: plugin=%s error=%s", plugin.name,
                          type(exc).__name__, exc_info=exc)  # fmt: skip
            if clock() - started >= RESTART_MAX:
                pause = RESTART_FIRST  # it ran a good while: a fresh failure, not a loop
            await asyncio.sleep(pause)
            pause = min(pause * 2, RESTART_MAX)

    async def stop(self) -> None:
        tasks, self._tasks = list(self._tasks.values()), {}
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
