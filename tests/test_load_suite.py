"""Load (issue 31, suite 6), CI-sized: ``core.testing.load_suite`` for 2 s at 60 deliveries a second
from 10 senders, each distinct message delivered 10 times (``scripts/suite-load`` runs 200/s for
60 s from 100 senders with 50 copies). The same checks from the outside: every delivery
acknowledged, every message answered once, one turn per burst and one reply per turn. Latency is
measured and printed, not asserted (speed goes in the script and docs/benchmarks.md)."""

from __future__ import annotations

from core.testing.load_suite import run

# One turn worker, at the web server's priority: on a busy CI machine an idle-class worker can
# wait tens of seconds for its first CPU (the scripts keep the defaults).
SMALL = {"PEPPER_TURN_WORKERS": "1", "PEPPER_TURN_WORKER_IDLE": "false", "PEPPER_TURN_WORKER_NICE": "0"}


async def test_duplicated_deliveries_from_many_senders_get_one_turn_per_burst_and_one_reply(subprocess_env):
    result = await run(seconds=2, rate=60, senders=10, duplicates=10, baseline_seconds=0.5, disposable=True,
                       base_env=subprocess_env, server_env=SMALL)  # fmt: skip
    print(result.summary())
    assert not result.failures, result.summary() + "\n" + "\n".join(result.failures)
    assert (result.lost, result.duplicates, result.refused) == (0, 0, 0), result.summary()
    assert (result.deliveries, result.distinct) == (120, 12), result.summary()
    assert result.turns == result.replies and result.bursts <= result.turns <= result.distinct, result.summary()
    assert result.acks and result.baseline, result.summary()
    assert result.cases >= 14, result.summary()
