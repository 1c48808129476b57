"""The Quart application: routes only; start-up and shutdown live in ``gateway.server``."""

from __future__ import annotations

import logging

from quart import Quart, jsonify

from core.errors import DatabaseUnavailable
from core.settings import Settings
from core.store import Database

log = logging.getLogger(__name__)


def create_app(settings: Settings, db: Database | None) -> Quart:
    """The app; ``db=None`` builds it only to list its routes (for ``pepper doctor``)."""
    app = Quart("pepper")
    app.config["PEPPER_SETTINGS"] = settings
    app.extensions["pepper_db"] = db

    @app.get("/healthz")
    async def health():  # type: ignore[no-untyped-def]
        if db is None:
            return jsonify(status="unhealthy", database="not opened"), 503
        try:
            detail = await db.health()
        except DatabaseUnavailable:
            log.warning("health check: database unavailable", exc_info=True)
            return jsonify(status="unhealthy", database="unavailable"), 503
        status = "ok" if detail["pending_migrations"] == 0 else "migrating"
        return jsonify(status=status, database="ok", **detail), 200 if status == "ok" else 503

    return app


def served_paths(app: Quart) -> set[str]:
    return {rule.rule for rule in app.url_map.iter_rules()}
