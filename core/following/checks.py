"""Checking followed sources, on the scheduler, with leases.

:class:`Following` is built once per process (from the settings: the web relay's egress rules,
the model service, the adapters). The scheduler calls :meth:`Following.tick` each pass; it claims
due follows with a lease (``core.following.store.claim_due``) and checks each:

* a page: conditional GET, text fingerprint, at most one extraction call (``core.following.pages``);
* a calendar feed: conditional GET; the calendar area reads its events when the agenda is listed;
* an RSS or Atom feed (a person, a topic): conditional GET; the feeds area reads its items;
* a team or a show: its adapter's upcoming events, matched by the source's own ids.

Every check is recorded (``follow_checks``) with what it found, failures included; a failing
source is checked again sooner, backing off up to its usual interval. One check does one fetch
and at most one model call, each with its own time limit, so the lease (longer than both
together) needs no heartbeat.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID
from zoneinfo import ZoneInfo

import feedparser
import icalendar

from core.adapters.sportsdb import SportsDB
from core.adapters.tvmaze import TVmaze
from core.errors import InvalidInput
from core.following import copies, pages, store
from core.following.model import FollowFailed
from core.following.store import Follow, Outcome
from core.models.types import ModelService
from core.store.pool import transaction
from core.store.queries import Queries
from core.web.egress import Egress, EgressError

log = logging.getLogger(__name__)

FEED_TYPES = ("application/rss+xml", "application/atom+xml")


@dataclass(frozen=True)
class FollowConfig:
    page_every: timedelta = timedelta(hours=6)
    feed_every: timedelta = timedelta(hours=6)
    structured_every: timedelta = timedelta(hours=12)
    retry_after: timedelta = timedelta(minutes=15)  # after a failure, doubling up to the usual interval
    lease: timedelta = timedelta(minutes=5)
    tier: str = "small"  # the extraction's model tier: a cheap one
    batch: int = 4


def _utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Following:
    db: Queries
    egress: Egress
    models: ModelService | None = None
    sportsdb: SportsDB | None = None
    tvmaze: TVmaze | None = None
    config: FollowConfig = field(default_factory=FollowConfig)
    owner: str = "following"
    clock: Callable[[], datetime] = _utc_now
    connectors: Any = None  # ``core.tools.connectors.Connectors``: reaching the person's calendars for copies

    def __post_init__(self) -> None:
        self.sportsdb = self.sportsdb or SportsDB(self.egress)
        self.tvmaze = self.tvmaze or TVmaze(self.egress)

    @classmethod
    def from_connectors(
        cls, db: Queries, connectors: Any, models: ModelService | None = None, config: FollowConfig | None = None
    ) -> Following:
        """Built from ``core.tools.connectors.Connectors`` (its egress policy and source addresses)."""
        egress = Egress(connectors.egress_policy)
        return cls(
            db, egress, models, SportsDB(egress, base_url=connectors.sportsdb_url, key=connectors.sportsdb_key),
            TVmaze(egress, base_url=connectors.tvmaze_url), config or FollowConfig(), connectors=connectors,
        )  # fmt: skip

    # --- adding ------------------------------------------------------------------------------

    async def resolve(self, spec: str) -> tuple[str, str, str]:
        """(kind, target, title) for what the person typed: a URL, ``team:NAME`` or ``show:NAME``."""
        text = spec.strip()
        head, sep, rest = text.partition(":")
        if sep and head.lower() in ("team", "show") and not rest.startswith("//"):
            name = " ".join(rest.split())
            if not name or len(name) > 100:
                raise InvalidInput(f"say which {head.lower()}: {head.lower()}:NAME")
            if head.lower() == "team":
                team = await self.sportsdb.find_team(name)  # type: ignore[union-attr]
                return "team", team.id, team.name + (f" ({team.league})" if team.league else "")
            show = await self.tvmaze.find_show(name)  # type: ignore[union-attr]
            return "show", show.id, show.name + (f" ({show.network})" if show.network else "")
        if not text.lower().startswith(("http://", "https://")) or len(text) > 2000:
            raise InvalidInput("follow a web address (http:// or https://), team:NAME or show:NAME")
        try:
            response = await self.egress.fetch(text, headers={"Accept": "text/html, text/calendar;q=0.9, */*;q=0.5"})
        except EgressError as exc:
            raise FollowFailed(exc.message) from exc
        if response.status != 200:
            raise FollowFailed(f"the page answered {response.status}")
        body = response.content.lstrip()[:4096]
        if response.content_type == "text/calendar" or body.upper().startswith(b"BEGIN:VCALENDAR"):
            name = _calendar_name(response.content) or response.url
            return "calendar", text, name
        if response.content_type in FEED_TYPES or b"<rss" in body[:500] or b"<feed" in body[:500]:
            parsed = feedparser.parse(response.content)
            if not parsed.get("version"):
                raise FollowFailed("the address looks like a feed but is not RSS or Atom")
            return "feed", text, str(parsed.feed.get("title") or text)[:200]
        if response.content_type not in pages.HTML_TYPES:
            raise FollowFailed(f"the address gives {response.content_type}, not a web page or a calendar")
        return "page", text, _page_title(response.text) or text

    async def add(
        self, account_id: UUID, spec: str, *, write_to_calendar: bool = False, calendar: str | None = None
    ) -> tuple[Follow, bool]:
        """``calendar``: the calendar its copies go to (opts in); refused before anything is fetched."""
        write_calendar_id = None
        if calendar is not None:
            write_calendar_id = (await copies.choose_calendar(self.db, account_id, calendar)).id
        kind, target, title = await self.resolve(spec)
        return await self.add_resolved(account_id, kind, target, title, write_to_calendar=write_to_calendar,
                                       write_calendar_id=write_calendar_id)  # fmt: skip

    async def add_resolved(
        self, account_id: UUID, kind: str, target: str, title: str, *, write_to_calendar: bool = False,
        write_calendar_id: UUID | None = None,
    ) -> tuple[Follow, bool]:  # fmt: skip
        found = await store.find(self.db, account_id, kind, target)
        if found is not None:
            return found, False
        calendar_id = feed_id = None
        if kind == "calendar":
            calendar_id = await store.add_calendar_feed(self.db, account_id, target, title)
        elif kind == "feed":
            feed_id = await store.add_news_feed(self.db, account_id, target, title)
        return await store.add(self.db, account_id, kind, target, title, write_to_calendar=write_to_calendar,
                               calendar_id=calendar_id, feed_id=feed_id,
                               write_calendar_id=write_calendar_id)  # fmt: skip

    # --- checking ----------------------------------------------------------------------------

    async def tick(self) -> int:
        """Claim what is due and check it; returns how many checks ran."""
        now = self.clock()
        claimed = await store.claim_due(self.db, self.owner, now, lease=self.config.lease, limit=self.config.batch)
        for follow in claimed:
            await self.check(follow)
        try:  # the copies of removed follows, deleted from their calendars
            _, error = await copies.sweep(self.db, self.connectors)
            if error:
                log.warning("copies of removed follows not deleted yet: %s", error)
        except Exception:
            log.exception("sweeping the copies of removed follows crashed")
        return len(claimed)

    async def run_due(self) -> int:
        total = 0
        while n := await self.tick():
            total += n
        return total

    async def check(self, follow: Follow) -> Outcome:
        """Check one claimed follow and record it; never raises for the source's failures."""
        try:
            if follow.kind == "page":
                outcome = await self._page(follow)
            elif follow.kind in ("calendar", "feed"):
                outcome = await self._feed(follow)
            else:
                outcome = await self._structured(follow)
        except (FollowFailed, InvalidInput) as exc:
            outcome = Outcome("failed", exc.message)
        except Exception as exc:  # a bug must not stop the other checks; it is recorded, not hidden
            log.exception("follow check crashed: follow=%s", follow.id)
            outcome = Outcome("failed", f"internal error ({type(exc).__name__})")
        await self._copy(follow, outcome)
        now = self.clock()
        wait = self._every(follow)
        if outcome.status == "failed":
            wait = min(wait, self.config.retry_after * (2 ** min(follow.failures, 10)))
        if outcome.calendar_error is not None:  # retried sooner too; a 304 costs the source little
            wait = min(wait, self.config.retry_after * (2 ** min(follow.copy_failures, 10)))
        if not await store.finish(self.db, follow, self.owner, now, outcome, now + wait):
            log.warning("follow check lost its lease: follow=%s", follow.id)
        return outcome

    async def _copy(self, follow: Follow, outcome: Outcome) -> None:
        """The copies in the person's calendar, after every check (a failed one too: what the last
        check could not write is retried); a failure is recorded with the check, never silent."""
        try:
            synced = await copies.sync(self.db, self.connectors, follow)
        except Exception as exc:
            log.exception("follow copies crashed: follow=%s", follow.id)
            outcome.calendar_error = f"internal error ({type(exc).__name__})"
            return
        if words := synced.words():
            outcome.detail = f"{outcome.detail}; {words}" if outcome.detail else words
        outcome.calendar_error = synced.error

    def _every(self, follow: Follow) -> timedelta:
        c = self.config
        return {"page": c.page_every, "calendar": c.feed_every, "feed": c.feed_every}.get(
            follow.kind, c.structured_every
        )

    async def _page(self, follow: Follow) -> Outcome:
        fetched = await pages.fetch_page(self.egress, follow.target, follow.etag, follow.modified)
        if fetched is None:
            return Outcome("unchanged", "the site says the page has not changed (304)")
        print_ = pages.fingerprint(fetched.text)
        if print_ == follow.fingerprint:
            return Outcome("fingerprint-equal", "the page's text is the same", etag=fetched.etag,
                           modified=fetched.modified)  # fmt: skip
        if self.models is None:
            raise FollowFailed("no model is configured to read the page")
        try:
            raw = await pages.extract(self.models, follow.target, fetched.text, tier=self.config.tier,
                                      key=f"follow:{follow.id}")  # fmt: skip
        except FollowFailed as exc:  # the call was made (and paid for): counted, and retried next time
            return Outcome("failed", exc.message, model_calls=1)
        tz = await self._zone(follow.account_id)
        events, dropped = pages.checked_events(raw, fetched.text, tz)
        async with transaction(self.db) as conn:
            applied = await store.apply_events(conn, follow, events)
        detail = f"extracted {len(events)} events; {applied.words()}"
        if dropped:
            detail += f"; dropped {len(dropped)}: " + "; ".join(dropped[:3])
        return Outcome("changed", detail, events=len(events), model_calls=1, etag=fetched.etag,
                       modified=fetched.modified, fingerprint=print_)  # fmt: skip

    async def _feed(self, follow: Follow) -> Outcome:
        """A calendar feed or a news feed: is it still there and what it holds; the calendar area
        (the agenda) and the feeds area (``read_feeds``) read their contents."""
        calendar = follow.kind == "calendar"
        headers = {"Accept": "text/calendar" if calendar else "application/rss+xml, application/atom+xml"}
        if follow.etag:
            headers["If-None-Match"] = follow.etag
        if follow.modified:
            headers["If-Modified-Since"] = follow.modified
        try:
            response = await self.egress.fetch(follow.target, headers=headers)
        except EgressError as exc:
            raise FollowFailed(exc.message) from exc
        if response.status == 304:
            return Outcome("unchanged", "the feed has not changed (304)")
        if response.status != 200:
            raise FollowFailed(f"the feed answered {response.status}")
        if calendar:
            try:
                count = len(icalendar.Calendar.from_ical(response.content).walk("VEVENT"))
            except ValueError as exc:
                raise FollowFailed("the feed is no longer an iCalendar calendar") from exc
            detail = f"the feed has {count} events (the agenda reads them)"
        else:
            parsed = feedparser.parse(response.content)
            if not parsed.get("version"):
                raise FollowFailed("the feed is no longer RSS or Atom")
            count = len(parsed.entries)
            detail = f"the feed has {count} items (read_feeds reads them)"
        return Outcome("changed", detail, events=count, etag=response.headers.get("ETag"),
                       modified=response.headers.get("Last-Modified"))  # fmt: skip

    async def _structured(self, follow: Follow) -> Outcome:
        now = self.clock()
        if follow.kind == "team":
            events = await self.sportsdb.next_events(follow.target)  # type: ignore[union-attr]
        else:
            name = follow.title.split(" (", 1)[0]
            events = await self.tvmaze.episodes(follow.target, name, since=now - timedelta(days=1))  # type: ignore[union-attr]
        async with transaction(self.db) as conn:
            applied = await store.apply_events(conn, follow, events)
        return Outcome("changed", f"{len(events)} upcoming; {applied.words()}", events=len(events))

    async def _zone(self, account_id: UUID) -> ZoneInfo:
        name = await self.db.fetchval("SELECT timezone FROM accounts WHERE id = $1", account_id)
        try:
            return ZoneInfo(name or "UTC")
        except (ValueError, KeyError):
            return ZoneInfo("UTC")


def _calendar_name(content: bytes) -> str | None:
    try:
        cal = icalendar.Calendar.from_ical(content)
    except ValueError as exc:
        raise FollowFailed("the address looks like a calendar but does not parse as iCalendar") from exc
    name: Any = cal.get("X-WR-CALNAME")
    return str(name)[:200] if name else None


def _page_title(page: str) -> str | None:
    match = re.search(r"<title[^>]*>(.*?)</title>", page[:20000], re.S | re.I)
    return " ".join(html.unescape(match[1]).split())[:200] if match and match[1].strip() else None
