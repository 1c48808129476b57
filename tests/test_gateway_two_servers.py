"""Past one machine (issue 31, suite 5), at a smaller load than ``scripts/suite-two-servers``: two
``pepper serve`` processes with their own data dirs on one external Postgres, started at the same
moment on an empty database, behind Caddy's round robin; 200 texts from 20 senders through Caddy,
two calls through Caddy and two each with its webhook on one server and its media socket on the
other; one server killed with SIGKILL (it and its children) half-way. The checks are
``core.testing.two_servers``'s, from the outside: migrations applied once, every acknowledged text
answered exactly once, the tasks due meanwhile run once, the calls connect and the survivor's
goes on after the kill."""

from __future__ import annotations

import shutil

import pytest

from core.testing.two_servers import run
from voice.testing.two_server_calls import TwoServerCalls

pytestmark = pytest.mark.skipif(shutil.which("caddy") is None, reason="caddy is not installed (scripts/test)")


async def test_two_servers_behind_caddy_answer_every_text_once_when_one_is_killed(subprocess_env):
    async with TwoServerCalls(per_direction=1) as calls:
        result = await run(messages=200, senders=20, base_env=subprocess_env, side=calls)
    assert not result.failures, result.summary() + "\n" + "\n".join(result.failures)
    assert (result.lost, result.duplicates) == (0, 0), result.summary()
    assert result.acknowledged == 200
    # Every check ran: migrations, texts, replies, each task, the kill, each call and its survival.
    assert result.cases >= 20, result.summary()
