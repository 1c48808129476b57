"""The HTTP API's OpenAPI description, published at ``GET /openapi.json``.

Built from the app's own routing table, so every route is in it, however it was added (a plugin's
routes too): the path, its parameters and methods come from the URL rule, and what a request
carries (a Twilio form, a JSON body, a query) from :data:`REQUESTS`. A route without an entry
there is still described, as taking any JSON object, so a fuzzer reaches it.

Written here rather than with an OpenAPI extension: Pepper's handlers check their input by hand
(each answers a precise 4xx), and declaring schemas through an extension would mean rewriting
every handler's validation around it. The description says what a well-formed request looks like;
the fuzz tests (``tests/test_fuzz_http.py``) hold the handlers to answering anything else with a
4xx, never a 5xx.
"""

from __future__ import annotations

import re
from typing import Any

from quart import Quart

OPENAPI_VERSION = "3.0.3"
SKIPPED_METHODS = frozenset({"HEAD", "OPTIONS"})
_RULE_PARAMETER = re.compile(r"<(?:(?P<converter>[a-z]+):)?(?P<name>\w+)>")

TEXT = {"type": "string"}
FORM = "application/x-www-form-urlencoded"
JSON = "application/json"


def _form(*fields: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": {f: TEXT for f in fields}, "required": list(required)}


def _json(properties: dict[str, Any], *required: str) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required)}


TWILIO_SIGNED = {"name": "X-Twilio-Signature", "in": "header", "required": True, "schema": TEXT}
INBOUND_MESSAGE = _form(
    "From", "To", "Body", "MessageSid", "AccountSid", "NumMedia", required=("From", "To", "MessageSid")
)
INBOUND_CALL = _form(
    "CallSid", "From", "To", "AccountSid", "CallStatus", "Direction", "ForwardedFrom", "StirVerstat",
    required=("CallSid", "From", "To"),
)  # fmt: skip

IMAP_FIELDS = ("host", "port", "username", "password", "security", "label")

# What each route's request carries, by (method, rule): a body (content type and schema), query
# parameters, headers. Anything not given: no body, no query.
REQUESTS: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/twilio/sms"): {"form": INBOUND_MESSAGE, "headers": [TWILIO_SIGNED], "summary": "An inbound SMS"},
    ("POST", "/twilio/whatsapp"): {
        "form": INBOUND_MESSAGE,
        "headers": [TWILIO_SIGNED],
        "summary": "A WhatsApp message",
    },
    ("POST", "/twilio/status"): {
        "form": _form(
            "MessageSid", "MessageStatus", "ErrorCode", "AccountSid", required=("MessageSid", "MessageStatus")
        ),
        "headers": [TWILIO_SIGNED],
        "summary": "A sent message's delivery status",
    },
    ("POST", "/twilio/voice"): {"form": INBOUND_CALL, "headers": [TWILIO_SIGNED], "summary": "An incoming call"},
    ("POST", "/twilio/voice/after-stream"): {
        "form": INBOUND_CALL,
        "headers": [TWILIO_SIGNED],
        "summary": "A call whose media stream ended",
    },
    ("POST", "/twilio/voice/status"): {
        "form": _form("CallSid", "CallStatus", "CallDuration", "AccountSid", required=("CallSid", "CallStatus")),
        "headers": [TWILIO_SIGNED],
        "summary": "A call's status",
    },
    ("POST", "/email/inbound"): {
        "form": _form(
            "sender",
            "recipient",
            "subject",
            "body-plain",
            "Message-Id",
            "timestamp",
            "token",
            "signature",
            required=("sender", "recipient", "timestamp", "token", "signature"),
        ),
        "summary": "Inbound mail (Mailgun's signed form)",
    },
    ("POST", "/chat/login"): {"form": _form("login", "password", required=("login", "password")), "summary": "Sign in"},
    ("GET", "/api/messages"): {"query": {"limit": {"type": "integer", "minimum": 1, "maximum": 500}}},
    ("POST", "/api/messages"): {
        "json": _json({"text": {"type": "string", "minLength": 1}, "client_id": TEXT}, "text"),
        "summary": "Send the assistant a message",
    },
    ("GET", "/api/events"): {
        "query": {"after": TEXT, "progress": {"type": "string", "enum": ["0", "1"]}},
        "stream": True,
        "summary": "Server-sent events: the chat's new messages",
    },
    ("POST", "/api/folder"): {"json": _json({"tools": {"type": "array", "items": {"type": "object"}}}, "tools")},
    ("POST", "/api/folder/<raw_id>/calls/<raw_call>"): {
        "json": _json({"content": TEXT, "is_error": {"type": "boolean"}}, "content"),
    },
    ("POST", "/api/calls"): {
        "json": _json({"type": {"type": "string", "enum": ["offer"]}, "sdp": TEXT}, "type", "sdp"),
        "summary": "Start a call from the browser (a WebRTC offer)",
    },
    ("POST", "/api/dossier"): {"json": _json({"text": TEXT}, "text"), "summary": "Replace the dossier's text"},
    ("POST", "/api/connections/imap"): {
        "json": _json({k: TEXT for k in IMAP_FIELDS}, "host", "username", "password"),
        "summary": "Connect an IMAP mailbox (signed in and checked before it is stored)",
    },
    ("POST", "/api/drafts/<kind>/<draft_id>/<action>"): {
        "json": _json(
            {
                "to": {"type": "array", "items": TEXT},
                "cc": {"type": "array", "items": TEXT},
                "subject": TEXT,
                "body": TEXT,
            }
        ),
        "summary": "Edit, send or discard a draft",
    },
    ("GET", "/connect/google"): {"query": {"area": TEXT}},
    ("GET", "/connect/google/callback"): {"query": {"state": TEXT, "code": TEXT, "error": TEXT}},
}

ANY_JSON_OBJECT = {"type": "object"}


def _path(rule: str) -> tuple[str, list[dict[str, Any]]]:
    parameters = [
        {"name": m["name"], "in": "path", "required": True, "schema": TEXT} for m in _RULE_PARAMETER.finditer(rule)
    ]
    return _RULE_PARAMETER.sub(lambda m: "{" + m["name"] + "}", rule), parameters


def _operation(method: str, rule: str, endpoint: str) -> dict[str, Any]:
    spec = REQUESTS.get((method, rule), {})
    path_parameters = _path(rule)[1]
    query = [
        {"name": name, "in": "query", "required": False, "schema": schema}
        for name, schema in spec.get("query", {}).items()
    ]
    operation: dict[str, Any] = {
        "operationId": f"{endpoint}.{method.lower()}",
        "summary": spec.get("summary", endpoint),
        "parameters": [*path_parameters, *query, *spec.get("headers", [])],
        "responses": {"default": {"description": "a page, JSON, TwiML or an error with its reason"}},
    }
    if spec.get("stream"):
        operation["x-pepper-stream"] = True  # stays open: a client reads it as it comes
    if "form" in spec:
        operation["requestBody"] = {"required": True, "content": {FORM: {"schema": spec["form"]}}}
    elif "json" in spec:
        operation["requestBody"] = {"required": True, "content": {JSON: {"schema": spec["json"]}}}
    elif method in {"POST", "PUT", "PATCH"} and not spec:
        operation["requestBody"] = {"required": False, "content": {JSON: {"schema": ANY_JSON_OBJECT}}}
    return operation


def openapi_document(app: Quart, *, version: str = "") -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for rule in sorted(app.url_map.iter_rules(), key=lambda r: r.rule):
        path, _ = _path(rule.rule)
        for method in sorted(set(rule.methods or ()) - SKIPPED_METHODS):
            paths.setdefault(path, {})[method.lower()] = _operation(method, rule.rule, rule.endpoint)
    return {
        "openapi": OPENAPI_VERSION,
        "info": {"title": "Pepper", "version": version or "dev", "description": "Pepper's HTTP API and webhooks."},
        "paths": paths,
    }


def register(app: Quart) -> None:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    from quart import jsonify

    try:
        version = package_version("pepper")
    except PackageNotFoundError:
        version = ""

    @app.get("/openapi.json")
    async def openapi() -> Any:
        return jsonify(openapi_document(app, version=version))
