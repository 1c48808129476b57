"""The deepgram SDK's client for Pepper's Deepgram adapters (speech to text and text to speech).

``base_url`` replaces ``https://api.deepgram.com`` (and ``wss://`` for the websockets): a loopback
peer in tests. The SDK has no environment variable for it.
"""

from __future__ import annotations

import httpx
from deepgram import AsyncDeepgramClient
from deepgram.environment import DeepgramClientEnvironment


def deepgram_client(api_key: str, base_url: str | None) -> tuple[AsyncDeepgramClient, httpx.AsyncClient]:
    """The client and the HTTP client under it, which the caller closes."""
    environment = DeepgramClientEnvironment.PRODUCTION
    if base_url:
        ws = base_url.replace("http", "ws", 1)
        environment = DeepgramClientEnvironment(base=base_url, production=ws, agent=ws, agent_rest=base_url)
    http = httpx.AsyncClient(timeout=15.0)
    return AsyncDeepgramClient(api_key=api_key, environment=environment, httpx_client=http), http
