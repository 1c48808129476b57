"""What the person wrote in an email: HTML turned into text, quoted earlier replies left out.

HTML goes through inscriptis (layout-aware HTML to text). Quoted replies are best cut by the
provider (Mailgun's ``stripped-text``); when it did not, the common quote markers of Gmail,
Apple Mail, Thunderbird and Outlook are cut here. If cutting would leave nothing, the whole text
is kept: a message is never reduced to silence.
"""

from __future__ import annotations

import re

import lxml.html
from inscriptis import Inscriptis
from inscriptis.model.config import ParserConfig
from lxml.etree import ParserError

# Containers mail clients put the quoted earlier message in.
_QUOTE_XPATH = (
    "//blockquote[@type='cite']"  # Apple Mail, Thunderbird
    " | //*[contains(concat(' ', normalize-space(@class), ' '), ' gmail_quote ')]"  # Gmail
    " | //*[@id='appendonsend'] | //*[@id='divRplyFwdMsg']"  # Outlook
    " | //*[contains(concat(' ', normalize-space(@class), ' '), ' yahoo_quoted ')]"  # Yahoo
)
_ON_WROTE = re.compile(r"^\s*On\b.*\bwrote:\s*$", re.IGNORECASE)
_ON_START = re.compile(r"^\s*On\b.*\d", re.IGNORECASE)
_ORIGINAL = re.compile(r"^\s*-{2,}\s*(Original Message|Forwarded message)\s*-{2,}\s*$", re.IGNORECASE)
_OUTLOOK_FROM = re.compile(r"^\s*\**From:\**\s", re.IGNORECASE)
_OUTLOOK_NEXT = re.compile(r"^\s*\**(Sent|Date|To|Subject):\**\s", re.IGNORECASE)
_SIGNATURE = "-- "

_CONFIG = ParserConfig(display_links=False, display_images=False)


def html_to_text(html: str, *, drop_quotes: bool = True) -> str:
    """The readable text of an HTML mail part; quoted earlier messages removed when asked."""
    if not html.strip():
        return ""
    try:
        tree = lxml.html.fromstring(html)
    except (ParserError, ValueError):
        return ""
    if drop_quotes:
        for element in tree.xpath(_QUOTE_XPATH):
            parent = element.getparent()
            if parent is not None:
                parent.remove(element)
    text = Inscriptis(tree, _CONFIG).get_text()
    return _tidy(text)


def strip_quoted(text: str) -> str:
    """``text`` up to the first quote marker or signature, without ``>`` lines; never empty if ``text`` isn't."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    kept: list[str] = []
    for index, line in enumerate(lines):
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if _ON_WROTE.match(line) or (_ON_START.match(line) and following.rstrip().endswith("wrote:")):
            break
        if _ORIGINAL.match(line) or line == _SIGNATURE:
            break
        if _OUTLOOK_FROM.match(line) and _OUTLOOK_NEXT.match(following):
            break
        if line.lstrip().startswith(">"):
            continue
        kept.append(line)
    result = _tidy("\n".join(kept))
    return result or _tidy(text)


def _tidy(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    out = "\n".join(lines).strip()
    return re.sub(r"\n{3,}", "\n\n", out)
