"""The turn loop for text: rounds, budget, repeat suppression, staged writes, recovery, repair, replay.

The gateway calls :func:`run_turn` and then :func:`deliver`; ``pepper replay`` calls
:func:`replay_turn`.
"""

from text_loop.config import HarnessConfig
from text_loop.turn import HarnessDeps, TurnOutcome, deliver, run_turn

__all__ = ["HarnessConfig", "HarnessDeps", "TurnOutcome", "deliver", "run_turn"]
