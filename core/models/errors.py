"""The model error tree. Adapters convert SDK errors into these at the boundary (``raise ... from``).

``retryable`` is what failover reads: only transient errors (429, 5xx, timeouts, dropped
connections) may move a call to the alternate provider, and only before the reply streamed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.errors import PepperError

if TYPE_CHECKING:
    from core.models.types import Usage


class ModelError(PepperError):
    code = "model-error"
    retryable = False
    # What the provider reported it had used before the call failed (a stream cut after its start
    # event named the input tokens), or None when it reported nothing: a failed call is charged
    # with this and no more.
    usage: Usage | None = None
    model: str | None = None  # the configured model that failed, when the router knows it

    def __init__(self, message: str, *, provider: str | None = None, status: int | None = None, **kw):
        super().__init__(message, **kw)
        self.provider = provider
        self.status = status


class ModelTransientError(ModelError):
    """Rate limits, server errors, timeouts, dropped connections: another try may work."""

    code = "model-unavailable"
    retryable = True


class ModelRequestError(ModelError):
    """The provider rejected the request itself (400, 404, 422): another provider won't fix it."""

    code = "model-bad-request"


class ModelAuthError(ModelError):
    code = "model-auth-failed"


class ModelNotConfigured(ModelError):
    """No provider key for the model asked for; the person is told plainly, nothing crashes."""

    code = "model-not-configured"


class StreamInterrupted(ModelError):
    """The stream broke after the reply began; never failed over (the person saw part of it)."""

    code = "model-stream-interrupted"
