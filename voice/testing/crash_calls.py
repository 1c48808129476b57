"""The calls case of the crash suite (``core.testing.crash``): a media process killed with
``SIGKILL`` in the middle of a call.

The call is connected (the notice played, the caller's audio reaches the loopback Realtime model),
then the media process holding it is killed. From the outside: the media socket drops; Twilio asks
the ``<Connect action>`` for what comes next and is told to say the apology (not a dead line); the
call's end is written once (``process-died``, its turn failed) and Twilio's final status callback
changes nothing of it; the server starts a new media process.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from voice.testing.realtime_peer import speak
from voice.testing.suite_calls import NOTICE, SuiteCalls
from voice.testing.twilio_caller import TwilioCaller, parse_twiml

APOLOGY = "Sorry, I lost the connection"  # voice.routing.APOLOGY_TEXT begins so


class CrashCalls(SuiteCalls):
    """``async with CrashCalls() as calls: await run(..., calls=calls)``."""

    async def run(self, crash: Any) -> list[tuple[bool, str]]:
        from core.testing import crash as suite  # the store's queries (SQL lives in core)

        checks: list[tuple[bool, str]] = []
        server, db = crash.server, crash.db
        caller = TwilioCaller(suite.TOKEN, local=server.url, public=suite.PUBLIC, account_sid=crash.twilio.account_sid,
                              media_local=server.media_url)  # fmt: skip
        self._model.script_session(speak(NOTICE, ms=300))
        answer = await caller.dial(from_=suite.OWNER, to=suite.LINE)
        checks.append((answer.connected, f"the call was connected ({answer.twiml[:120]})"))
        if not answer.connected:
            return checks
        sessions = len(self._model.sessions)
        async with caller.media(answer) as call:
            await self.connected(call, sessions, within=suite.WITHIN)
            holders = await suite.media_holders(db)
            row = await suite.call_row(db, answer.call_sid)
            victim = holders.get(row["held_by"]) if row is not None else None
            checks.append((victim is not None, "the call is held by a media process"))
            if victim is None:
                return checks
            os.kill(victim, signal.SIGKILL)
            await call.wait(lambda: call.closed.is_set(), within=suite.WITHIN, what="the media socket to drop")
        # The socket dropped: Twilio asks the <Connect action> what the caller hears next.
        assert answer.action is not None and answer.action.startswith(suite.PUBLIC)
        status, twiml = await caller.post(answer.action.removeprefix(suite.PUBLIC), {"CallSid": answer.call_sid})
        says = parse_twiml(twiml)["says"] if status == 200 else []
        checks.append((any(s.startswith(APOLOGY) for s in says), f"the caller heard an apology ({status}: {says})"))

        async def ended() -> Any:
            found = await suite.call_row(db, answer.call_sid)
            return found if found is not None and found["summary"] is not None else None

        end = await suite.until_or_false(ended, suite.WITHIN)
        checks.append((bool(end) and end["end_reason"] == "process-died" and end["turn_status"] == "failed",
                       f"the call's end was written for the dead process ({end and dict(end)})"))  # fmt: skip
        # Twilio's final status callback, after the apology played: the end stays as written.
        checks.append((await caller.status(answer.call_sid, "completed") == 204, "the final status was taken"))
        after = await suite.call_row(db, answer.call_sid)
        checks.append((bool(end) and after is not None and (after["end_reason"], after["ended_at"], after["summary"])
                       == (end["end_reason"], end["ended_at"], end["summary"]),
                       f"the call's end was written once ({after and dict(after)})"))  # fmt: skip

        async def replaced() -> bool:
            now = await suite.media_holders(db)
            return len(now) == suite.MEDIA_PROCESSES and victim not in now.values()

        checks.append((bool(await suite.until_or_false(replaced, suite.WITHIN)), "a new media process started"))
        return checks
