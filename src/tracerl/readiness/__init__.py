"""`tracerl readiness`: should this task get RL at all? Four measured answers.

    1 verifier      can success be verified reliably?
    2 environment   does the environment reset and replay stably?
    3 headroom      is there headroom RL can use (and has prompting/SFT plateaued)?
    4 cost          does the benefit cover the sampling cost?

Each question gets ``pass``, ``warn`` or ``fail`` with the numbers behind it, and the run one
recommendation, in the design notes' order: a replayable environment and evaluation set
first, then a prompt baseline, SFT on good trajectories, a small RL experiment, then scale.
`Readiness.to_json()` is the stable, versioned output of ``--json`` (docs/readiness.md).
"""

from typing import Any

__all__ = ["SCHEMA", "THRESHOLDS", "Check", "Readiness", "judge", "measure_readiness"]


def __getattr__(name: str) -> Any:  # lazy: `tracerl --help` must not import torch
    if name in __all__:
        from tracerl.readiness import verdict

        return getattr(verdict, name)
    raise AttributeError(f"module 'tracerl.readiness' has no attribute {name!r}")
