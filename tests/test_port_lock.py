"""The media port is one Pepper's: a second server on it refuses to start, naming the data dir
that holds it; a crashed holder leaves no stale lock."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest
from cli_support import run_serve_expecting_failure, start_serve, stop, wait_healthy

from core.testing.processes import free_port
from gateway.port_lock import MediaPortBusy, PortLock


def test_a_second_hold_on_a_port_is_refused_and_names_the_holder(tmp_path):
    held = PortLock(8123, tmp_path / "first", folder=tmp_path)
    with pytest.raises(MediaPortBusy) as refused:
        PortLock(8123, tmp_path / "second", folder=tmp_path)
    assert refused.value.message.startswith(
        f"media port 8123 is already taken by the Pepper of data dir {tmp_path / 'first'}"
    )
    assert refused.value.message.endswith("stop it or set PEPPER_MEDIA_PORT to another")
    PortLock(8124, tmp_path / "second", folder=tmp_path).release()  # another port is free
    held.release()
    assert not (tmp_path / "media-port-8123.lock").exists()  # a clean stop leaves no file behind
    again = PortLock(8123, tmp_path / "second", folder=tmp_path)
    with pytest.raises(MediaPortBusy, match="data dir " + str(tmp_path / "second")):
        PortLock(8123, tmp_path / "third", folder=tmp_path)
    again.release()


def test_a_crashed_holder_leaves_no_stale_lock(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from gateway.port_lock import PortLock
        lock = PortLock(8125, Path("/crashed"), folder=Path({str(tmp_path)!r}))
        print("held", flush=True)
        sys.stdin.read()
    """)
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as holder:
        try:
            assert holder.stdout.readline().strip() == "held"
            with pytest.raises(MediaPortBusy, match="data dir /crashed"):
                PortLock(8125, tmp_path / "mine", folder=tmp_path)
            holder.send_signal(signal.SIGKILL)
            holder.wait(10)
        finally:
            if holder.poll() is None:
                holder.kill()
    assert (tmp_path / "media-port-8125.lock").exists()  # the file stays, the lock went with the process
    PortLock(8125, tmp_path / "mine", folder=tmp_path).release()


def test_a_second_server_on_the_same_media_port_refuses_to_start(subprocess_env, tmp_path):
    media_port, port = free_port(), free_port()
    first = start_serve(subprocess_env, tmp_path / "first", port, ("PEPPER_MEDIA_PORT", str(media_port)))
    try:
        wait_healthy(port, first)
        code, err = run_serve_expecting_failure(
            subprocess_env, tmp_path / "second", free_port(), ("PEPPER_MEDIA_PORT", str(media_port))
        )
        assert code == 1 and "Traceback" not in err
        assert err.strip().splitlines()[-1] == (
            f"pepper: error: media port {media_port} is already taken by the Pepper of data dir {tmp_path / 'first'}"
            f" (pid {first.pid}); stop it or set PEPPER_MEDIA_PORT to another"
        )
        assert first.poll() is None  # the first one keeps its calls
    finally:
        stop(first)
