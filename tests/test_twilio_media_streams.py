"""Twilio Media Streams frames (core/adapters/twilio/media_streams.py): built as strings, parsed with orjson."""

from __future__ import annotations

import base64
import json

import pytest

from core.adapters.twilio import media_streams as media


def test_payload_sizes_are_counted_without_decoding():
    for size in (1, 2, 3, 159, 160, 800):
        assert media.decoded_length(base64.b64encode(b"x" * size).decode()) == size


def test_frames_built_as_strings_are_the_json_twilio_reads_and_bad_frames_are_refused():
    sid = "MZ" + "0" * 32
    assert json.loads(media.mark_frame(sid, "a12")) == {"event": "mark", "streamSid": sid, "mark": {"name": "a12"}}
    assert json.loads(media.media_frame(sid, "//8=")) == {"event": "media", "streamSid": sid,
                                                           "media": {"payload": "//8="}}  # fmt: skip
    assert json.loads(media.clear_frame(sid)) == {"event": "clear", "streamSid": sid}
    assert media.parse(b'{"event":"stop","streamSid":"MZ1"}')["event"] == "stop"
    for bad in (b"\xff\xfe{}", "", "null", '{"event": 1}', b"[]"):
        with pytest.raises(media.MalformedFrame):
            media.parse(bad)
