"""TVmaze (https://www.tvmaze.com/api, no key), in one adapter: a show by name and its episodes.
The only module that knows its URLs and field names.

* ``/singlesearch/shows?q=NAME`` answers one show ``{"id", "name", "status", "network": {...}, ...}``
  (404 when nothing matches);
* ``/shows/ID/episodes`` answers ``[{"id", "name", "season", "number", "airdate", "airtime",
  "airstamp", "runtime", ...}]``.

Requests go through the web relay (:class:`core.web.egress.Egress`): public internet only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from core.following.model import FollowFailed, SourceEvent
from core.web.egress import Egress, EgressError

BASE_URL = "https://api.tvmaze.com"


@dataclass(frozen=True)
class Show:
    id: str
    name: str
    network: str


class TVmaze:
    def __init__(self, egress: Egress, *, base_url: str = BASE_URL):
        self.egress, self.base = egress, base_url.rstrip("/")

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        try:
            response = await self.egress.fetch(f"{self.base}{path}", params=params,
                                               headers={"Accept": "application/json"})  # fmt: skip
        except EgressError as exc:
            raise FollowFailed(f"TVmaze: {exc.message}") from exc
        if response.status == 404:
            return None
        if response.status != 200:
            raise FollowFailed(f"TVmaze answered {response.status}")
        try:
            return response.json()
        except ValueError as exc:
            raise FollowFailed("TVmaze did not answer JSON") from exc

    async def find_show(self, name: str) -> Show:
        body = await self._get("/singlesearch/shows", {"q": name.strip()})
        if not isinstance(body, dict) or not body.get("id"):
            raise FollowFailed(f"TVmaze knows no show called {name.strip()!r}")
        channel = body.get("network") or body.get("webChannel") or {}
        return Show(str(body["id"]), str(body.get("name") or name), str(channel.get("name") or ""))

    async def episodes(self, show_id: str, show_name: str, *, since: datetime) -> list[SourceEvent]:
        """Episodes airing from ``since`` on."""
        body = await self._get(f"/shows/{show_id}/episodes")
        if body is None:
            raise FollowFailed("TVmaze no longer knows that show")
        if not isinstance(body, list):
            raise FollowFailed("TVmaze answered something unexpected")
        out: list[SourceEvent] = []
        for item in body:
            if not isinstance(item, dict) or not item.get("id"):
                continue
            start, all_day = _start(item)
            if start is None or start < since:
                continue
            runtime = item.get("runtime") if isinstance(item.get("runtime"), int) else None
            end = start + (timedelta(days=1) if all_day else timedelta(minutes=runtime or 60))
            label = f"S{item.get('season')}E{item.get('number')}" if item.get("number") else "special"
            name = f" {item['name']}" if item.get("name") else ""
            out.append(SourceEvent(f"{show_name} {label}{name}"[:200], start, end, all_day,
                                   key=f"tvmaze:{item['id']}"))  # fmt: skip
        return out


def _start(item: dict[str, Any]) -> tuple[datetime | None, bool]:
    stamp = str(item.get("airstamp") or "").strip()
    if stamp and item.get("airtime"):
        try:
            value = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            return (value if value.tzinfo else value.replace(tzinfo=UTC)), False
        except ValueError:
            pass
    day = str(item.get("airdate") or "").strip()
    try:
        return (datetime.fromisoformat(day).replace(tzinfo=UTC), True) if day else (None, False)
    except ValueError:
        return None, False
