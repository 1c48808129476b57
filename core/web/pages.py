"""A fetched page reduced to its readable text (trafilatura), with its title and address."""

from __future__ import annotations

from dataclasses import dataclass

from core.web.egress import Egress, EgressError

PAGE_CHARS = 6000  # what the helper's model reads of one page
TEXT_TYPES = ("text/plain", "text/markdown", "application/json")


@dataclass(frozen=True)
class Page:
    url: str  # after redirects
    title: str
    text: str
    truncated: bool = False


def page_text(html: str, url: str, *, limit: int = PAGE_CHARS) -> Page:
    """The main text of ``html`` (navigation, ads and scripts left out) and its title."""
    # Imported here: it takes ~0.4 s, and only the research helper reads pages (every process
    # that has the web tool imports this module).
    import trafilatura

    text = trafilatura.extract(html, url=url, output_format="txt", include_comments=False, include_tables=True) or ""
    meta = trafilatura.extract_metadata(html, default_url=url)
    title = (meta.title if meta is not None and meta.title else "") or url
    return Page(url, title, text[:limit], truncated=len(text) > limit)


async def read_page(egress: Egress, url: str, *, limit: int = PAGE_CHARS) -> Page:
    """Fetch ``url`` through the relay and reduce it to text; raises ``EgressError`` when that fails."""
    response = await egress.fetch(url, headers={"Accept": "text/html,application/xhtml+xml,text/plain;q=0.8"})
    if response.status >= 400:
        raise EgressError(f"{response.url} answered HTTP {response.status}")
    kind = response.content_type
    if kind in TEXT_TYPES:
        text = response.text
        return Page(response.url, response.url, text[:limit], truncated=len(text) > limit)
    if kind and "html" not in kind and "xml" not in kind:
        raise EgressError(f"{response.url} is not a web page ({kind})")
    return page_text(response.text, response.url, limit=limit)
