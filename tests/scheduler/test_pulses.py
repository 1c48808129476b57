"""What a scheduled run asks before it runs: the ``heartbeat_interval`` slot's veto (a loopback
plugin that skips pulses while the person is ``critical``), and the circuit breaker of a task whose
runs keep failing."""

from __future__ import annotations

from plugin_support import loopback, plugin
from test_runs import _outbound, _receipts, _task

from core.models.errors import ModelTransientError
from core.slots.settings import set_slot
from core.testing.scripted import reply
from core.usage.ledger import add_usage, set_limits

__all__ = ["loopback", "plugin"]


async def test_a_heartbeat_occupant_skips_a_due_pulse_but_never_a_reminder(
    db, scheduler, models, account, clock, plugin
) -> None:
    await set_slot(db, "heartbeat_interval", "loopback_heartbeat")
    await set_limits(db, account.id, tokens=100, cost=None, minutes=None)
    await add_usage(db, account.id, clock(), tokens=95)  # critical
    task = await _task(db, account, clock, title="Brief")
    reminder = await _task(
        db, account, clock, schedule="every day at 07:45", prompt="Take the bins out", kind="reminder"
    )
    clock.advance(hours=1)
    models.script(reply("Bins!"))
    await scheduler.run_due()
    [skipped] = await _receipts(db, task.id)
    assert (skipped["status"], skipped["reason"]) == ("missed", "skipped by the heartbeat_interval slot")
    assert [r["status"] for r in await _receipts(db, reminder.id)] == ["ran"]
    assert plugin.SEEN["loopback_heartbeat"].usage == "critical"


async def test_a_task_that_fails_three_times_in_an_hour_is_paused_and_the_owner_told(
    db, scheduler, models, account, clock
) -> None:
    task = await _task(db, account, clock, schedule="cron */10 * * * *", title="Watch")
    for _ in range(3):
        models.script(ModelTransientError("down", provider="scripted"))
        clock.advance(minutes=11)
        await scheduler.run_due()
    clock.advance(minutes=11)
    await scheduler.run_due()
    receipts = await _receipts(db, task.id)
    assert [r["status"] for r in receipts] == ["failed", "failed", "failed", "missed"]
    assert receipts[-1]["reason"] == "paused by the circuit breaker"
    told = [b for b in await _outbound(db) if "Pepper paused the task “Watch”" in b]
    assert len(told) == 1
