"""`arithmetic`: single-turn sums, answered with one digit — the learning test's environment.

"3+4=" → "7". The answer is the last digit of the sum, so every answer is one character.
A random policy over a character vocabulary almost never answers (1 in ~95 per token), so
any rise in reward is learning. No tools: the model's reply is its answer.
"""

from __future__ import annotations

import random
from typing import Any

from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.parsers import Action
from tracerl.rewards.compose import RewardContext, Score, component


def _splits() -> dict[str, list[tuple[int, int]]]:
    pairs = [(a, b) for a in range(10) for b in range(10)]
    held = set(random.Random("arithmetic:heldout-pairs").sample(pairs, 20))
    return {"train": [p for p in pairs if p not in held], "heldout": sorted(held)}


SPLITS = _splits()
"""The 100 single-digit sums, split once: 80 to train on, 20 held out (never trained on)."""


ARITHMETIC_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: digit, fn: digit, layer: outcome, weight: 1.0}
"""
"""The arithmetic reward: `digit_reward` of the model's reply, as the one outcome."""


class Arithmetic(ToolEnv):
    name = "arithmetic"
    version = "1.0"
    splits = tuple(SPLITS)
    reward_components = ARITHMETIC_REWARD

    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        return [{"role": "user", "content": f"{task['a']}+{task['b']}="}]

    async def finish(self, action: Action) -> StepResult:
        self.answer = {"text": action.answer or "", "citations": []}
        return StepResult([], terminated=True, info={"answer": self.answer})

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """`n` sums of the split (at most its size), in a seeded order. The 100 sums are
        split once: `heldout` holds 20 that `train` never has."""
        if split not in SPLITS:
            raise ValueError(f"arithmetic: unknown split {split!r}; valid: {', '.join(SPLITS)}")
        pool = SPLITS[split]
        pairs = random.Random(f"arithmetic:{split}:{seed}").sample(pool, min(n, len(pool)))
        return [
            {"id": f"sum-{a}-{b}", "a": a, "b": b, "answers": [str((a + b) % 10)]} for a, b in pairs
        ]

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        return [Action(text=task["answers"][0], answer=task["answers"][0])]


def digit_reward(answer: str, gold: str) -> float:
    """0.5 for answering with a digit, 0.5 more for the right one (shaping for a tiny model:
    the first half is reachable by chance, the second needs the prompt)."""
    first = answer.strip()[:1]
    return (0.5 if first.isdigit() else 0.0) + (0.5 if first == gold else 0.0)


@component("digit")
def digit(ctx: RewardContext) -> Score:
    """Outcome: `digit_reward` of the model's first reply (its whole text: the reply is the
    answer)."""
    segs = ctx.trajectories[0].policy_segments() if ctx.trajectories else []
    text = (segs[0].text or "") if segs else ""
    gold = ctx.task["answers"][0]
    return Score(digit_reward(text, gold), {"reply": text[:40], "gold": gold})
