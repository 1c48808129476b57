"""What request handlers share: built once at start-up, closed at shutdown."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from core.access import LoginThrottle
from core.settings import Settings
from core.store import Database
from gateway.tasks import BackgroundTasks

if TYPE_CHECKING:
    from core.adapters.twilio.rest import TwilioMessenger
    from gateway.live import LiveFeed


# Connections for recording webhook messages (``Services.ack_db``): each holds one for a single
# short statement.
ACK_POOL_SIZE = 10


@dataclass
class Services:
    settings: Settings
    db: Database  # None only when the app is built to list its routes
    harness: Any = None  # text_loop.HarnessDeps, when models are configured
    messenger: TwilioMessenger | None = None
    mailer: Any = None  # gateway.mailer.SmtpMailer, when Pepper's SMTP account is configured
    calls: Any = None  # voice.service.CallService, when phone calls are wired
    tasks: BackgroundTasks = field(default_factory=BackgroundTasks)
    live: LiveFeed | None = None  # new messages pushed to open chats
    media: Any = None  # gateway.media_server.MediaServer (picows) for Twilio media sockets, while serving
    media_listener: Any = None  # its socket, bound before start-up (socket.socket), or None to bind then
    # Where webhooks record messages: sessions that announce after the commit (see
    # ``core.conversation.ANNOUNCE_LATER``); opened when the app starts serving.
    ack_db: Any = None
    # Failed web sign-ins per login and per address (``/chat/login``).
    login_throttle: LoginThrottle = field(default_factory=LoginThrottle)
