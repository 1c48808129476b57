"""Loopback peers for the structured sources Pepper follows, answering in the real APIs' shapes.

* :class:`SportsDBPeer`: TheSportsDB API v1. ``GET /api/v1/json/{key}/searchteams.php?t=NAME``
  answers ``{"teams": [...]}`` (``{"teams": null}`` when nothing matches);
  ``GET /api/v1/json/{key}/eventsnext.php?id=ID`` answers ``{"events": [...]}`` (``null`` when
  none). Field names as the service returns them (``idTeam``, ``strTeam``, ``idEvent``,
  ``strEvent``, ``dateEvent``, ``strTime``, ``strTimestamp``, ``strVenue``, ``strStatus``,
  ``strPostponed``...); every value is a string or null, as there.
* :class:`TVmazePeer`: TVmaze. ``GET /singlesearch/shows?q=NAME`` answers one show object (404
  when nothing matches); ``GET /shows/{id}/episodes`` answers the list of episodes (``id``,
  ``name``, ``season``, ``number``, ``airdate``, ``airtime``, ``airstamp``, ``runtime``...).

``peer.requests`` records (path, query) of every request.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from core.testing.loopback import HttpPeer


def sportsdb_team(id_team: str, name: str, league: str = "English Premier League") -> dict[str, Any]:
    return {
        "idTeam": id_team, "idESPN": None, "idAPIfootball": "42", "intLoved": "3", "strTeam": name,
        "strTeamAlternate": "", "strTeamShort": name[:3].upper(), "intFormedYear": "1886", "strSport": "Soccer",
        "strLeague": league, "idLeague": "4328", "strLeague2": "FA Cup", "idLeague2": "4482", "strDivision": None,
        "idVenue": "15528", "strStadium": "Emirates Stadium", "strKeywords": "Gunners", "strRSS": "",
        "strLocation": "Holloway, London, England", "intStadiumCapacity": "60338", "strWebsite": "www.arsenal.com",
        "strFacebook": "", "strTwitter": "", "strInstagram": "", "strDescriptionEN": "A football club.",
        "strColour1": "#EF0107", "strColour2": "#023474", "strColour3": "", "strGender": "Male",
        "strCountry": "England", "strBadge": "https://r2.thesportsdb.com/images/media/team/badge/uyhbfe1612467038.png",
        "strLogo": None, "strFanart1": None, "strBanner": None, "strEquipment": None, "strYoutube": "",
        "strLocked": "unlocked",
    }  # fmt: skip


def sportsdb_event(id_event: str, home: str, away: str, day: str, clock: str, **extra: Any) -> dict[str, Any]:
    return {
        "idEvent": id_event, "idAPIfootball": "1208321", "strEvent": f"{home} vs {away}",
        "strEventAlternate": f"{away} @ {home}", "strFilename": f"English Premier League {day} {home} vs {away}",
        "strSport": "Soccer", "idLeague": "4328", "strLeague": "English Premier League",
        "strLeagueBadge": "https://r2.thesportsdb.com/images/media/league/badge/gasy9d1737743125.png",
        "strSeason": "2024-2025", "strDescriptionEN": "", "strHomeTeam": home, "strAwayTeam": away,
        "intHomeScore": None, "intRound": "31", "intAwayScore": None, "intSpectators": None, "strOfficial": "",
        "strTimestamp": f"{day}T{clock}", "dateEvent": day, "dateEventLocal": day, "strTime": clock,
        "strTimeLocal": clock, "strGroup": "", "idHomeTeam": "133604", "strHomeTeamBadge": "",
        "idAwayTeam": "133610", "strAwayTeamBadge": "", "intScore": None, "intScoreVotes": None, "strResult": "",
        "idVenue": "15528", "strVenue": "Emirates Stadium", "strCountry": "England", "strCity": "", "strPoster": "",
        "strSquare": "", "strFanart": None, "strThumb": "", "strBanner": "", "strMap": None,
        "strTweet1": "", "strVideo": "", "strStatus": "Not Started", "strPostponed": "no", "strLocked": "unlocked",
        **extra,
    }  # fmt: skip


class SportsDBPeer(HttpPeer):
    def __init__(self) -> None:
        self.teams: list[dict[str, Any]] = []
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/api/v1/json/{key}/searchteams.php", self._search),
            web.get("/api/v1/json/{key}/eventsnext.php", self._next),
        ]

    async def _search(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query)))
        wanted = request.query.get("t", "").casefold()
        found = [t for t in self.teams if wanted and wanted in t["strTeam"].casefold()]
        return web.json_response({"teams": found or None})

    async def _next(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query)))
        return web.json_response({"events": self.events.get(request.query.get("id", "")) or None})


def tvmaze_show(show_id: int, name: str) -> dict[str, Any]:
    return {
        "id": show_id, "url": f"https://www.tvmaze.com/shows/{show_id}/x", "name": name, "type": "Scripted",
        "language": "English", "genres": ["Drama"], "status": "Running", "runtime": 60, "averageRuntime": 60,
        "premiered": "2022-08-21", "ended": None, "officialSite": None,
        "schedule": {"time": "21:00", "days": ["Sunday"]}, "rating": {"average": 8.1}, "weight": 99,
        "network": {"id": 8, "name": "HBO", "country": {"name": "United States", "code": "US",
                    "timezone": "America/New_York"}, "officialSite": "https://www.hbo.com/"},
        "webChannel": None, "dvdCountry": None, "externals": {"tvrage": None, "thetvdb": 371572, "imdb": "tt11198330"},
        "image": None, "summary": "<p>A show.</p>", "updated": 1735000000,
        "_links": {"self": {"href": f"https://api.tvmaze.com/shows/{show_id}"}},
    }  # fmt: skip


def tvmaze_episode(ep_id: int, season: int, number: int, name: str, airstamp: str, **extra: Any) -> dict[str, Any]:
    day, clock = airstamp[:10], airstamp[11:16]
    return {
        "id": ep_id, "url": f"https://www.tvmaze.com/episodes/{ep_id}/x", "name": name, "season": season,
        "number": number, "type": "regular", "airdate": day, "airtime": clock, "airstamp": airstamp,
        "runtime": 60, "rating": {"average": None}, "image": None, "summary": None,
        "_links": {"self": {"href": f"https://api.tvmaze.com/episodes/{ep_id}"}},
        **extra,
    }  # fmt: skip


class TVmazePeer(HttpPeer):
    def __init__(self) -> None:
        self.shows: list[dict[str, Any]] = []
        self.episodes: dict[int, list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, dict[str, str]]] = []

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/singlesearch/shows", self._single), web.get("/shows/{id}/episodes", self._episodes)]

    async def _single(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query)))
        wanted = request.query.get("q", "").casefold()
        found = next((s for s in self.shows if wanted and wanted in s["name"].casefold()), None)
        if found is None:
            return web.json_response({"name": "Not Found", "message": "", "code": 0, "status": 404}, status=404)
        return web.json_response(found)

    async def _episodes(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.query)))
        show = int(request.match_info["id"]) if request.match_info["id"].isdigit() else -1
        if show not in self.episodes:
            return web.json_response({"name": "Not Found", "message": "", "code": 0, "status": 404}, status=404)
        return web.json_response(self.episodes[show])
