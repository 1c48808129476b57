"""The Twilio media socket under fuzzed frames: truncated, mistyped, random and binary frames
mid-call leave the call going (audio still reaches the model), are counted as malformed, raise
nothing, and the call still ends cleanly. Frames come from a fixed seed: the same each run."""

from __future__ import annotations

import base64
import json
import logging
import random

from voice.testing.twilio_caller import SILENCE_FRAME

SEED = 20261202
WRONG = [None, 7, -1.5, True, [], {}, "", "!!not base64!!", "A", "AAA", "\u0000", "\ud7ff" * 3, ["x"], {"a": 1}]


def _frames(stream_sid: str) -> tuple[list[str | bytes], int]:
    """Fuzzed frames, and how many of them are certainly malformed (the rest may be well-formed
    but pointless: a mark Pepper never sent)."""
    rng = random.Random(SEED)
    payload = base64.b64encode(SILENCE_FRAME).decode()
    media = {"track": "inbound", "chunk": "1", "timestamp": "20", "payload": payload}
    good = json.dumps({"event": "media", "streamSid": stream_sid, "media": media})
    malformed: list[str | bytes] = []
    malformed += [good[: rng.randrange(1, len(good) - 1)] for _ in range(40)]  # truncated
    for value in WRONG:
        malformed.append(json.dumps({"event": "media", "streamSid": stream_sid, "media": {"payload": value}}))
        malformed.append(json.dumps({"event": "media", "streamSid": stream_sid, "media": value}))
        if value not in ("",) and not isinstance(value, str):
            malformed.append(json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": value}}))
        if not (isinstance(value, str) and len(value) == 1 and value in "0123456789*#ABCD"):
            malformed.append(json.dumps({"event": "dtmf", "streamSid": stream_sid, "dtmf": {"digit": value}}))
        if value != "media":
            malformed.append(json.dumps({"event": value, "streamSid": stream_sid}))
    malformed += [json.dumps(v) for v in (None, 1, "media", [], [{"event": "media"}])]  # not an object
    malformed += ["".join(chr(rng.randrange(1, 0xD7FF)) for _ in range(rng.randrange(1, 400))) for _ in range(30)]
    malformed += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 600))) for _ in range(20)]  # binary
    harmless = [
        json.dumps({"event": "mark", "streamSid": stream_sid, "mark": {"name": f"never-sent-{i}"}}) for i in range(5)
    ]
    frames = malformed + harmless
    rng.shuffle(frames)
    return frames, len(malformed)


async def test_fuzzed_media_frames_leave_the_call_going_and_it_ends_cleanly(phone, caplog, record_property):
    caplog.set_level(logging.WARNING)
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        frames, malformed = _frames(call.stream_sid)
        record_property("media frames", len(frames))  # for scripts/suite-fuzz's summary line
        session = phone.model.sessions[0]
        for frame in frames:
            if isinstance(frame, bytes):
                await call.ws.send(frame)
            else:
                await call.send_raw(frame)
        before = len(session.audio_in)
        await call.wait(lambda: len(session.audio_in) > before + 1600, what="audio to keep flowing")
        assert not call.closed.is_set()
        stats = phone.calls.sessions[answer.call_sid].stats
        assert stats.frames_malformed >= malformed
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"
    assert json.loads(row["stats"])["frames_malformed"] >= malformed
    unhandled = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not unhandled, [r.getMessage() for r in unhandled[:5]]
