"""The calls' replay recording (``voice/call_tape.py``) on its own: CPU per 20 ms frame of the
taping calls a streaming call makes, and of writing its chunks, beside the same calls untaped.

One call's steady state as ``bench/calls.py`` drives it, per 20 ms: a caller frame in (and on to
the model), a model delta in and relayed to the caller; every 5th frame an audio mark sent with
the audio and one echoed; a chunk taken, encoded and compressed as the engine's recorder writes it
every 5 s (250 frames). Runs are interleaved and the best of each kept (CPU time of this process),
so a busy machine slows both alike. ``--against REV`` also times ``voice/call_tape.py`` and the
chunk encoding as they were at git revision REV, in the same process.

    PYTHONPATH=. .venv/bin/python bench/call_tape.py [--frames 100000] [--rounds 5] [--against main]
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import json
import subprocess
import sys
import time
import types
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from core.adapters.twilio import media_streams as media
from voice.realtime import AudioDelta

SID = "MZ" + "0123456789abcdef" * 2
PAYLOAD = base64.b64encode(bytes(range(160))).decode()
CHUNK_FRAMES = 250  # 5 s


def _module_at(rev: str) -> types.ModuleType:
    source = subprocess.run(["git", "show", f"{rev}:voice/call_tape.py"], capture_output=True, text=True, check=True)
    spec = importlib.util.spec_from_loader(f"call_tape_{rev}", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source.stdout, f"{rev}:voice/call_tape.py", "exec"), module.__dict__)  # our own file, as it was
    return module


def _encode_json(entries: list[list[Any]]) -> bytes:
    return zlib.compress(json.dumps(entries, separators=(",", ":")).encode(), 1)


def _encode_orjson(entries: list[list[Any]]) -> bytes:
    return zlib.compress(orjson.dumps(entries, option=orjson.OPT_NON_STR_KEYS), 1)


def one_run(
    tape_module: types.ModuleType | None, encode: Callable[[list[list[Any]]], bytes], frames: int
) -> tuple[float, float, int]:
    """(us per frame in all, us per frame writing chunks, entries per chunk) for ``frames`` frames each way."""
    delta = AudioDelta("resp_1", "item_1", PAYLOAD)
    frame = media.media_frame(SID, PAYLOAD)
    tape = tape_module.CallTape({"stream_sid": SID}) if tape_module is not None else None
    writing = 0.0
    entries = 0
    chunks = 0
    start = time.process_time()
    for i in range(frames):
        if tape is None:
            continue
        tape.audio_in(PAYLOAD)
        tape.to_model()
        tape.model_audio(delta)
        tape.sent(frame)
        if i % 5 == 4:
            name = f"a{i}"
            tape.sent(media.mark_frame(SID, name))
            tape.frame_in("mark", {"event": "mark", "streamSid": SID, "mark": {"name": name}})
        if i % CHUNK_FRAMES == CHUNK_FRAMES - 1:
            at = time.process_time()
            _, taken = tape.take()
            encode(taken)
            writing += time.process_time() - at
            entries += len(taken)
            chunks += 1
    spent = time.process_time() - start
    per = 1e6 / (2 * frames)  # a frame each way per step
    return spent * per, writing * per, entries // max(1, chunks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", default=None, help="a git revision to time beside this tree")
    args = parser.parse_args()
    from voice import call_tape

    cases: list[tuple[str, types.ModuleType | None, Callable[[list[list[Any]]], bytes]]] = [
        ("untaped", None, _encode_orjson),
        ("this tree", call_tape, _encode_orjson),
    ]
    if args.against:
        cases.append((args.against, _module_at(args.against), _encode_json))
    best: dict[str, tuple[float, float, int]] = {}
    for _ in range(args.rounds):
        for name, module, encode in cases:
            got = one_run(module, encode, args.frames)
            if name not in best or got[0] < best[name][0]:
                best[name] = got
    for name, _, _ in cases:
        total, writing, entries = best[name]
        print(f"{name:>12}: {total:5.2f} us per frame, of which {writing:4.2f} us writing chunks"
              f" ({entries} entries per 5 s chunk)")  # fmt: skip
    sys.stdout.flush()


if __name__ == "__main__":
    main()
