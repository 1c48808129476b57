"""Pepper's replies as safe HTML for the web pages: Markdown rendered, then sanitised.

Python-Markdown passes raw HTML through, so its output goes through nh3 (the ammonia sanitiser):
only the tags of ordinary formatting survive, links keep only http(s) and mailto targets, and
anything the model wrote as HTML reaches the page as text or not at all.
"""

from __future__ import annotations

import markdown as _markdown
import nh3

TAGS = {
    "p", "br", "strong", "em", "b", "i", "code", "pre", "blockquote", "ul", "ol", "li", "a", "h1", "h2", "h3",
    "h4", "hr", "table", "thead", "tbody", "tr", "th", "td", "del",
}  # fmt: skip
ATTRIBUTES = {"a": {"href", "title"}}
SCHEMES = {"http", "https", "mailto"}


def to_html(text: str) -> str:
    """``text`` (Markdown) as HTML that is safe to put in a page as is."""
    rendered = _markdown.markdown(text, extensions=["fenced_code", "tables", "sane_lists"], output_format="html")
    return nh3.clean(
        rendered, tags=TAGS, attributes=ATTRIBUTES, url_schemes=SCHEMES, link_rel="noopener noreferrer nofollow"
    )
