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


class Arithmetic(ToolEnv):
    name = "arithmetic"
    version = "1.0"

    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        return [{"role": "user", "content": f"{task['a']}+{task['b']}="}]

    async def finish(self, action: Action) -> StepResult:
        self.answer = {"text": action.answer or "", "citations": []}
        return StepResult([], terminated=True, info={"answer": self.answer})

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        rng = random.Random(f"arithmetic:{split}:{seed}")
        pairs = rng.sample([(a, b) for a in range(10) for b in range(10)], min(n, 100))
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
