"""An arithmetic environment whose episodes from the Nth reset on never finish on their own:
a phase of a run that can only end by being stopped (`tests/integration/test_interrupt.py`).

`GATE_FROM` (environment variable ``TRACERL_TEST_GATE_FROM``): the first reset of this
process that blocks (1 is the run's rehearsal, before the model loads). Each blocked reset
appends a line to ``TRACERL_TEST_GATE_FILE``, so a test knows the phase is under way. With
``TRACERL_TEST_GATE_BLOCKING=1`` it blocks the event loop itself (`time.sleep`): a run stuck
where no safe point comes, which only a second Ctrl-C ends."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from tracerl.envs.arithmetic import Arithmetic


class Gated(Arithmetic):
    resets = 0

    async def setup(self, task: dict[str, Any], seed: int) -> list[Any]:
        type(self).resets += 1
        gate = int(os.environ.get("TRACERL_TEST_GATE_FROM", "0") or 0)
        if gate and type(self).resets >= gate:
            with open(os.environ["TRACERL_TEST_GATE_FILE"], "a") as f:
                f.write(f"{type(self).resets}\n")
            if os.environ.get("TRACERL_TEST_GATE_BLOCKING"):
                time.sleep(3600)
            await asyncio.sleep(3600)  # until the run cancels it
        return await super().setup(task, seed)
