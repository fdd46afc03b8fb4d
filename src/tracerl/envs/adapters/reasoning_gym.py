"""`reasoning_gym`: a reasoning-gym task family as a single-turn environment.

    env:
      name: reasoning_gym
      kwargs: {dataset: chain_sum, config: {min_terms: 2, max_terms: 3, max_digits: 2}}

`dataset` is one of reasoning-gym's dataset names, `config` that dataset's settings (the
fields of its config dataclass, but ``seed`` and ``size``: the splits own them). No tools:
the model's one reply is its answer. The prompt is the generated question and one line on the
answer format; the answer is read from the reply the way reasoning-gym's own evaluations read
it (the last ``<answer>...</answer>``; ``answer_format: reply`` also takes a reply without
tags, whole, and ``number`` its last number). A reply with no answer scores 0, the policy's.

Splits: ``train`` and ``heldout``, each drawn from the generator with its own fixed seed
(derived from the dataset, the split and `seed`), ``train_size`` and ``heldout_size`` items,
generated once per process when tasks are first drawn (before the first episode, never inside
a step). A held-out question that is also a training question (by its text) is dropped, as is
a repeat within a split: evaluations measure questions never trained on. A task is the entry,
JSON-able: its ``question``, gold ``answer`` and ``metadata``, and its ``source`` (the split's
generator seed, size and the index).

The verifier is reasoning-gym's own: ``score_answer(answer, entry)`` of the dataset, the
entry rebuilt from the generator at the task's source (the very object reasoning-gym made,
not a JSON copy: some scorers read tuples in the metadata) and checked against the task's
question. A scorer that raises, a task this generator does not make, or a score that is not
a number is the evaluator's failure (undecided, never trained on), never a 0.

The version in receipts names reasoning-gym's release and the dataset, so runs on different
releases (whose generators and scorers may differ) are told apart.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
import logging
import numbers
import random
import re
from typing import Any

from tracerl.envs.base import Message, StepResult, ToolEnv
from tracerl.envs.parsers import Action
from tracerl.errors import UserError, unknown
from tracerl.rewards.compose import RewardContext, Score

PIP = "pip install 'tracerl[reasoning-gym]'"
DEFAULT_DATASET = "chain_sum"
SPLITS = ("train", "heldout")
RESERVED = ("seed", "size")
"""Config fields the adapter sets itself: each split's generator seed and size."""

INSTRUCTIONS = {
    "tag": "Give only your final answer, between <answer> and </answer> tags.",
    "reply": "Reply with the final answer only.",
    "number": "End your reply with the final answer, a number.",
}
"""The line after the question, by `answer_format` (``instruction`` replaces it)."""

REASONING_GYM_REWARD = """
components:
  - {name: attribution, fn: attribution_label, layer: attribution, weight: 0.0}
  - {name: score_answer, fn: reward, layer: outcome, weight: 1.0}
"""
"""The environment's own reward: reasoning-gym's ``score_answer`` as the one outcome."""

log = logging.getLogger("tracerl")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WHAT_IS_MISSING = {"tag": "<answer>...</answer>", "number": "number"}
"""What a reply without an answer lacks, by format (the evidence's ``why``)."""


class MissingExtra(UserError, ImportError):
    """reasoning-gym is not installed (an optional extra)."""


def import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as e:
        raise MissingExtra(
            f"the reasoning_gym environment needs the reasoning-gym package ({e})", PIP
        ) from e
    return reasoning_gym


@functools.cache
def reasoning_gym_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("reasoning-gym")
    except metadata.PackageNotFoundError:  # the module's own (older releases misreport it)
        return str(getattr(import_reasoning_gym(), "__version__", "unknown"))


def extract_answer(reply: str, answer_format: str = "tag") -> str | None:
    """The answer in a model's reply: the text of its last ``<answer>...</answer>``, stripped
    (reasoning-gym's convention); in ``reply`` format, the whole reply when it has no tags;
    in ``number`` format, the last number in it when it has none (the "flexible extract" of
    numeric benchmarks: ``4 + 9 = 13`` answers 13). None when there is none."""
    found = _ANSWER.findall(reply or "")
    if found:
        text = found[-1].strip()
    elif answer_format == "reply":
        text = (reply or "").strip()
    elif answer_format == "number":
        numbers = _NUMBER.findall(reply or "")
        text = numbers[-1] if numbers else ""
    else:
        return None
    return text or None


class ReasoningGym(ToolEnv):
    """One reasoning-gym dataset's questions, answered in one reply, scored by its scorer."""

    name = "reasoning_gym"
    version = "1.0"
    """The adapter's own version; an instance's names reasoning-gym's release and the
    dataset too (``1.0/reasoning-gym-0.1.25/chain_sum``)."""
    splits = SPLITS
    reward_components = REASONING_GYM_REWARD

    def __init__(
        self,
        dataset: str = DEFAULT_DATASET,
        config: dict[str, Any] | None = None,
        *,
        seed: int = 0,
        train_size: int = 1000,
        heldout_size: int = 200,
        answer_format: str = "tag",
        instruction: str | None = None,
        side_effect_guard: str = "dry_run",
    ) -> None:
        """
        Args:
            dataset: a reasoning-gym dataset name (``chain_sum``, ``basic_arithmetic``...).
            config: that dataset's settings, its config dataclass's fields but seed and size.
            seed: picks the splits' generator seeds (a different seed, different questions).
            train_size: questions generated for ``train`` (repeats dropped).
            heldout_size: questions generated for ``heldout`` (training questions dropped).
            answer_format: ``tag`` (the answer is the last ``<answer>...</answer>``),
                ``reply`` (the same, or the whole reply when it has no tags) or ``number``
                (the same, or the reply's last number: numeric families).
            instruction: the line after each question (default: the format's).
            side_effect_guard: as every `ToolEnv`'s (no tools here: nothing to guard).
        """
        super().__init__(side_effect_guard=side_effect_guard)
        import_reasoning_gym()
        from reasoning_gym.factory import DATASETS

        if not isinstance(dataset, str) or dataset not in DATASETS:
            e = unknown(
                "reasoning-gym dataset",
                str(dataset),
                sorted(DATASETS),
                "set env.kwargs.dataset to one of them (reasoning-gym's GALLERY.md shows each)",
            )
            raise type(e)(f"dataset: {e.message}", e.hint)
        if config is not None and not isinstance(config, dict):
            raise UserError(
                f"config: the settings of {dataset} are a mapping, got {config!r:.80}",
                f"e.g. config: {{{', '.join(f'{k}: ...' for k in _fields(dataset)[:2])}}}",
            )
        for key, value in (("train_size", train_size), ("heldout_size", heldout_size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise UserError(f"{key}: a positive number of questions, got {value!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise UserError(f"seed: an integer, got {seed!r}")
        if answer_format not in INSTRUCTIONS:
            raise UserError(
                f"answer_format: {answer_format!r} is not one of {', '.join(INSTRUCTIONS)}",
                "tag: the answer is the last <answer>...</answer>; reply: or the whole reply",
            )
        if instruction is not None and not isinstance(instruction, str):
            raise UserError(f"instruction: a line of text, got {instruction!r:.80}")
        self.dataset = dataset
        self.config = dict(config or {})
        self.config_json = _config_json(dataset, self.config)
        self.seed, self.answer_format = seed, answer_format
        self.sizes = {"train": train_size, "heldout": heldout_size}
        self.instruction = INSTRUCTIONS[answer_format] if instruction is None else instruction
        # the config is checked here, once per process (reasoning-gym's own validation)
        _generator(dataset, self.config_json, 0, 1)
        release = f"reasoning-gym-{reasoning_gym_version()}"
        self.version = f"{type(self).version}/{release}/{dataset}"  # type: ignore[misc]

    # ---- tasks ----------------------------------------------------------------------------
    def split_seed(self, split: str) -> int:
        """The generator seed of `split`: fixed, and far from the other splits' (reasoning-gym
        seeds item i with seed + i, so neighbouring seeds would share items)."""
        key = f"tracerl:reasoning_gym:{self.dataset}:{split}:{self.seed}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "big")

    def pool(self, split: str) -> list[dict[str, Any]]:
        """Every task of `split`, in generation order (built once per process)."""
        if split not in SPLITS:
            raise ValueError(f"reasoning_gym: unknown split {split!r}; valid: {', '.join(SPLITS)}")
        seeds = tuple((s, self.split_seed(s), self.sizes[s]) for s in SPLITS)
        return _pools(self.dataset, self.config_json, seeds)[split]

    def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict[str, Any]]:
        """`n` tasks of the split (at most its size), in an order fixed by `seed`."""
        pool = self.pool(split)
        order = random.Random(f"reasoning_gym:{self.dataset}:{split}:{seed}")
        picked = order.sample(range(len(pool)), min(n, len(pool)))
        return [copy.deepcopy(pool[i]) for i in picked]

    # ---- the episode ----------------------------------------------------------------------
    async def setup(self, task: dict[str, Any], seed: int) -> list[Message]:
        text = task["question"] + (f"\n\n{self.instruction}" if self.instruction else "")
        return [{"role": "user", "content": text}]

    async def step(self, action: Action) -> StepResult:
        """One turn: whatever the model wrote (an answer, or a tool call: there are no tools)
        is its reply, and ends the episode."""
        return await self.finish(action)

    async def finish(self, action: Action) -> StepResult:
        self.done = True
        reply = action.text or action.answer or ""
        answer = extract_answer(reply, self.answer_format)
        self.answer = {"text": answer or "", "reply": reply, "citations": []}
        return StepResult([], terminated=True, info={"answer": self.answer})

    def check_script(self, task: dict[str, Any]) -> list[Action]:
        """The gold answer in the answer format (a dataset with no single gold answer, its
        ``answer`` None, has none to give: check-env's reward check cannot pass on it)."""
        gold = "" if task.get("answer") is None else str(task["answer"])
        text = f"<answer>{gold}</answer>" if self.answer_format == "tag" else gold
        return [Action(text=text, answer=text)]

    # ---- the verifier ---------------------------------------------------------------------
    def entry(self, task: dict[str, Any]) -> dict[str, Any]:
        """The reasoning-gym entry `task` was made from, rebuilt by its generator; raises when
        the task is not one this environment's generator makes (another dataset, config or
        reasoning-gym release)."""
        source = task.get("source") or {}
        if task.get("dataset") != self.dataset or not {"seed", "size", "index"} <= set(source):
            raise ValueError(
                f"task {task.get('id')!r} is not a {self.dataset} task of this environment "
                f"(dataset {task.get('dataset')!r}, source {source!r:.80})"
            )
        made = _generator(self.dataset, self.config_json, source["seed"], source["size"])
        entry = made[source["index"]]
        if entry.get("question") != task.get("question"):
            raise ValueError(
                f"task {task['id']!r}: reasoning-gym {reasoning_gym_version()} generates "
                f"another question at its source (a task of another release or config)"
            )
        return entry

    def reward(self, ctx: RewardContext) -> Score:
        """reasoning-gym's ``score_answer(answer, entry)`` on the reply's answer; 0 (the
        policy's) when the reply has none."""
        reply = _reply(ctx)
        answer = extract_answer(reply, self.answer_format)
        gold = ctx.task.get("answer")
        evidence: dict[str, Any] = {
            "answer": None if answer is None else answer[:200],
            "gold": None if gold is None else str(gold)[:200],
        }
        if answer is None:
            where = _WHAT_IS_MISSING.get(self.answer_format, "text")
            return Score(0.0, {**evidence, "reply": reply[-200:], "why": f"no {where}"})
        entry = self.entry(ctx.task)
        source = ctx.task["source"]
        scorer = _generator(self.dataset, self.config_json, source["seed"], source["size"])
        value = scorer.score_answer(answer, entry)  # raising: the evaluator's
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"score_answer returned {value!r}, not a number")
        return Score(float(value), evidence)


def _reply(ctx: RewardContext) -> str:
    """The model's reply: the one the environment recorded when the episode ended, else (a
    reply cut by the token limit never reaches the environment) the last one sampled."""
    recorded = (ctx.answer or {}).get("reply")
    if isinstance(recorded, str):
        return recorded
    return ctx.last_sampled_text or ctx.answer_text


# ---- generators and pools, built once per process -----------------------------------------


def _fields(dataset: str) -> list[str]:
    from reasoning_gym.factory import DATASETS

    config_cls = DATASETS[dataset][1]
    return [f.name for f in dataclasses.fields(config_cls) if f.name not in RESERVED]


def _config_json(dataset: str, config: dict[str, Any]) -> str:
    """The config as canonical JSON (the caches' key), its keys checked against the
    dataset's fields."""
    fields = _fields(dataset)
    for key in config:
        if key in RESERVED:
            raise UserError(
                f"config.{key}: the splits set each generator's {key}",
                "use the environment's seed, train_size and heldout_size arguments",
            )
        if key not in fields:
            e = unknown(
                f"{dataset} setting",
                str(key),
                fields,
                f"the settings of {dataset} are the fields of its config class (but seed, size)",
            )
            raise UserError(f"config: {e.message}", e.hint)
    try:
        return json.dumps(config, sort_keys=True)
    except (TypeError, ValueError) as e:
        raise UserError(f"config: not plain data ({e})", "numbers, strings, lists, mappings") from e


@functools.lru_cache(maxsize=64)
def _generator(dataset: str, config_json: str, seed: int, size: int) -> Any:
    """reasoning-gym's dataset object for this config, seed and size."""
    import reasoning_gym

    kwargs = json.loads(config_json)
    if dataset == "composite" and isinstance(kwargs.get("datasets"), list):
        from reasoning_gym.composite import DatasetSpec

        kwargs["datasets"] = [
            DatasetSpec(**d) if isinstance(d, dict) else d for d in kwargs["datasets"]
        ]
    try:
        return reasoning_gym.create_dataset(dataset, **kwargs, seed=seed, size=size)
    except (AssertionError, ValueError, TypeError, KeyError) as e:
        raise UserError(
            f"config: reasoning-gym refused the settings of {dataset}: {type(e).__name__}: "
            f"{e or 'invalid'}",
            f"its settings: {', '.join(_fields(dataset))} (reasoning-gym's GALLERY.md)",
        ) from e


@functools.lru_cache(maxsize=16)
def _pools(
    dataset: str, config_json: str, seeds: tuple[tuple[str, int, int], ...]
) -> dict[str, list[dict[str, Any]]]:
    """Each split's tasks: its generator's items in order, without a question an earlier
    split (or the split itself) already has."""
    seen: set[str] = set()
    pools: dict[str, list[dict[str, Any]]] = {}
    for split, seed, size in seeds:
        made = _generator(dataset, config_json, seed, size)
        pool = []
        for index in range(size):
            try:
                entry = made[index]
            except Exception as e:  # a setting the config check let through
                raise UserError(
                    f"config: generating {dataset} question {index} of split {split!r} raised "
                    f"{type(e).__name__}: {e}",
                    f"check env.kwargs.config against {dataset}'s settings: "
                    f"{', '.join(_fields(dataset))}",
                ) from e
            question = str(entry["question"])
            if question in seen:
                continue
            seen.add(question)
            pool.append(_task(dataset, split, seed, size, index, entry))
        if not pool:
            raise UserError(
                f"config: every one of {size} {split} questions of {dataset} is also a "
                "training question: the settings allow too few distinct questions",
                "widen env.kwargs.config, or lower train_size",
            )
        if len(pool) < size // 4:  # evaluations would measure a handful of questions
            log.warning(
                "reasoning_gym: %s kept %d of its %d %s questions (the others repeat a "
                "question already drawn: these settings allow few distinct ones); widen "
                "env.kwargs.config or lower train_size",
                dataset,
                len(pool),
                size,
                split,
            )
        pools[split] = pool
    return pools


def _task(
    dataset: str, split: str, seed: int, size: int, index: int, entry: dict[str, Any]
) -> dict[str, Any]:
    answer = entry.get("answer")
    return {
        "id": f"{dataset}-{split}-{index}",
        "dataset": dataset,
        "split": split,
        "question": str(entry["question"]),
        "answer": None if answer is None else str(answer),
        # JSON-able (tuples become lists; the scorer gets the generator's own entry)
        "metadata": json.loads(json.dumps(entry.get("metadata") or {}, default=str)),
        "source": {"seed": seed, "size": size, "index": index},
    }
