"""The OpenAI Realtime adapter's per-frame shortcuts, over the real SDK against a loopback socket:
audio appends written straight to the transport, and model audio handed over as it is parsed
while the reader waits, with every other event (and any audio behind one) kept in order."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from websockets.asyncio.server import ServerConnection, serve

from voice.adapters.openai_realtime import OpenAIRealtime, RealtimeSocket
from voice.realtime import AudioDelta, ResponseDone


def _delta(n: int) -> str:
    audio = base64.b64encode(bytes([n]) * 160).decode()
    return json.dumps({"event_id": f"event_{n:022d}", "type": "response.output_audio.delta", "response_id": "r1",
                       "item_id": "i1", "output_index": 0, "content_index": 0, "delta": audio})  # fmt: skip


async def test_model_audio_skips_the_read_loop_only_while_it_waits_with_nothing_queued():
    outgoing: asyncio.Queue[list[str] | None] = asyncio.Queue()
    appends: list[str] = []

    async def model(ws: ServerConnection) -> None:
        async def read() -> None:
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "input_audio_buffer.append":
                    appends.append(event["audio"])

        reader = asyncio.create_task(read())
        while (batch := await outgoing.get()) is not None:
            # One TCP write per batch: websockets parses the batch's messages in one read.
            ws.protocol.send_text(batch[0].encode())
            for message in batch[1:]:
                ws.protocol.send_text(message.encode())
            ws.send_data()
        reader.cancel()

    log: list[tuple[str, Any]] = []
    busy = asyncio.Event()

    def sink(event: AudioDelta) -> bool:
        log.append(("sink", base64.b64decode(event.payload)[0]))
        return True

    async with serve(model, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        realtime = OpenAIRealtime(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{port}")
        async with realtime.connect() as conn:
            # Guards against an SDK or websockets upgrade silently turning the shortcuts off.
            assert isinstance(conn._socket, RealtimeSocket) and conn._direct is not None
            conn.deliver_audio_to(sink)

            async def read_loop() -> None:
                async for event in conn.events():
                    log.append(("loop", _seen(event)))
                    if isinstance(event, ResponseDone):
                        busy.set()
                        await asyncio.sleep(0.3)  # the loop is busy with an event (a tool, a barge-in)
                        busy.clear()

            reader = asyncio.create_task(read_loop())
            await asyncio.sleep(0.1)
            for n in range(3):
                assert conn.append_audio_nowait(base64.b64encode(bytes([n]) * 160).decode())
            await outgoing.put([_delta(1)])  # the loop waits: straight to the sink
            await _until(lambda: len(log) == 1)
            done = json.dumps({"type": "response.done", "response": {"id": "r1", "status": "completed", "output": []}})
            await outgoing.put([done, _delta(2)])  # 2 is queued behind an event: through the loop
            await busy.wait()
            await outgoing.put([_delta(3)])  # the loop is busy: through the loop, after 2
            await _until(lambda: len(log) == 4)
            await _until(lambda: not busy.is_set())
            await asyncio.sleep(0.05)
            await outgoing.put([_delta(4)])  # waiting again with nothing queued: the sink
            await _until(lambda: len(log) == 5)
            reader.cancel()
            await outgoing.put(None)
        await realtime.aclose()
    assert log == [("sink", 1), ("loop", "ResponseDone"), ("loop", 2), ("loop", 3), ("sink", 4)]
    assert [base64.b64decode(a) for a in appends] == [bytes([n]) * 160 for n in range(3)]


def _seen(event: Any) -> Any:
    """A delta as the byte its audio repeats; any other event as its class name."""
    return base64.b64decode(event.payload)[0] if isinstance(event, AudioDelta) else type(event).__name__


async def _until(predicate: Any, within: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_frames_cut_anywhere_by_the_network_reach_the_call_once_and_in_order():
    """The adapter frames the model's bytes itself while websockets' parser waits between frames.
    Here the peer writes its frames as raw bytes cut at awkward places (inside a header, inside a
    payload, at boundaries), with a small event, a ping and a 64 KiB event among the audio: every
    delta arrives once and in order, the ping is answered, the events keep their place, and the
    whole deltas that start a read never reach websockets' parser."""
    from websockets.frames import Frame, Opcode

    def raw(text: str) -> bytes:
        return Frame(Opcode.TEXT, text.encode()).serialize(mask=False, extensions=[])

    created = json.dumps({"type": "response.created", "response": {"id": "r1"}})  # under 126 bytes
    big = json.dumps({"type": "response.output_audio_transcript.done", "response_id": "r1", "item_id": "i1",
                      "transcript": "x" * 70_000})  # a 64-bit length: websockets' own path  # fmt: skip
    frames = [raw(created), *(raw(_delta(n)) for n in (1, 2, 3)), raw(big), *(raw(_delta(n)) for n in (4, 5, 6))]
    stream = b"".join(frames)
    ends = [sum(len(f) for f in frames[: i + 1]) for i in range(len(frames))]
    # Inside a header; the rest of it; two whole deltas and 2 bytes of the next; the rest of that
    # one (then the ping); into the large event; its rest; two whole deltas and most of a third; the end.
    cuts = [3, ends[0], ends[2] + 2, ends[3], ends[3] + 200, ends[4], ends[7] - 5, ends[7]]
    pong = asyncio.Event()

    async def model(ws: ServerConnection) -> None:
        at = 0
        for n, cut in enumerate(cuts):
            ws.transport.write(stream[at:cut])
            at = cut
            await asyncio.sleep(0.05)
            if n == 3:
                waiter = await ws.ping()  # a control frame between data frames
        await waiter
        pong.set()
        await ws.wait_closed()

    log: list[Any] = []
    parsed: list[bytes] = []  # data frames websockets' own parser produced

    def sink(event: AudioDelta) -> bool:
        log.append(("sink", base64.b64decode(event.payload)[0]))
        return True

    async with serve(model, "127.0.0.1", 0, compression=None, max_size=None) as server:
        port = server.sockets[0].getsockname()[1]
        realtime = OpenAIRealtime(
            api_key="sk-test",
            websocket_base_url=f"ws://127.0.0.1:{port}",
        )
        async with realtime.connect() as conn:
            sock = conn._socket
            assert sock is not None
            sock.protocol.max_message_size = None  # the 70 kB event
            process_event = sock.process_event

            def spy(event: Any) -> None:
                if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                    parsed.append(event.data)
                process_event(event)

            sock.process_event = spy  # type: ignore[method-assign]
            conn.deliver_audio_to(sink)

            async def read_loop() -> None:
                async for event in conn.events():
                    log.append(("loop", _seen(event)))

            reader = asyncio.create_task(read_loop())
            await _until(lambda: len(log) == 8)
            await asyncio.wait_for(pong.wait(), 5)
            reader.cancel()
        await realtime.aclose()
    assert [entry[1] for entry in log] == ["ResponseCreated", 1, 2, 3, "AssistantTranscript", 4, 5, 6]
    seen_by_websockets = [json.loads(data) for data in parsed]
    assert [e["type"] for e in seen_by_websockets] == [
        "response.created", "response.output_audio.delta", "response.output_audio_transcript.done",
        "response.output_audio.delta",
    ]  # fmt: skip
    assert [base64.b64decode(e["delta"])[0] for e in seen_by_websockets if "delta" in e] == [3, 6]


async def test_a_garbled_frame_that_looks_like_audio_is_dropped_and_the_call_goes_on():
    """Bad input on the adapter's own framing: a frame naming an audio delta that is not JSON
    (and one that is not UTF-8) is declined by the shortcut, ignored by the read loop as before,
    and the deltas around it still arrive in order on an open socket."""
    from websockets.frames import Frame, Opcode

    def raw(data: bytes) -> bytes:
        return Frame(Opcode.TEXT, data).serialize(mask=False, extensions=[])

    garbled = b'{"type":"response.output_audio.delta","delta":"' + b"A" * 200  # cut short: not JSON
    not_utf8 = b'{"type":"response.output_audio.delta","delta":"\xff\xfe' + b"A" * 200 + b'"}'
    stream = raw(_delta(1).encode()) + raw(garbled) + raw(_delta(2).encode())

    async def model(ws: ServerConnection) -> None:
        await asyncio.sleep(0.1)
        ws.transport.write(stream)
        await asyncio.sleep(0.1)
        ws.transport.write(raw(not_utf8))
        await asyncio.sleep(0.1)
        ws.transport.write(raw(_delta(3).encode()))
        await ws.wait_closed()

    log: list[Any] = []

    def sink(event: AudioDelta) -> bool:
        log.append(_seen(event))
        return True

    async with serve(model, "127.0.0.1", 0, compression=None) as server:
        port = server.sockets[0].getsockname()[1]
        realtime = OpenAIRealtime(api_key="sk-test", websocket_base_url=f"ws://127.0.0.1:{port}")
        async with realtime.connect() as conn:
            conn.deliver_audio_to(sink)

            async def read_loop() -> None:
                async for event in conn.events():
                    log.append(_seen(event))

            reader = asyncio.create_task(read_loop())
            await _until(lambda: 3 in log)
            assert not reader.done()
            reader.cancel()
        await realtime.aclose()
    assert log == [1, 2, 3]
