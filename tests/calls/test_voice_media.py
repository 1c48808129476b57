"""The media socket: admission (signature over the public wss URL, one-time token bound to the call)
and the call itself end to end: notice first, audio passed through unchanged, marks, hang-up."""

from __future__ import annotations

import asyncio
import contextlib
import json

from phone_support import NOTICE, speech

from voice.testing.realtime_peer import speak


async def _refused(phone, answer, **kw) -> int | None:
    async with phone.caller.media(answer, **kw) as call:
        await call.wait(lambda: call.closed.is_set(), within=5, what="the socket to close")
        return call.close_code


async def test_an_unsigned_socket_is_closed_with_1008_and_only_a_security_event_is_kept(phone):
    answer = await phone.dial_owner()
    assert await _refused(phone, answer, signature="") == 1008
    events = [r["kind"] for r in await phone.db.fetch("SELECT kind FROM security_events")]
    assert events == ["media-signature-invalid"]
    assert phone.model.sessions == []  # nothing reached the model
    assert await phone.db.fetchval("SELECT count(*) FROM turns") == 0


async def test_a_socket_signed_over_the_loopback_url_is_refused(phone):
    answer = await phone.dial_owner()
    wrong = phone.caller.sign(phone.caller.local_ws_url(answer.stream_url), {})
    assert await _refused(phone, answer, signature=wrong) == 1008


async def test_a_reused_token_is_refused(phone):
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as first:
        await phone.until_listening(first)
        assert await _refused(phone, answer) == 1008
        await first.hang_up()
    kinds = [r["kind"] for r in await phone.db.fetch("SELECT kind FROM security_events")]
    assert kinds == ["media-token-reused"]


async def test_a_token_of_another_call_is_refused_and_burnt(phone):
    first = await phone.dial_owner()
    second = await phone.dial_owner()
    assert await _refused(phone, second, parameters=first.parameters) == 1008
    # The leaked token is burnt: its own call cannot use it either.
    assert await _refused(phone, first) == 1008
    kinds = [r["kind"] for r in await phone.db.fetch("SELECT kind FROM security_events ORDER BY id")]
    assert kinds == ["media-token-foreign", "media-token-reused"]


async def test_an_expired_token_is_refused(phone):
    answer = await phone.dial_owner()
    await phone.db.execute("UPDATE call_stream_tokens SET expires_at = now() - interval '1 second'")
    assert await _refused(phone, answer) == 1008
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "media-token-expired"


async def test_nothing_reaches_the_model_before_the_notice_has_played_then_audio_passes_through(phone):
    hello = speech("hello")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        call.say(hello)  # the caller talks straight away, over the notice
        await phone.until_listening(call)
        session = phone.model.sessions[0]
        notice_mark = next(m for m in call.marks if m.name.startswith("n"))
        assert session.first_audio_at >= notice_mark.at
        # The notice was the first thing asked of the model, and the caller heard all of it.
        assert NOTICE in session.response_creates[0]["instructions"]
        assert call.heard_ms >= 300
        stats = phone.calls.sessions[answer.call_sid].stats
        assert stats.frames_discarded > 0
        # From now on the caller's audio reaches the model byte for byte (no decoding, no resampling).
        await call.wait(lambda: not call.outgoing, what="the first speech to be sent")
        before = len(session.audio_in)
        call.say(hello)
        await call.wait(lambda: len(session.audio_in) >= before + len(hello) + 320, what="the speech to arrive")
        assert hello in bytes(session.audio_in)
        assert session.config["audio"]["input"]["format"] == {"type": "audio/pcmu"}
        assert session.config["audio"]["output"]["format"] == {"type": "audio/pcmu"}
        assert "openai-beta" not in session.headers
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"
    assert row["stats"] and json.loads(row["stats"])["frames_discarded"] > 0


async def test_model_audio_reaches_the_caller_unchanged_and_marks_track_playback(phone):
    reply = speech("todo")  # any real audio will do as the model's voice
    phone.model.script(speak("Here you go.", audio=reply))
    phone.model.hear("hello")
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        call.say(speech("hello"))
        await call.wait(lambda: len(call.heard) >= 2400 + len(reply), within=15, what="the reply to play")
        assert reply in bytes(call.heard)
        await call.wait(lambda: len([m for m in call.marks if m.name.startswith("a")]) >= 2, what="audio marks")
        await call.hang_up()
    await phone.call_row(answer.call_sid)
    messages = await phone.db.fetch("SELECT direction, body, channel FROM messages ORDER BY id")
    assert [(m["direction"], m["body"]) for m in messages] == [
        ("outbound", NOTICE),
        ("inbound", "hello"),
        ("outbound", "Here you go."),
    ] or [(m["direction"], m["body"]) for m in messages] == [
        ("outbound", NOTICE),
        ("outbound", "Here you go."),
        ("inbound", "hello"),
    ]
    assert {m["channel"] for m in messages} == {"voice"}


async def test_malformed_frames_are_ignored_and_counted(phone):
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        for bad in ("not json", "[1,2]", '{"event":"media"}', '{"event":"media","media":{"payload":7}}',
                    '{"event":"dtmf","dtmf":{"digit":"xx"}}', '{"event":"bogus"}'):  # fmt: skip
            await call.send_raw(bad)
        session = phone.model.sessions[0]
        before = len(session.audio_in)
        await call.wait(lambda: len(session.audio_in) > before + 1600, what="audio to keep flowing")
        stats = phone.calls.sessions[answer.call_sid].stats
        assert stats.frames_malformed == 6
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert json.loads(row["stats"])["frames_malformed"] == 6


async def test_the_status_callback_ends_a_call_whose_socket_stays_open(phone):
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        assert await phone.caller.status(answer.call_sid, "completed") == 204
        await call.wait(lambda: call.closed.is_set(), what="Pepper to close the socket")
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"


async def test_the_beta_interface_is_refused_by_the_peer_like_production(phone):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    url = phone.model.websocket_url + "/realtime?model=gpt-realtime"
    async with connect(url, additional_headers={"Authorization": "Bearer sk", "OpenAI-Beta": "realtime=v1"}) as ws:
        first = json.loads(await ws.recv())
        assert first["error"]["code"] == "beta_api_shape_disabled"
        try:
            await asyncio.wait_for(ws.recv(), 2)
        except ConnectionClosed:
            pass
        assert ws.close_code == 4000


async def test_a_socket_that_never_sends_start_is_refused(phone):
    import voice.service

    original = voice.service.START_TIMEOUT
    voice.service.START_TIMEOUT = 0.3
    try:
        answer = await phone.dial_owner()
        assert await _refused(phone, answer, send_start=False) == 1008
    finally:
        voice.service.START_TIMEOUT = original
    assert await phone.db.fetchval("SELECT kind FROM security_events") == "media-no-start"
    assert await phone.db.fetchval("SELECT used_at FROM call_stream_tokens") is None


def test_spoken_digits_are_withheld_before_verification():
    from voice.profile import withhold_digits

    assert withhold_digits("my pin is two four six eight") == "my pin is [digits withheld]"
    assert withhold_digits("it's 1 2 3 4, thanks") == "it's [digits withheld], thanks"
    assert withhold_digits("I have two questions") == "I have two questions"


async def test_more_calls_than_the_turn_limit_all_start_at_once(phone):
    # A call queued behind text turns would be silence on the line: calls are not behind that limit.
    count = phone.services.settings.max_concurrent_turns + 2
    phone.model.script(*[speak(NOTICE, ms=200) for _ in range(count)])
    answers = [await phone.dial_owner() for _ in range(count)]
    async with contextlib.AsyncExitStack() as stack:
        calls = [await stack.enter_async_context(phone.caller.media(a)) for a in answers]
        for call in calls:
            await call.wait(lambda c=call: any(m.name.startswith("n") for m in c.marks), within=20, what="a notice")
        for call in calls:
            await call.hang_up()
    assert len(phone.model.sessions) == count


async def test_the_media_listener_serves_only_the_media_path(phone):
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    base = phone.caller.media_local
    try:
        await connect(f"{base}/twilio/sms")
        raise AssertionError("a socket on another path was accepted")
    except InvalidStatus as exc:
        assert exc.response.status_code == 404


async def test_a_frame_over_the_size_limit_closes_the_socket_and_ends_the_call(phone):
    from gateway.media_server import MAX_FRAME_BYTES

    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        await phone.until_listening(call)
        await call.send_raw('{"event":"media","media":{"payload":"' + "A" * MAX_FRAME_BYTES + '"}}')
        await call.wait(lambda: call.closed.is_set(), within=5, what="the socket to close")
        assert call.close_code == 1009  # message too big
    row = await phone.call_row(answer.call_sid)
    assert row["end_reason"] == "hangup"


async def test_frames_sent_after_start_while_admission_runs_are_kept_in_order(phone):
    # Admission awaits the database; a caller keying digits at once must not lose or reorder them.
    answer = await phone.dial_owner()
    async with phone.caller.media(answer) as call:
        for digit in "2468#":
            await call.send_json({"event": "dtmf", "streamSid": call.stream_sid, "dtmf": {"digit": digit}})
        await phone.until_listening(call)
        await call.wait(lambda: phone.calls.sessions[answer.call_sid].trust == "owner_verified", within=10,
                        what="the keyed PIN to verify the caller")  # fmt: skip
        await call.hang_up()
    row = await phone.call_row(answer.call_sid)
    assert row["verified_by"] == "pin-keypad"


def test_frames_written_together_are_the_frames_websockets_would_write():
    from websockets.frames import Frame, Opcode

    from gateway.media_server import _server_frame

    for size in (0, 80, 125, 126, 300, 65535, 65536, 70_000):  # each length encoding, at its edges
        data = b"x" * size
        assert _server_frame(data) == Frame(Opcode.TEXT, data).serialize(mask=False, extensions=[])


async def test_an_owner_call_is_classified_once_and_its_opening_frames_parsed_once(phone, monkeypatch):
    """One classification at the webhook, one parse of each opening frame at the stream, and the
    owner's call never runs the answering service's code."""
    import sys
    from pathlib import Path

    import answering_service
    from core.adapters.twilio import media_streams as media
    from voice import routing

    classified: list[str] = []
    classify = routing.classify_call

    async def counting_classify(*args, **kwargs):
        route = await classify(*args, **kwargs)
        classified.append(route.route)
        return route

    opening: list[str] = []
    parse = media.parse

    def counting_parse(raw):
        frame = parse(raw)
        if frame.get("event") in ("connected", "start"):
            opening.append(frame["event"])
        return frame

    # The answering service's call path (its turn workers' delivery loop runs for every call).
    package = Path(answering_service.__file__).parent
    call_path = {str(package / "service.py"), str(package / "profile.py"), str(package / "session.py")}
    entered: set[str] = set()

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_filename in call_path and frame.f_code.co_name != "<module>":
            entered.add(frame.f_code.co_name)

    monkeypatch.setattr(routing, "classify_call", counting_classify)
    monkeypatch.setattr(media, "parse", counting_parse)
    sys.setprofile(watch)
    try:
        answer = await phone.dial_owner()
        async with phone.caller.media(answer) as call:
            await phone.model.wait_for(lambda: bool(phone.model.sessions))  # admitted: the model is connected
            sys.setprofile(None)
            await phone.until_listening(call)
            await call.hang_up()
    finally:
        sys.setprofile(None)
    assert classified == ["owner"]
    assert opening == ["connected", "start"]
    assert entered == set()
