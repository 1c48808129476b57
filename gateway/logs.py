"""One logging set-up for every Pepper process: the web server, turn workers, media processes and
the admin commands each call ``setup_logging`` first thing.

- One format: ``<time> <LEVEL> <process> <logger>: <message>`` (``PEPPER_LOG_FORMAT=text``), or one
  JSON object per line with the same fields (``PEPPER_LOG_FORMAT=json``).
- ``PEPPER_LOG_LEVEL`` is the level of every process.
- Libraries that log through loguru (pipecat, in the voice engines) are routed into standard
  logging at that level, instead of loguru's own DEBUG sink on stderr.
- Libraries that log request bodies (the Twilio SDK: numbers and message text) are held at
  WARNING whatever the level; and in the records of libraries (not Pepper's own, whose messages
  are fixed text), phone numbers and email addresses are masked before they are written.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(pepper_process)s %(name)s: %(message)s"
# Loggers of libraries that write personal data at INFO or DEBUG.
QUIET_LOGGERS = ("twilio",)
PEPPER_PACKAGES = ("core", "voice", "text_loop", "answering_service", "gateway", "pepper", "bench")

# A number with its country code (+ or its URL-encoded %2B), or a long run of digits; not IP
# addresses, ports or times.
_PHONE = re.compile(r"(?:\+|%2B)\d[\d ().-]{6,}\d|\b\d{10,15}\b")
_EMAIL = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


class _Context(logging.Filter):
    """Names the process on every record, and masks personal data in library records."""

    def __init__(self, process: str):
        super().__init__()
        self.process = process

    def filter(self, record: logging.LogRecord) -> bool:
        record.pepper_process = self.process
        if record.name.split(".", 1)[0] not in PEPPER_PACKAGES:
            message = record.getMessage()
            masked = _EMAIL.sub("[email]", _PHONE.sub("[number]", message))
            if masked != message:
                record.msg, record.args = masked, None
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "process": getattr(record, "pepper_process", "pepper"),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


class _PepperHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """Writes to the process's stderr of the moment; marks the handler this module installed,
    so a second call replaces it."""

    @property  # type: ignore[override,unused-ignore]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def setup_logging(level: str = "INFO", fmt: str = "text", *, process: str = "pepper") -> None:
    """Configure the root logger of this process (idempotent; handlers others added are kept)."""
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        numeric = logging.INFO
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _PepperHandler)]:
        root.removeHandler(old)
    handler = _PepperHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_Context(process))
    root.addHandler(handler)
    root.setLevel(numeric)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(numeric, logging.WARNING))
    _route_loguru(numeric)


def _loguru_sink(message: Any) -> None:
    record = message.record
    logger = logging.getLogger(record["name"] or "loguru")
    level = record["level"].no
    if not logger.isEnabledFor(level):
        return
    exception = record["exception"]
    exc_info = (exception.type, exception.value, exception.traceback) if exception else None
    logger.handle(
        logger.makeRecord(
            logger.name, level, record["file"].path, record["line"], record["message"], (), exc_info,
            func=record["function"],
        )
    )  # fmt: skip


def _route_loguru(level: int) -> None:
    try:
        from loguru import logger
    except ImportError:  # not installed: nothing logs through it
        return
    logger.remove()  # loguru's default sink: DEBUG and up, straight to stderr
    logger.add(_loguru_sink, level=level, format="{message}")
