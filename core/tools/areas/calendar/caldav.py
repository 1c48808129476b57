"""A small CalDAV client (RFC 4791) over httpx: one calendar collection, read with a time-range
``calendar-query``, written with conditional PUT and DELETE (ETags, so a concurrent change on
the server is never overwritten silently)."""

from __future__ import annotations

import logging
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx

from core.tools.areas.calendar.model import CalendarUnavailable
from core.tools.connectors import Connectors

log = logging.getLogger(__name__)

NS = {"d": "DAV:", "c": "urn:ietf:params:xml:ns:caldav"}


class CalDAVConflict(CalendarUnavailable):
    code = "caldav-conflict"
    retryable = True


@dataclass(frozen=True)
class Resource:
    href: str
    etag: str | None
    data: bytes


def _stamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")


class CalDAVClient:
    def __init__(self, connectors: Connectors, url: str, username: str | None, password: str | None):
        self.connectors = connectors
        parts = urlsplit(url.strip())
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            if parts.scheme.lower() in ("http", "https"):
                found = "names no server"
            else:
                found = f"starts with {parts.scheme}://" if parts.scheme else "has no scheme"
            raise CalendarUnavailable(
                f"a CalDAV URL starts with https:// (or http://) and names a server; this one {found}",
                code="caldav-bad-url",
                retryable=False,
            )
        self.url = url if url.endswith("/") else url + "/"
        self.auth = httpx.BasicAuth(username, password or "") if username else None

    async def _request(self, method: str, url: str, *, missing_ok: bool = False, **kw: Any) -> httpx.Response:
        try:
            async with self.connectors.http(auth=self.auth) as http:
                response = await http.request(method, url, **kw)
        except httpx.HTTPError as exc:
            raise CalendarUnavailable("the CalDAV server did not answer") from exc
        if missing_ok and response.status_code in (404, 410):
            return response
        if response.status_code == 412:
            raise CalDAVConflict("the event changed on the server meanwhile; list it again")
        if response.status_code in (401, 403):
            log.warning("caldav refused: method=%s status=%s", method, response.status_code)
            raise CalendarUnavailable(
                "the CalDAV server refused the user name or password (or this user may not use that calendar)",
                retryable=False,
            )
        if response.status_code >= 400:
            log.warning("caldav error: method=%s status=%s", method, response.status_code)
            raise CalendarUnavailable(
                f"the CalDAV server answered {response.status_code}", retryable=response.status_code >= 500
            )
        return response

    async def check(self) -> str:
        """The collection's display name; raises when the URL is not a calendar collection."""
        body = (
            '<?xml version="1.0"?><d:propfind xmlns:d="DAV:"><d:prop><d:resourcetype/><d:displayname/>'
            "</d:prop></d:propfind>"
        )
        response = await self._request("PROPFIND", self.url, content=body, headers={"Depth": "0"})
        root = ET.fromstring(response.content)
        if root.find(".//d:resourcetype/c:calendar", NS) is None:
            raise CalendarUnavailable("that address is not a CalDAV calendar", retryable=False)
        name = root.findtext(".//d:displayname", default="", namespaces=NS)
        return name or "CalDAV"

    async def query(self, start: datetime, end: datetime) -> list[Resource]:
        """Every event resource with an occurrence in [start, end) (the server filters)."""
        body = f"""<?xml version="1.0" encoding="utf-8"?>
<c:calendar-query xmlns:d="DAV:" xmlns:c="urn:ietf:params:xml:ns:caldav">
  <d:prop><d:getetag/><c:calendar-data/></d:prop>
  <c:filter><c:comp-filter name="VCALENDAR"><c:comp-filter name="VEVENT">
    <c:time-range start="{_stamp(start)}" end="{_stamp(end)}"/>
  </c:comp-filter></c:comp-filter></c:filter>
</c:calendar-query>"""
        return await self._report(body)

    async def by_uid(self, uid: str) -> Resource | None:
        escaped = uid.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        body = f"""<?xml version="1.0" encoding="utf-8"?>
<c:calendar-query xmlns:d="DAV:" xmlns:c="urn:ietf:params:xml:ns:caldav">
  <d:prop><d:getetag/><c:calendar-data/></d:prop>
  <c:filter><c:comp-filter name="VCALENDAR"><c:comp-filter name="VEVENT">
    <c:prop-filter name="UID"><c:text-match collation="i;octet">{escaped}</c:text-match></c:prop-filter>
  </c:comp-filter></c:comp-filter></c:filter>
</c:calendar-query>"""
        found = await self._report(body)
        return found[0] if found else None

    async def _report(self, body: str) -> list[Resource]:
        response = await self._request(
            "REPORT", self.url, content=body, headers={"Depth": "1", "Content-Type": "application/xml; charset=utf-8"}
        )
        root = ET.fromstring(response.content)
        out = []
        for item in root.findall("d:response", NS):
            data = item.findtext(".//c:calendar-data", default="", namespaces=NS)
            if not data.strip():
                continue
            etag = item.findtext(".//d:getetag", default=None, namespaces=NS)
            out.append(Resource(item.findtext("d:href", default="", namespaces=NS), etag, data.encode("utf-8")))
        return out

    def resource_url(self, href_or_uid: str, *, new: bool = False) -> str:
        if new:
            return urljoin(self.url, quote(href_or_uid, safe="") + ".ics")
        return urljoin(self.url, href_or_uid)

    async def put(self, url: str, data: bytes, *, etag: str | None = None, new: bool = False) -> None:
        headers = {"Content-Type": "text/calendar; charset=utf-8"}
        if new:
            headers["If-None-Match"] = "*"
        elif etag:
            headers["If-Match"] = etag
        await self._request("PUT", url, content=data, headers=headers)

    async def delete(self, url: str, *, etag: str | None = None, missing_ok: bool = False) -> None:
        """``missing_ok``: a resource already gone counts as deleted."""
        await self._request("DELETE", url, missing_ok=missing_ok, headers={"If-Match": etag} if etag else {})
