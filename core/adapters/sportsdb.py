"""TheSportsDB (https://www.thesportsdb.com, API v1, free tier), in one adapter: teams by name
and a team's next fixtures. The only module that knows its URLs and field names.

* ``searchteams.php?t=NAME`` answers ``{"teams": [{"idTeam", "strTeam", "strLeague", "strSport", ...}]}``
  (``"teams": null`` when none);
* ``eventsnext.php?id=ID`` answers ``{"events": [{"idEvent", "strEvent", "dateEvent", "strTime",
  "strTimestamp", "strVenue", "strStatus", "strPostponed", ...}]}`` (``null`` when none).

The free key is ``123`` (``PEPPER_SPORTSDB_KEY`` for a paid one). Requests go through the web
relay (:class:`core.web.egress.Egress`): public internet only.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from core.following.model import FollowFailed, SourceEvent
from core.web.egress import Egress, EgressError

BASE_URL = "https://www.thesportsdb.com"
FREE_KEY = "123"
MATCH_LENGTH = timedelta(hours=2)


@dataclass(frozen=True)
class Team:
    id: str
    name: str
    league: str


class SportsDB:
    def __init__(self, egress: Egress, *, base_url: str = BASE_URL, key: str = FREE_KEY):
        self.egress, self.base, self.key = egress, base_url.rstrip("/"), key

    async def _get(self, path: str, params: dict[str, str]) -> Any:
        try:
            response = await self.egress.fetch(f"{self.base}/api/v1/json/{self.key}/{path}", params=params,
                                               headers={"Accept": "application/json"})  # fmt: skip
        except EgressError as exc:
            raise FollowFailed(f"TheSportsDB: {exc.message}") from exc
        if response.status != 200:
            raise FollowFailed(f"TheSportsDB answered {response.status}")
        try:
            body = response.json()
        except ValueError as exc:
            raise FollowFailed("TheSportsDB did not answer JSON") from exc
        if not isinstance(body, dict):
            raise FollowFailed("TheSportsDB answered something unexpected")
        return body

    async def find_team(self, name: str) -> Team:
        body = await self._get("searchteams.php", {"t": name.strip()})
        teams = [t for t in body.get("teams") or () if isinstance(t, dict) and t.get("idTeam")]
        if not teams:
            raise FollowFailed(f"TheSportsDB knows no team called {name.strip()!r}")
        wanted = name.strip().casefold()
        team = next((t for t in teams if str(t.get("strTeam", "")).casefold() == wanted), teams[0])
        return Team(str(team["idTeam"]), str(team.get("strTeam") or name), str(team.get("strLeague") or ""))

    async def next_events(self, team_id: str) -> list[SourceEvent]:
        body = await self._get("eventsnext.php", {"id": team_id})
        out: list[SourceEvent] = []
        for item in body.get("events") or ():
            if not isinstance(item, dict) or not item.get("idEvent"):
                continue
            start, all_day = _start(item)
            if start is None:
                continue
            status = str(item.get("strStatus") or "").casefold()
            off = str(item.get("strPostponed") or "").casefold() == "yes" or any(
                word in status for word in ("cancel", "postponed", "abandoned")
            )
            out.append(SourceEvent(
                title=str(item.get("strEvent") or "Match")[:200], start=start,
                end=start + (timedelta(days=1) if all_day else MATCH_LENGTH), all_day=all_day,
                location=(str(item["strVenue"])[:200] if item.get("strVenue") else None),
                cancelled=off,
                key=f"sportsdb:{item['idEvent']}",
            ))  # fmt: skip
        return out


def _start(item: dict[str, Any]) -> tuple[datetime | None, bool]:
    """The kick-off (UTC, from ``strTimestamp``, else ``dateEvent`` + ``strTime``), or the day."""
    stamp = str(item.get("strTimestamp") or "").strip()
    if stamp:
        try:
            value = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
            return (value if value.tzinfo else value.replace(tzinfo=UTC)), False
        except ValueError:
            pass
    day = str(item.get("dateEvent") or "").strip()
    if not day:
        return None, False
    clock = str(item.get("strTime") or "").strip()
    try:
        if clock and clock != "00:00:00":
            return datetime.fromisoformat(f"{day}T{clock[:8]}").replace(tzinfo=UTC), False
        return datetime.fromisoformat(day).replace(tzinfo=UTC), True
    except ValueError:
        return None, False
