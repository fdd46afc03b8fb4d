"""The two measured sides of `vs_trl.py`: `run_ours` (our `grpo_step`) and `run_trl` (TRL's
`GRPOTrainer`), each run in its own worker subprocess and returning per-step rows (step time,
policy and prompt tokens, tool calls executed, reward mean) with the RSS after the model was
loaded; plus the RSS helpers (`_rss_gb`, now; `_peak_gb`, the process's peak). See the
docstring of `vs_trl.py` for what each side runs and the fairness notes.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import vs_trl_tasks
from tracerl.envs import get_parser
from tracerl.envs.arithmetic import digit_reward
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.runner import Policy
from tracerl.train.grpo import GRPOConfig, grpo_step
from tracerl.train.learner import Learner, LearnerConfig
from vs_trl_tasks import (
    GROUP,
    LR,
    PROMPTS,
    TOOL_ROUNDS,
    TRL_MULTI_COMPLETION,
    TURN_TOKENS,
    LookupEnv,
    _prompt_tokens,
    lookup,
    lookup_reward,
    multi_messages,
    multi_reward_ours,
    multi_rollout,
    multi_tasks,
    single_reward_ours,
    single_tasks,
    tool_bundle,
    tool_template,
)


def _rss_gb() -> float:
    """Resident set size now (VmRSS), in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024**2
    return float("nan")


def _peak_gb() -> float:
    """This process's peak resident set size: ru_maxrss (kB on Linux), VmHWM if larger."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            peak = max(peak, int(line.split()[1]))
    return peak / 1024**2


# ---- our side -------------------------------------------------------------------------------
def run_ours(
    mode: str, steps: int, spec: str, micro_batch_tokens: int, gradient_checkpointing: bool
) -> dict[str, Any]:
    bundle = load(spec)
    loaded_gb = _rss_gb()
    sampler = BatchedHFSampler(
        bundle.model, temperature=1.0, seed=0, max_batch_size=PROMPTS * GROUP
    )
    policy = Policy.from_bundle(bundle, sampler, get_parser("hermes"))
    learner_cfg = LearnerConfig(
        lr=LR,
        temperature=1.0,
        micro_batch_tokens=micro_batch_tokens,
        gradient_checkpointing=gradient_checkpointing,
    )
    learner = Learner(bundle.model, learner_cfg)
    if mode == "single":
        env, tasks, reward = "arithmetic", single_tasks(PROMPTS * steps), single_reward_ours
        rollout = RolloutConfig(budgets=Budgets(steps=1), reserve=None, max_turn_tokens=TURN_TOKENS)
    else:
        env, tasks, reward = LookupEnv, multi_tasks(PROMPTS * steps), multi_reward_ours
        policy = dataclasses.replace(policy, renderer=tool_bundle(bundle).renderer)
        rollout = multi_rollout()
    cfg = GRPOConfig(group_size=GROUP, rollout=rollout, max_concurrent_episodes=PROMPTS * GROUP)
    rows = []
    for i in range(steps):
        calls = vs_trl_tasks.CALLS
        t0 = time.perf_counter()
        metrics, episodes = grpo_step(
            env, tasks[PROMPTS * i : PROMPTS * (i + 1)], policy, learner, reward, cfg, step=i
        )
        rows.append(
            {
                "time_s": time.perf_counter() - t0,
                "tokens": sum(e.receipt.ledger["used"]["sampled_tokens"] for e in episodes),
                "prompt_tokens": sum(_prompt_tokens(e) for e in episodes),
                "tool_calls": vs_trl_tasks.CALLS - calls,
                "reward": metrics["train/reward_mean"],
            }
        )
    return {"steps": rows, "rss_loaded_gb": loaded_gb, "model_id": bundle.model_id}


# ---- TRL's side -----------------------------------------------------------------------------
def _last(metrics: dict[str, list[float]], key: str) -> float:
    values = metrics.get(key) or [float("nan")]
    return float(values[-1])


def run_trl(mode: str, steps: int, spec: str, gradient_checkpointing: bool) -> dict[str, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    bundle = load(spec)
    loaded_gb = _rss_gb()
    tokenizer = copy.deepcopy(bundle.tokenizer)
    n = PROMPTS * steps
    extra: dict[str, Any] = {}
    if mode == "single":
        tasks = single_tasks(n)
        data = [
            {
                "prompt": [{"role": "user", "content": f"{t['a']}+{t['b']}="}],
                "gold": t["answers"][0],
            }
            for t in tasks
        ]

        def reward(completions: list[list[dict[str, Any]]], gold: list[str], **_: Any):
            return [
                digit_reward(c[-1].get("content") or "", g)
                for c, g in zip(completions, gold, strict=True)
            ]

        tools = None
        max_completion = TURN_TOKENS
    else:
        tokenizer.chat_template = tool_template()
        tasks = multi_tasks(n)
        data = [{"prompt": multi_messages(t), "gold": t["answers"][0]} for t in tasks]

        def reward(completions: list[list[dict[str, Any]]], gold: list[str], **_: Any):
            out = []
            for c, g in zip(completions, gold, strict=True):
                said = [m.get("content") or "" for m in c if m["role"] == "assistant"]
                called = any(m["role"] == "tool" for m in c)
                out.append(lookup_reward(called, said[-1] if said else "", g))
            return out

        tools = [lookup]
        max_completion = TRL_MULTI_COMPLETION
        extra = {
            "generation_kwargs": {"max_new_tokens": TURN_TOKENS},
            "max_tool_calling_iterations": TOOL_ROUNDS,
        }

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.rows: list[dict[str, float]] = []
            self.trainer: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t, self.calls, self.seen = (
                time.perf_counter(),
                vs_trl_tasks.CALLS,
                state.num_input_tokens_seen,
            )

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = time.perf_counter()
            m = self.trainer._metrics["train"]  # what TRL logs, read before it is averaged
            tokens = _last(m, "completions/mean_length") * PROMPTS * GROUP  # tool output excluded
            seen = state.num_input_tokens_seen  # prompt + policy tokens
            self.rows.append(
                {
                    "time_s": now - self.t,
                    "tokens": tokens,
                    "prompt_tokens": seen - self.seen - tokens,
                    "tool_calls": vs_trl_tasks.CALLS - self.calls,
                    "reward": _last(m, "reward"),
                }
            )
            self.t, self.calls, self.seen = time.perf_counter(), vs_trl_tasks.CALLS, seen

    with tempfile.TemporaryDirectory(prefix="vs_trl_") as out:
        args = TRLConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to="none",
            logging_strategy="no",
            save_strategy="no",
            eval_strategy="no",
            disable_tqdm=True,
            seed=0,
            max_steps=steps,
            learning_rate=LR,
            per_device_train_batch_size=PROMPTS * GROUP,
            gradient_accumulation_steps=1,
            steps_per_generation=1,
            num_iterations=1,
            num_generations=GROUP,
            beta=0.0,
            temperature=1.0,
            max_completion_length=max_completion,
            shuffle_dataset=False,
            gradient_checkpointing=gradient_checkpointing,
            **extra,
        )
        timer = StepTimer()
        trainer = GRPOTrainer(
            model=bundle.model,
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_list(data),
            processing_class=tokenizer,
            tools=tools,
            callbacks=[timer],
        )
        timer.trainer = trainer
        trainer.train()
    return {"steps": timer.rows, "rss_loaded_gb": loaded_gb, "model_id": bundle.model_id}
