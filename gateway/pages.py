"""The web app's pages: one look (``templates/base.html``, ``static/app.css``) for every page.

``/`` is the home: the chat when signed in, the sign-in form when not (``/chat`` is the same
page). Dashboard pages (``gateway.dashboard``) need a signed-in session and send a signed-out
visitor home. Pages carry the session's CSRF token for their scripts; they are never cached and
run only scripts served from here (no CDN: the app works offline).
"""

from __future__ import annotations

import mimetypes
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from quart import Blueprint, Response, current_app, redirect, render_template, request

from core import access
from gateway.services import Services
from gateway.webchat import COOKIE, MAX_MESSAGE_CHARS

blueprint = Blueprint("pages", __name__, template_folder="templates")

NAV = (
    ("/", "Chat"),
    ("/approvals", "Approvals"),
    ("/calls", "Calls"),
    ("/tasks", "Tasks"),
    ("/rooms", "Rooms"),
    ("/dossier", "Dossier"),
    ("/plots", "Plots"),
    ("/settings", "Settings"),
)
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "media-src 'self' blob:; frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)
STATIC = {"app.css", "app.js", "chat.js", "dashboard.js", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css"}


def _services() -> Services:
    return current_app.extensions["pepper"]


def secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


async def render(template: str, *, title: str, here: str = "", status: int = 200, **context: Any) -> Response:
    """A page in the app's look; ``csrf`` in the context marks it signed in (the nav shows)."""
    html = await render_template(
        template, title=title, here=here, nav=NAV, signed_in=bool(context.get("csrf")), **context
    )
    return secured(Response(html, status=status, content_type="text/html; charset=utf-8"))


async def message_page(status: int, heading: str, text: str) -> Response:
    """A short page that says one thing (the connect pages' answers)."""
    session = await access.session_for(_services().db, request.cookies.get(COOKIE))
    return await render(
        "message.html", title=heading, status=status, heading=heading, text=text,
        csrf=session.csrf_token if session else None,
    )  # fmt: skip


Page = Callable[..., Awaitable[Any]]  # the template's context, or a response


def signed_in_page(where: Blueprint, path: str, title: str) -> Callable[[Page], Page]:
    """Register a page on ``where`` for the signed-in only: its handler gets the account id and
    returns the template's context (``template`` names it), or a response of its own."""

    def register(handler: Page) -> Page:
        async def view(**kwargs: Any) -> Response:
            session = await access.session_for(_services().db, request.cookies.get(COOKIE))
            if session is None:
                return redirect("/")  # type: ignore[return-value]
            context = await handler(session.account_id, **kwargs)
            if isinstance(context, Response):
                return context
            return await render(
                context.pop("template"), title=context.pop("title", title), here=path, csrf=session.csrf_token,
                **context,
            )  # fmt: skip

        view.__name__ = handler.__name__
        where.add_url_rule(path, view_func=view, methods=["GET"])
        return handler

    return register


@blueprint.get("/")
@blueprint.get("/chat")
async def home() -> Response:
    session = await access.session_for(_services().db, request.cookies.get(COOKIE))
    if session is None:
        return await render("signin.html", title="Sign in", error=bool(request.args.get("error")))
    return await render(
        "chat.html", title="Chat", here="/", body_class="chat", csrf=session.csrf_token, max_chars=MAX_MESSAGE_CHARS
    )


@blueprint.get("/static/<path:name>")
async def static(name: str) -> Response:
    if name not in STATIC:
        return Response("not found\n", status=404, content_type="text/plain")
    data = (resources.files("gateway") / "static" / name).read_bytes()
    kind = mimetypes.guess_type(name)[0] or "application/octet-stream"
    response = Response(
        data, content_type=f"{kind}; charset=utf-8" if kind.startswith("text/") or kind.endswith("javascript") else kind
    )
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "public, max-age=300"
    return response
