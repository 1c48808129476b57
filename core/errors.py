"""One error tree for Pepper.

Every error carries a stable kebab-case ``code`` that clients and logs can match on, and says
whether trying again may help (``retryable``). Errors from SDKs and drivers are converted at the
boundary with ``raise ... from exc``; ``asyncio.CancelledError`` is never caught or wrapped.
"""

from __future__ import annotations


class PepperError(Exception):
    code = "pepper-error"
    retryable = False

    def __init__(self, message: str, *, code: str | None = None, retryable: bool | None = None):
        super().__init__(message)
        if code is not None:
            self.code = code
        if retryable is not None:
            self.retryable = retryable

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(PepperError):
    """A setting is missing or wrong; the message names it."""

    code = "config-error"


class StartupError(PepperError):
    """The server cannot start; the message is the one line the operator sees."""

    code = "startup-failed"


class StoreError(PepperError):
    code = "store-error"


class DatabaseUnavailable(StoreError):
    code = "database-unavailable"
    retryable = True


class MissingPgvector(StoreError):
    code = "pgvector-missing"


class DataDirLocked(StartupError):
    code = "data-dir-locked"


class NotFound(PepperError):
    code = "not-found"


class InvalidInput(PepperError):
    code = "invalid-input"
