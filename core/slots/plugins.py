"""Plugins: installed Python packages that declare an entry point in the ``pepper.plugins`` group.

Each entry point names an object (a module, a class, which is instantiated with no arguments, or
an instance) with a ``name`` attribute, the plugin's own name. A plugin claims a slot by also
having ``slot``, the slot's exact name, and the slot's methods. An additive plugin has ``kind``
instead: ``model_protocol`` (a model protocol adapter), ``route`` (HTTP routes under
``/plugins/NAME/``), ``channel`` or ``voice_provider``; several of a kind coexist.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

log = logging.getLogger(__name__)

GROUP = "pepper.plugins"
KINDS = ("slot", "model_protocol", "route", "channel", "voice_provider")


@dataclass(frozen=True)
class Plugin:
    """One installed plugin. ``error`` is set (and ``obj`` None) when its entry point did not load."""

    name: str
    entry_point: str
    distribution: str | None
    obj: Any  # None when it did not load
    error: str | None = None

    @property
    def slot(self) -> str | None:
        value = getattr(self.obj, "slot", None)
        return value if isinstance(value, str) else None

    @property
    def kind(self) -> str | None:
        if self.slot is not None:
            return "slot"
        value = getattr(self.obj, "kind", None)
        return value if isinstance(value, str) else None


def _load(ep: metadata.EntryPoint) -> Plugin:
    dist = ep.dist.name if ep.dist is not None else None
    try:
        obj = ep.load()
        if isinstance(obj, type):
            obj = obj()
    except Exception as exc:
        log.warning("plugin did not load: entry_point=%s error=%s", ep.value, type(exc).__name__)
        return Plugin(ep.name, ep.value, dist, None, f"{type(exc).__name__}: {exc}")
    name = getattr(obj, "name", None)
    if callable(name):
        name = name()
    return Plugin(name if isinstance(name, str) and name else ep.name, ep.value, dist, obj)


def discover() -> dict[str, Plugin]:
    """Every plugin installed in this environment, by its own name (the first of a name wins;
    a second of the same name is logged and left out)."""
    found: dict[str, Plugin] = {}
    for ep in metadata.entry_points(group=GROUP):
        plugin = _load(ep)
        if plugin.name in found:
            log.warning("two plugins share a name; the second is left out: name=%s", plugin.name)
            continue
        found[plugin.name] = plugin
    return found


def of_kind(plugins: dict[str, Plugin], kind: str) -> list[Plugin]:
    return [p for p in plugins.values() if p.kind == kind and p.error is None]


# HTTP routes (kind "route"): mounted by the gateway under /plugins/NAME/, framework-neutral.
ROUTE_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
_ROUTE_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
_ROUTE_PATH = re.compile(r"^(/[A-Za-z0-9._~-]+)*/?$")
MAX_ROUTE_BODY = 1024 * 1024


@dataclass(frozen=True)
class PluginRequest:
    method: str
    path: str  # below the plugin's prefix, starting with "/"
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class PluginResponse:
    status: int = 200
    body: bytes | str = b""
    content_type: str = "application/json"


@dataclass(frozen=True)
class PluginRoute:
    method: str
    path: str  # "/hello": served at /plugins/NAME/hello
    handler: Callable[[PluginRequest], Awaitable[PluginResponse]]


def plugin_routes(
    plugins: dict[str, Plugin],
    extra: list[tuple[Plugin, list[PluginRoute]]] = (),  # type: ignore[assignment]
) -> list[tuple[str, PluginRoute]]:
    """``(full path, route)`` for every usable route of the ``route`` plugins, and of ``extra``
    (the webhooks of channel plugins, ``gateway.plugin_channels``). A route with a bad method or a
    path that could leave the prefix (``..``, converters, anything but plain segments), or the same
    method and path twice, is refused and logged."""
    out: list[tuple[str, PluginRoute]] = []
    seen: set[tuple[str, str]] = set()
    listed: list[tuple[Plugin, list[PluginRoute]]] = []
    for plugin in of_kind(plugins, "route"):
        try:
            listed.append((plugin, list(plugin.obj.routes())))
        except Exception:
            log.exception("plugin routes failed to load: plugin=%s", plugin.name)
    for plugin, routes in [*listed, *extra]:
        if not _ROUTE_NAME.match(plugin.name):
            log.warning("plugin routes refused: the name is not a plain path segment: name=%s", plugin.name)
            continue
        for route in routes:
            ok = isinstance(route, PluginRoute) and route.method in ROUTE_METHODS and _ROUTE_PATH.match(route.path)
            full = f"/plugins/{plugin.name}{route.path if ok else ''}"
            if not ok or ".." in route.path or (route.method, full) in seen:
                log.warning("plugin route refused: plugin=%s", plugin.name)
                continue
            seen.add((route.method, full))
            out.append((full, route))
    return out
