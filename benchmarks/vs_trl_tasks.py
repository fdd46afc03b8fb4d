"""The task both sides of `vs_trl.py` run, and the tool-calling warm start for --mode multi.

Shared constants (prompts and completions per step, token caps, learning rate, the stored
keys and values), the task builders and prompts, the `lookup` tool in TRL's form (a blocking
python function) and ours (`LookupEnv`, an async `ToolEnv`), the rewards on both sides'
outputs, our multi-turn rollout limits and tool-rendering bundle (TRL's Qwen2.5 template),
and the warm start: the reference script played through our rollout engine, SFT on its
policy tokens, the cached checkpoint and its measured tool-call rate. `CALLS` counts the
tool calls executed in this process; read it as `vs_trl_tasks.CALLS` (a `from` import
copies the value). See the docstring of `vs_trl.py` for the fairness notes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import importlib.util
import json
import random
import time
from pathlib import Path
from typing import Any

from transformers.utils import get_json_schema

from tracerl.cache import cache_dir, save_folder_atomically
from tracerl.envs import Action, ToolEnv, get_parser, make, tool
from tracerl.envs.arithmetic import digit_reward
from tracerl.models import ChatRenderer, load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.budget import Budgets, RolloutConfig
from tracerl.rollout.groups import run_groups
from tracerl.rollout.reference import reference_policy
from tracerl.rollout.runner import Episode, Policy
from tracerl.train.sft import sft
from tracerl.types import Source, ToolCall

PROMPTS = 4  # prompts per step
GROUP = 4  # completions per prompt
TURN_TOKENS = 64
TURNS = 3  # multi-turn: model turns per episode
TOOL_ROUNDS = 2  # multi-turn: tool rounds per episode
TRL_MULTI_COMPLETION = 320  # TRL's cap on a whole multi-turn completion (tool output included)
TOOL_LATENCY_S = 0.5
LR = 1e-6
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
KEYS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")  # measured
WARM_KEYS = (  # the warm start's keys: disjoint from KEYS
    "india", "juliett", "kilo", "lima", "mike", "november", "oscar", "papa",
    "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey", "xray",
    "yankee", "zulu", "apple", "banana", "cherry", "grape", "lemon", "mango",
    "orange", "peach", "pear", "plum", "tiger", "zebra", "otter", "panda",
    "koala", "eagle", "shark", "whale", "horse", "camel", "amber", "azure",
    "coral", "crimson", "indigo", "ivory", "olive", "silver", "violet", "scarlet",
)  # fmt: skip
STORE = {k: str(random.Random(f"vs_trl:{k}").randint(100, 999)) for k in KEYS + WARM_KEYS}
WARM_LR = 5e-5
WARM_MICRO_BATCH_TOKENS = 2048
WARM_RECIPE = "1"  # bump when the warm start changes: a new cached checkpoint
WARM_META = "vs_trl_warm.json"

CALLS = 0  # tool calls executed in this process (both sides count the same way)


# ---- the task, shared by both sides --------------------------------------------------------
def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: the key to look up, e.g. "alpha".
    """
    global CALLS
    CALLS += 1
    time.sleep(TOOL_LATENCY_S)  # TRL's side: a blocking call, as most python tools are
    return STORE.get(key, f"no value is stored under {key!r}")


def tool_template() -> str:
    """TRL's bundled Qwen2.5 chat template, read from the installed package (no import)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("trl is not installed: pip install 'trl==1.16.*'")
    root = Path(next(iter(spec.submodule_search_locations)))
    return (root / "chat_templates" / "qwen2_5.jinja").read_text(encoding="utf-8")


def single_tasks(n: int) -> list[dict[str, Any]]:
    pool = make("arithmetic").sample_tasks(100, seed=0)
    return [pool[i % len(pool)] for i in range(n)]


def multi_tasks(n: int) -> list[dict[str, Any]]:
    keys = [KEYS[i % len(KEYS)] for i in range(n)]
    return [{"id": f"lookup-{i}-{k}", "key": k, "answers": [STORE[k]]} for i, k in enumerate(keys)]


def warm_tasks(n: int) -> list[dict[str, Any]]:
    """The warm start's tasks: keys disjoint from the measured ones (cycled past 48)."""
    keys = [WARM_KEYS[i % len(WARM_KEYS)] for i in range(n)]
    return [{"id": f"warm-{i}-{k}", "key": k, "answers": [STORE[k]]} for i, k in enumerate(keys)]


def call_text(key: str) -> str:
    """A Hermes-style call, as both sides' parsers read it."""
    return (
        "<tool_call>\n"
        + json.dumps({"name": "lookup", "arguments": {"key": key}})
        + "\n</tool_call>"
    )


def multi_messages(task: dict[str, Any]) -> list[dict[str, str]]:
    """The question, spelling out the call (an untrained 135M model seldom calls otherwise)."""
    key = task["key"]
    ask = (
        f'Look up the key "{key}" with the lookup tool. Reply with only the tool call, like '
        f"this:\n{call_text(key)}\nWhen you get the result, answer with the value only."
    )
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": ask}]


def lookup_reward(called: bool, answer: str, gold: str) -> float:
    return 0.5 * called + 0.5 * (gold in answer)


# ---- our side of the task ------------------------------------------------------------------
class LookupEnv(ToolEnv):
    name = "vs_trl_lookup"
    version = "1.0"

    @tool(effect="read", timeout_s=5.0, version="1")
    async def lookup(self, key: str) -> str:
        """Look up the value stored under a key.

        Args:
            key: the key to look up, e.g. "alpha".
        """
        global CALLS
        CALLS += 1
        await asyncio.sleep(TOOL_LATENCY_S)
        return STORE.get(key, f"no value is stored under {key!r}")

    def tool_schemas(self) -> list[dict[str, Any]]:
        return [get_json_schema(lookup)]  # the schema TRL renders: the same prompt tokens

    async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, str]]:
        return multi_messages(task)

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        return multi_tasks(n)

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        """The reference agent (the warm start imitates it): look the key up, answer."""
        call = ToolCall("call_0_0", "lookup", {"key": task["key"]})
        return [Action(text="", tool_calls=(call,)), Action(text="", answer=task["answers"][0])]


def _texts(e: Episode) -> list[str]:
    return [s.text or "" for t in e.trajectories for s in t.policy_segments()]


def _prompt_tokens(e: Episode) -> int:
    """Tokens before the first sampled one (the prompt and the template's assistant header)."""
    sources = e.trajectories[0].sources
    return sources.index(Source.POLICY) if Source.POLICY in sources else len(sources)


def single_reward_ours(e: Episode) -> float:
    texts = _texts(e)
    return digit_reward(texts[0] if texts else "", e.receipt.task["answers"][0])


def multi_reward_ours(e: Episode) -> float:
    texts = _texts(e)
    called = e.receipt.ledger["used"]["tool_calls"] > 0
    return lookup_reward(called, texts[-1] if texts else "", e.receipt.task["answers"][0])


def multi_rollout() -> RolloutConfig:
    return RolloutConfig(
        budgets=Budgets(steps=TURNS, tool_calls=TOOL_ROUNDS, sampled_tokens=None),
        reserve=None,
        max_turn_tokens=TURN_TOKENS,
        max_parse_errors=1,
    )


def tool_bundle(bundle: Any) -> Any:
    """`bundle` rendering with TRL's Qwen2.5 template (tools in the system prompt)."""
    return dataclasses.replace(
        bundle, renderer=ChatRenderer(bundle.tokenizer, chat_template=tool_template())
    )


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


# ---- the warm start (--mode multi) -----------------------------------------------------------
def warm_folder(model_id: str, spec: str, n_tasks: int, epochs: int) -> Path:
    """Where the warm-started checkpoint of this model, template and recipe is cached."""
    key = {
        "model": model_id,
        "template": hashlib.sha256(tool_template().encode()).hexdigest(),
        "prompt": multi_messages(warm_tasks(1)[0]),
        "tasks": n_tasks,
        "epochs": epochs,
        "lr": WARM_LR,
        "micro_batch_tokens": WARM_MICRO_BATCH_TOKENS,
        "recipe": WARM_RECIPE,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in spec.removeprefix("hf:"))
    return cache_dir() / "benchmarks" / f"vs_trl-warm-{slug[-40:]}-{digest}"


def tool_call_rate(spec: str) -> dict[str, float]:
    """Our side, first step's tasks (4 prompts x 4, temperature 1.0), whole episodes: the
    share of first turns that call the tool, of episodes that ran a call, and the reward."""
    bundle = tool_bundle(load(spec))
    parser = get_parser("hermes")
    sampler = BatchedHFSampler(
        bundle.model, temperature=1.0, seed=0, max_batch_size=PROMPTS * GROUP
    )
    policy = Policy.from_bundle(bundle, sampler, parser)
    groups = asyncio.run(
        run_groups(
            LookupEnv,
            multi_tasks(PROMPTS),
            policy,
            multi_rollout(),
            group_size=GROUP,
            max_concurrent_episodes=PROMPTS * GROUP,
        )
    )
    episodes = [e for g in groups for e in g]
    firsts = [(_texts(e) or [""])[0] for e in episodes]
    first_calls = sum(bool(parser.parse(t, step=0).tool_calls) for t in firsts)
    return {
        "episodes": len(episodes),
        "first_turn_calls": first_calls,
        "episodes_calling": sum(e.receipt.ledger["used"]["tool_calls"] > 0 for e in episodes),
        "reward_mean": _mean([multi_reward_ours(e) for e in episodes]),
        "first_turn_example": firsts[0][:200],
    }


def run_warm(spec: str, n_tasks: int, epochs: int) -> dict[str, Any]:
    """Build (or find) the warm-started checkpoint; returns where it is and what it does."""
    t0 = time.perf_counter()
    bundle = load(spec)
    folder = warm_folder(bundle.model_id, spec, n_tasks, epochs)
    if (folder / WARM_META).is_file():
        return {**json.loads((folder / WARM_META).read_text()), "cached": True}
    parser = get_parser("hermes")
    tbundle = tool_bundle(bundle)
    tasks = warm_tasks(n_tasks)
    groups = asyncio.run(
        run_groups(
            LookupEnv,
            tasks,
            reference_policy(tbundle.renderer, tbundle.spec, LookupEnv(), tasks, parser),
            multi_rollout(),
            group_size=1,
            max_concurrent_episodes=len(tasks),
        )
    )
    episodes = [g[0] for g in groups]
    kept = [e for e in episodes if e.gradient_eligible and multi_reward_ours(e) >= 1.0]
    if len(kept) < len(episodes):
        raise SystemExit(
            f"warm start: the reference script solved only {len(kept)} of {len(episodes)} "
            "tasks; check LookupEnv.check_script"
        )
    t_episodes = time.perf_counter() - t0
    trajectories = [t for e in kept for t in e.trajectories]
    result = sft(
        bundle.model,
        trajectories,
        lr=WARM_LR,
        epochs=epochs,
        micro_batch_tokens=WARM_MICRO_BATCH_TOKENS,
    )
    t_sft = time.perf_counter() - t0 - t_episodes
    bundle.model.eval()
    meta: dict[str, Any] = {
        "folder": str(folder),
        "base": bundle.model_id,
        "tasks": n_tasks,
        "epochs": epochs,
        "policy_tokens": sum(sum(s is Source.POLICY for s in t.sources) for t in trajectories),
        "nll": result.nll_epochs,
        "nll_before": result.nll_before,
        "nll_after": result.nll_after,
        "episodes_s": t_episodes,
        "sft_s": t_sft,
    }

    def save(tmp: Path) -> None:
        bundle.model.save_pretrained(tmp)
        bundle.tokenizer.save_pretrained(tmp)
        t1 = time.perf_counter()
        meta["rate"] = tool_call_rate("hf:" + str(tmp))  # what both sides will load
        meta["rate_s"] = time.perf_counter() - t1
        (tmp / WARM_META).write_text(json.dumps(meta, indent=1))

    save_folder_atomically(folder, save)
    return {**meta, "cached": False, "total_s": time.perf_counter() - t0}
