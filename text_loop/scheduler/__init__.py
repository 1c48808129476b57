"""Scheduled runs: tasks on coarse schedules, claimed with leases, silent only on evidence.

The gateway builds one :class:`Scheduler` per process with a :class:`Deliverer` and starts it;
see ``docs/scheduler.md``.
"""

from text_loop.scheduler.delivery import Deliverer, DeliveryRequest, DeliveryResult, delivery_key
from text_loop.scheduler.service import Scheduler, SchedulerConfig
from text_loop.scheduler.silence import SILENT_MARK, Evidence, judge

__all__ = [
    "SILENT_MARK",
    "Deliverer",
    "DeliveryRequest",
    "DeliveryResult",
    "Evidence",
    "Scheduler",
    "SchedulerConfig",
    "delivery_key",
    "judge",
]
