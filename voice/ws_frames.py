"""WebSocket frames the relay writes to a socket itself, past the websockets library (RFC 6455)."""

from __future__ import annotations


def text_frame_head(size: int, *, masked: bool) -> bytes:
    """The head of one final WebSocket text frame carrying ``size`` bytes (RFC 6455 5.2), up to
    the mask key: for the frames the relay writes to a socket itself, a client's (masked) to the
    model and a server's (unmasked) to Twilio."""
    mask = 0x80 if masked else 0
    if size < 126:
        return bytes((0x81, mask | size))
    if size < 65536:
        return bytes((0x81, mask | 126)) + size.to_bytes(2, "big")
    return bytes((0x81, mask | 127)) + size.to_bytes(8, "big")
