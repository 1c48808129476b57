"""The TwiML Pepper answers Twilio's webhooks with, built by the SDK's response classes."""

from __future__ import annotations

from twilio.twiml.messaging_response import MessagingResponse
from twilio.twiml.voice_response import VoiceResponse


def say_and_hang_up(text: str) -> str:
    response = VoiceResponse()
    response.say(text)
    response.hangup()
    return str(response)


def hang_up() -> str:
    response = VoiceResponse()
    response.hangup()
    return str(response)


def connect_stream(stream_url: str, token: str, *, action_url: str | None, name: str) -> str:
    """``<Connect><Stream>`` with the one-time token as a ``<Parameter>``; hang up afterwards.

    The stream URL carries no query string (Twilio does not support one); per-call data rides in
    ``<Parameter>``. When Pepper closes the socket Twilio fetches ``action_url`` (which may say an
    apology), or runs ``<Hangup/>``.
    """
    response = VoiceResponse()
    connect = response.connect(action=action_url) if action_url else response.connect()
    stream = connect.stream(url=stream_url, name=name)
    stream.parameter(name="call_token", value=token)
    response.hangup()
    return str(response)


def play_digits_then_stream(digits: str, stream_url: str, token: str, *, action_url: str | None, name: str) -> str:
    """``<Play digits>`` (DTMF to the far end; ``w`` waits half a second), then a new
    ``<Connect><Stream>`` on the same call, as :func:`connect_stream`."""
    response = VoiceResponse()
    response.play(digits=digits)
    connect = response.connect(action=action_url) if action_url else response.connect()
    stream = connect.stream(url=stream_url, name=name)
    stream.parameter(name="call_token", value=token)
    response.hangup()
    return str(response)


def dial(number: str, *, caller_id: str, ring_seconds: int, action_url: str, whisper_url: str) -> str:
    """``<Dial>`` the number, playing the whisper (``whisper_url``'s TwiML) to whoever picks up
    before the caller is bridged; after ``ring_seconds`` unanswered, or once the call ends,
    Twilio asks ``action_url`` (with ``DialCallStatus``) what next."""
    response = VoiceResponse()
    leg = response.dial(action=action_url, method="POST", timeout=ring_seconds, caller_id=caller_id)
    leg.number(number, url=whisper_url, method="POST")
    return str(response)


def say(text: str) -> str:
    """``<Say>`` and nothing more (a whisper: the call goes on to the bridge)."""
    response = VoiceResponse()
    response.say(text)
    return str(response)


def message_reply(text: str | None = None) -> str:
    """A messaging webhook's answer: ``<Message>`` with ``text``, or an empty ``<Response/>``."""
    response = MessagingResponse()
    if text:
        response.message(text)
    return str(response)
