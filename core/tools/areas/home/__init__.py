"""Feature area: the person's home through Home Assistant (``pepper connect home-assistant``).

``home_states`` reads entity states. ``home_action`` calls a service on one entity: a write,
staged, so the call goes out only once the reply that says what it does has reached the person;
it names an entity that exists (checked against the states) and a service of that entity's
domain from a fixed list. It is refused in scheduled runs (``acts``: no one is there to confirm),
and a lock, alarm or garage door (``cover``) needs the person's yes in a later message: the
first call only asks (``confirm_token`` comes back), the call in a later turn with it acts.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from typing import Any
from uuid import UUID

from core.errors import PepperError
from core.store.queries import Queries
from core.tools.areas.home.client import ENTITY, HomeUnavailable, call_service, check, clean_url, states
from core.tools.connectors import Connectors, connection_secret, seal
from core.tools.registry import Tool, ToolContext, ToolOutcome

AREA = "home"
CONNECTION = "home_assistant"
log = logging.getLogger(__name__)

SERVICES: dict[str, tuple[str, ...]] = {
    "light": ("turn_on", "turn_off", "toggle"),
    "switch": ("turn_on", "turn_off", "toggle"),
    "fan": ("turn_on", "turn_off"),
    "climate": ("set_temperature", "turn_on", "turn_off"),
    "media_player": ("media_play", "media_pause", "volume_set", "turn_off"),
    "cover": ("open_cover", "close_cover", "stop_cover"),
    "lock": ("lock", "unlock"),
    "alarm_control_panel": ("alarm_arm_away", "alarm_arm_home", "alarm_disarm"),
    "scene": ("turn_on",),
    "script": ("turn_on",),
    "vacuum": ("start", "return_to_base"),
    "input_boolean": ("turn_on", "turn_off", "toggle"),
}
SENSITIVE = frozenset({"lock", "cover", "alarm_control_panel"})
DATA_KEYS = frozenset({"temperature", "brightness_pct", "volume_level"})


async def connect_home_assistant(db: Queries, connectors: Connectors, account_id: UUID, url: str, token: str) -> str:
    """Check the token against the server, then store the connection (token sealed); its URL."""
    url = clean_url(url)
    if not token.strip():
        raise HomeUnavailable("no token given")
    await check(connectors, url, token.strip())
    await db.execute(
        """
        INSERT INTO connections (account_id, provider, label, config, sealed)
        VALUES ($1, 'home_assistant', '', $2::jsonb, $3)
        ON CONFLICT (account_id, provider, label) DO UPDATE SET config = EXCLUDED.config, sealed = EXCLUDED.sealed,
            secret = '{}', updated_at = now()
        """,
        account_id, json.dumps({"url": url}), seal(connectors, {"token": token.strip()}),
    )  # fmt: skip
    return url


async def _server(db: Queries, connectors: Connectors, account_id: UUID) -> tuple[str, str]:
    row = await db.fetchrow(
        "SELECT id, config FROM connections WHERE account_id = $1 AND provider = 'home_assistant'", account_id
    )
    if row is None:
        raise HomeUnavailable("Home Assistant is not connected")
    secret = await connection_secret(db, connectors, row["id"]) or {}
    config = json.loads(row["config"]) if isinstance(row["config"], str) else row["config"]
    return config["url"], str(secret.get("token", ""))


def _confirm_token(key: str, turn_id: UUID | None, entity: str, service: str) -> str:
    """The asking turn's id (its first 12 hex digits) and a MAC keyed with the sealed token, which
    the model never sees: a token it makes up does not verify."""
    prefix = turn_id.hex[:12] if turn_id else "0" * 12
    mac = hmac.new(key.encode(), f"{turn_id}:{entity}:{service}".encode(), hashlib.sha256).hexdigest()[:8]
    return prefix + mac


async def _confirmed(ctx: ToolContext, key: str, entity: str, service: str, given: str | None) -> bool:
    """Whether ``given`` is the token an earlier turn of this person (within 30 minutes) asked with."""
    if not given or len(given) != 20:
        return False
    turn_id = await ctx.db.fetchval(
        """
        SELECT t.id FROM turns t JOIN conversations c ON c.id = t.conversation_id
        WHERE c.account_id = $1 AND replace(t.id::text, '-', '') LIKE $2 || '%' AND t.id IS DISTINCT FROM $3
          AND t.started_at > now() - interval '30 minutes'
        """,
        ctx.session.account_id, given[:12], ctx.session.turn_id,
    )  # fmt: skip
    return turn_id is not None and hmac.compare_digest(_confirm_token(key, turn_id, entity, service), given)


def make_tools(connectors: Connectors) -> tuple[Tool, ...]:
    async def _states(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        try:
            url, token = await _server(ctx.db, connectors, ctx.session.account_id)
            found = await states(connectors, url, token)
        except PepperError as exc:
            return ToolOutcome.failed(exc.message)
        domain, words = args.get("domain"), str(args.get("search", "")).lower()
        lines = []
        for s in found:
            name = str((s.get("attributes") or {}).get("friendly_name") or s["entity_id"])
            if domain and not s["entity_id"].startswith(f"{domain}."):
                continue
            if words and words not in name.lower() and words not in s["entity_id"]:
                continue
            lines.append(f"- {s['entity_id']} ({name[:60]}): {str(s.get('state'))[:40]}")
        if not lines:
            return ToolOutcome.empty("no matching Home Assistant entities")
        more = f"\n({len(lines) - 40} more: narrow by domain or search)" if len(lines) > 40 else ""
        return ToolOutcome.ok("\n".join(lines[:40]) + more)

    async def _plan_action(ctx: ToolContext, args: dict[str, Any]) -> ToolOutcome:
        entity, service = args["entity_id"], args["service"]
        domain = entity.split(".", 1)[0]
        if service not in SERVICES.get(domain, ()):
            allowed = ", ".join(SERVICES.get(domain, ())) or "none"
            return ToolOutcome.failed(f"{domain} entities take these services only: {allowed}")
        data = {k: v for k, v in (args.get("data") or {}).items() if k in DATA_KEYS}
        try:
            url, token = await _server(ctx.db, connectors, ctx.session.account_id)
            known = {s["entity_id"]: s for s in await states(connectors, url, token)}
        except PepperError as exc:
            return ToolOutcome.failed(exc.message)
        if entity not in known:
            return ToolOutcome.failed(f"Home Assistant has no entity {entity}; check home_states")
        if domain in SENSITIVE and not await _confirmed(ctx, token, entity, service, args.get("confirm_token")):
            asked = _confirm_token(token, ctx.session.turn_id, entity, service)
            return ToolOutcome.failed(
                f"{service} on {entity} needs the person's yes first: ask them; when they say yes in their next "
                f"message, call again with confirm_token {asked!r}. Nothing was done."
            )
        name = str((known[entity].get("attributes") or {}).get("friendly_name") or entity)
        payload = {"domain": domain, "service": service, "data": {**data, "entity_id": entity}}
        return ToolOutcome.planned(payload, f"{service.replace('_', ' ')} {name}")

    async def _act(db: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
        url, token = await _server(db, connectors, account_id)
        await call_service(connectors, url, token, payload["domain"], payload["service"], payload["data"])

    return (
        Tool(
            "home_states",
            "States of the person's Home Assistant entities.",
            {"type": "object", "properties": {
                "domain": {"type": "string", "enum": sorted({*SERVICES, "sensor", "binary_sensor"})},
                "search": {"type": "string", "maxLength": 60}}, "additionalProperties": False},
            _states, AREA, needs_connection=CONNECTION,
        ),
        Tool(
            "home_action",
            "Call a Home Assistant service on one entity (runs once the reply is delivered).",
            {"type": "object", "properties": {
                "entity_id": {"type": "string", "pattern": ENTITY.pattern},
                "service": {"type": "string", "pattern": "^[a-z_]{1,40}$"},
                "data": {"type": "object", "properties": {"temperature": {"type": "number"},
                         "brightness_pct": {"type": "integer", "minimum": 0, "maximum": 100},
                         "volume_level": {"type": "number", "minimum": 0, "maximum": 1}},
                         "additionalProperties": False},
                "confirm_token": {"type": "string", "maxLength": 20}},
             "required": ["entity_id", "service"], "additionalProperties": False},
            _plan_action, AREA, writes=True, staged=True, apply=_record, after_commit=_act, acts=True,
            needs_connection=CONNECTION,
        ),
    )  # fmt: skip


async def _record(conn: Queries, account_id: UUID, payload: dict[str, Any]) -> None:
    """Nothing to store before the call: the staged write itself is the record."""
    log.info("home action committed: %s.%s", payload["domain"], payload["service"])
