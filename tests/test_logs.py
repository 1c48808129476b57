"""One log format for every process, at PEPPER_LOG_LEVEL, optionally JSON; loguru (pipecat)
routed into it; the Twilio SDK's request dumps and personal data kept out."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

from cli_support import start_serve, stop, wait_healthy

from core.testing.processes import free_port

TEXT_LINE = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \S+ \S+: "


def run_python(script: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True, text=True, timeout=60
    )


def test_loguru_goes_through_standard_logging_at_the_configured_level(subprocess_env):
    done = run_python(
        """
        import logging
        from gateway.logs import setup_logging
        setup_logging("INFO", process="media-0")
        from loguru import logger  # what pipecat logs with
        logger.debug("a pipecat debug line with a transcript")
        logger.info("pipecat pipeline started")
        logging.getLogger("somelib").warning("dialing +1 415 555 2671 for ada@example.org")
        logging.getLogger("gateway.x").info("pepper's own line")
        """,
        subprocess_env,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert "transcript" not in done.stderr  # DEBUG, below the level: dropped, not printed raw
    assert any(line.endswith(" INFO media-0 __main__: pipecat pipeline started") for line in lines), lines
    assert any(line.endswith(" WARNING media-0 somelib: dialing [number] for [email]") for line in lines), lines
    assert any(line.endswith(" INFO media-0 gateway.x: pepper's own line") for line in lines), lines
    assert len(lines) == 3
    import re

    assert all(re.match(TEXT_LINE, line) for line in lines), lines


def test_an_sms_sent_through_the_twilio_sdk_logs_nothing_of_it(subprocess_env):
    done = run_python(
        """
        import asyncio
        from core.settings import Settings
        from core.testing.twilio_peer import TwilioPeer
        from gateway.logs import setup_logging
        from core.adapters.twilio.rest import TwilioMessenger

        async def main():
            async with TwilioPeer(auth_token="tok") as twilio:
                settings = Settings(twilio_api_url=twilio.api_url, twilio_account_sid=twilio.account_sid,
                                    twilio_auth_token="tok")
                messenger = TwilioMessenger(settings)
                await messenger.send(to="+14155552671", from_="+14155550100", body="the door code is 4711",
                                     status_callback=None)
                await messenger.close()
                assert len(twilio.sent) == 1
        setup_logging("DEBUG", process="web")
        asyncio.run(main())
        """,
        subprocess_env,
    )
    assert done.returncode == 0, done.stderr
    assert "twilio" not in done.stderr.lower(), done.stderr
    assert "4155552671" not in done.stderr and "door code" not in done.stderr


def _serve_log(subprocess_env, tmp_path, *env: tuple[str, str], wait_for: tuple[str, ...] = ()) -> str:
    port = free_port()
    proc = start_serve(subprocess_env, tmp_path / "data", port, ("PEPPER_MEDIA_PROCESSES", "2"), *env)
    try:
        wait_healthy(port, proc)
        deadline = time.monotonic() + 60
        while wait_for and time.monotonic() < deadline:
            proc.log.seek(0)
            text = proc.log.read()
            if all(needle in text for needle in wait_for):
                break
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        log = stop(proc)
    return log


def test_every_process_writes_json_lines_when_asked(subprocess_env, tmp_path):
    log = _serve_log(
        subprocess_env, tmp_path, ("PEPPER_LOG_FORMAT", "json"),
        wait_for=('"process": "turns-0"', '"process": "turns-1"', '"process": "media-0"', '"process": "media-1"'),
    )  # fmt: skip
    records = [json.loads(line) for line in log.splitlines() if line.strip()]  # every line is one JSON object
    processes = {r["process"] for r in records}
    assert {"web", "turns-0", "turns-1", "media-0", "media-1"} <= processes, processes
    assert all(set(r) >= {"time", "level", "process", "logger", "message"} for r in records)
    assert any(r["process"] == "web" and r["message"].startswith("pepper is serving") for r in records)


def test_pepper_log_level_is_honoured_by_the_web_server_and_its_children(subprocess_env, tmp_path):
    log = _serve_log(subprocess_env, tmp_path, ("PEPPER_LOG_LEVEL", "WARNING"))
    assert " INFO " not in log and "pepper is serving" not in log, log
    # At INFO (the default) the same start is logged, in the one text format.
    log = _serve_log(subprocess_env, tmp_path, wait_for=(" media-0 ", " turns-0 "))
    import re

    lines = [line for line in log.splitlines() if line.strip()]
    assert all(re.match(TEXT_LINE, line) for line in lines), lines
    assert any(" INFO web gateway.server: pepper is serving" in line for line in lines)
