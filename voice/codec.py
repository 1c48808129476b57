"""G.711 mu-law helpers. ``audioop`` is in the standard library up to Python 3.12 (deprecated,
and warns on import); ``audioop-lts`` provides the same module on 3.13 and later."""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

__all__ = ["audioop", "mulaw_rms"]


def mulaw_rms(data: bytes) -> int:
    """Loudness of mu-law audio (RMS of the 16-bit samples); 0 for digital silence."""
    return audioop.rms(audioop.ulaw2lin(data, 2), 2) if data else 0
