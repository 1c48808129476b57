"""Splitting a long reply into messages a phone shows well."""

from __future__ import annotations

import re

# Twilio accepts up to 1,600 characters per SMS/WhatsApp body and joins the carrier segments itself.
MESSAGE_LIMIT = 1600
# The delivery status of a part recorded before it goes out: the parts of one reply are all
# recorded first, so a receipt for part 1 cannot settle a turn whose later parts are unsent.
UNSENT = "sending"
_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")


def split_message(text: str, limit: int = MESSAGE_LIMIT) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters.

    Breaks at paragraph ends first, then sentence ends, then spaces; a single word longer than the
    limit (a URL) is cut. Each part is stripped; nothing but surrounding whitespace is lost.
    """
    text = text.strip()
    if len(text) <= limit:
        return [text] if text else []
    parts: list[str] = []
    current = ""
    for piece in _pieces(text, limit):
        joiner = "" if not current else piece[0]
        candidate = current + joiner + piece[1] if current else piece[1]
        if len(candidate) <= limit:
            current = candidate
        else:
            parts.append(current)
            current = piece[1]
    if current:
        parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _pieces(text: str, limit: int) -> list[tuple[str, str]]:
    """(separator to rejoin with, piece) pairs, each piece within the limit."""
    out: list[tuple[str, str]] = []
    for paragraph in re.split(r"\n\s*\n", text):
        sep = "\n\n"
        for sentence in _SENTENCE_END.split(paragraph.strip()):
            for chunk in _words(sentence, limit):
                out.append((sep, chunk))
                sep = " "
    return out


def _words(sentence: str, limit: int) -> list[str]:
    if len(sentence) <= limit:
        return [sentence]
    chunks: list[str] = []
    current = ""
    for word in sentence.split():
        while len(word) > limit:
            if current:
                chunks.append(current)
                current = ""
            chunks.append(word[:limit])
            word = word[limit:]
        candidate = f"{current} {word}" if current else word
        if len(candidate) <= limit:
            current = candidate
        else:
            chunks.append(current)
            current = word
    if current:
        chunks.append(current)
    return chunks
