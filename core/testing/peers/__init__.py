"""Scripted loopback model peers: real SDKs talk HTTP to them on 127.0.0.1.

    async with OpenAIPeer() as peer:
        peer.script(reply_tools(("get_weather", {"city": "Paris"})), reply_text("Sunny."))
        ...  # point the SDK (or a Settings base URL) at peer.base_url
        assert peer.requests[0].body["model"] == "gpt-x"

Faults: ``fault(503)``, ``Reply(delay=0.5)``, ``reply_text("a b c", cut_after=3)`` (the stream
connection drops after three events).
"""

from core.testing.peers.anthropic_peer import AnthropicPeer
from core.testing.peers.google_peer import GooglePeer
from core.testing.peers.openai_peer import OpenAIPeer, fake_embedding
from core.testing.peers.script import (
    Cited,
    LoopbackPeer,
    Received,
    Reply,
    ScriptedCall,
    fault,
    reply_text,
    reply_tools,
)

__all__ = [
    "AnthropicPeer",
    "Cited",
    "GooglePeer",
    "LoopbackPeer",
    "OpenAIPeer",
    "Received",
    "Reply",
    "ScriptedCall",
    "fake_embedding",
    "fault",
    "reply_text",
    "reply_tools",
]
