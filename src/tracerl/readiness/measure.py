"""The measurements behind `tracerl readiness`: one small, bounded sample of RL steps.

Everything is measured with the run's own pieces (policy, environment, reward, rollout
config), on training tasks, the way a training step would run them:

* verifier — every sampled episode is scored twice, and once more after harmless
  perturbations (whitespace around and inside the answer, citation order reversed);
* environment — each of a few tasks is reset several times with one seed on fresh
  instances (observation hashes compared); recorded episodes are replayed against the live
  environment (`replay_live`); the environment-error rate of the sample;
* headroom — pass@1, pass@k (k = the group size), the share of groups whose rewards vary,
  the share of model turns the parser could read; optionally a second policy (an SFT
  checkpoint) on the same tasks;
* cost — sampling wall time, tokens and one timed learner update on a copy of the model.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from tracerl.gateway.replay import replay_live
from tracerl.rollout.episode import Episode, Policy, ScoreFn, score_episode
from tracerl.rollout.groups import run_groups
from tracerl.train.metrics import owner
from tracerl.types import Attribution, RewardBreakdown, Source

RESETS = 3  # resets per task with one seed
RESET_TASKS = 4  # tasks reset-checked
REPLAYS = 4  # episodes replayed against the live environment


@dataclasses.dataclass
class Sample:
    """One measured batch: its groups and what it cost."""

    groups: list[list[Episode]]
    wall_s: float

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g]


async def sample_groups(
    env: Any,
    tasks: Sequence[dict[str, Any]],
    policy: Policy,
    rollout: Any,
    group_size: int,
    score: ScoreFn,
    seed: int = 0,
    backend: Any = None,
) -> Sample:
    """The tasks' groups, all at once (as a training step samples them), scored."""
    t0 = time.perf_counter()
    groups = await run_groups(
        env,
        tasks,
        policy,
        rollout,
        group_size=group_size,
        seed=seed,
        max_concurrent_episodes=max(16, len(tasks) * group_size),
        score=score,
        backend=backend,
    )
    return Sample(groups, time.perf_counter() - t0)


# ---- 1. the verifier --------------------------------------------------------------------


def _outcome(r: float | RewardBreakdown | None) -> tuple[bool, float]:
    """(decided, total) of a score, a crash counted as undecided."""
    if r is None:
        return False, math.nan
    if isinstance(r, RewardBreakdown):
        return r.decided and r.error is None, r.total
    return True, float(r)


def _same(a: tuple[bool, float], b: tuple[bool, float]) -> bool:
    if a[0] != b[0]:
        return False
    return (math.isnan(a[1]) and math.isnan(b[1])) or abs(a[1] - b[1]) <= 1e-6


def _ws(text: str) -> str:
    """Harmless whitespace: padded, and every inner space doubled."""
    return "  " + re.sub(r" (?=\S)", "  ", text) + " \n"


def _perturb_answer(answer: Any) -> Any:
    if isinstance(answer, str):
        return _ws(answer)
    if isinstance(answer, dict):
        out = dict(answer)
        if isinstance(out.get("text"), str):
            out["text"] = _ws(out["text"])
        if isinstance(out.get("citations"), list):
            out["citations"] = list(reversed(out["citations"]))
        return out
    return answer


def perturbed(e: Episode) -> Episode:
    """The same episode with harmless changes a verifier must not notice: whitespace in the
    policy's text and the answer, and the answer's citations in reverse order."""

    def step(s: dict[str, Any]) -> dict[str, Any]:
        s = copy.deepcopy(s)
        info = s.get("info")
        if isinstance(info, dict) and "answer" in info:
            info["answer"] = _perturb_answer(info["answer"])
        return s

    trajectories = []
    for t in e.trajectories:
        segments = tuple(
            dataclasses.replace(s, text=_ws(s.text))
            if s.source is Source.POLICY and s.text is not None
            else s
            for s in t.segments
        )
        trajectories.append(
            dataclasses.replace(t, segments=segments, steps=[step(s) for s in t.steps], _cache={})
        )
    return dataclasses.replace(
        e, trajectories=trajectories, steps=[step(s) for s in e.steps], reward=None
    )


def verifier_numbers(episodes: Sequence[Episode], score: ScoreFn) -> dict[str, float]:
    """Scored twice and once perturbed: disagreement, evaluator errors, undecided share."""
    repeat = perturb = errors = undecided = 0
    for e in episodes:
        first = e.reward
        again = score_episode(dataclasses.replace(e, reward=None), score).reward
        moved = score_episode(perturbed(e), score).reward
        a, b, c = _outcome(first), _outcome(again), _outcome(moved)
        errors += bool(first is not None and first.error)
        undecided += not a[0]
        repeat += not _same(a, b)
        perturb += a[0] and not _same(a, c)
    n = max(1, len(episodes))
    return {
        "episodes": float(len(episodes)),
        "self_disagreement_rate": repeat / n,
        "perturbation_disagreement_rate": perturb / n,
        "evaluator_error_rate": errors / n,
        "undecided_rate": undecided / n,
    }


# ---- 2. the environment -----------------------------------------------------------------


def _hash_messages(messages: Any) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, default=str).encode()).hexdigest()


async def reset_numbers(
    factory: Callable[[], Any], tasks: Sequence[dict[str, Any]], seed: int = 0
) -> dict[str, float]:
    """Each task reset `RESETS` times with one seed, each on a fresh instance."""
    unstable = failed = 0
    for task in tasks:
        hashes = set()
        for _ in range(RESETS):
            env = factory()
            try:
                hashes.add(_hash_messages(await env.reset(task, seed)))
            except Exception:  # a reset that raises is a finding
                failed += 1
                hashes.add("<raised>")
            finally:
                await env.close()
        unstable += len(hashes) > 1
    n = max(1, len(tasks))
    return {
        "reset_tasks": float(len(tasks)),
        "reset_nondeterministic_rate": unstable / n,
        "reset_failure_rate": failed / (n * RESETS),
    }


async def replay_numbers(episodes: Sequence[Episode], factory: Callable[[], Any]) -> dict:
    """Recorded episodes replayed against the live environment: the share that drifted."""
    drifted = unavailable = tried = 0
    for e in episodes[:REPLAYS]:
        tried += 1
        try:
            env = factory()
            if getattr(env, "side_effect_guard", "dry_run") != "dry_run":
                await env.close()
                env = None  # rebuilt from the receipt, guarded
            report = await replay_live(e.trajectories, env)
        except Exception:  # e.g. an env not rebuildable from its receipt
            unavailable += 1
            continue
        drifted += bool(report.drifted)
    done = max(1, tried - unavailable)
    return {
        "replayed": float(tried - unavailable),
        "replay_drift_rate": drifted / done if tried > unavailable else math.nan,
    }


def env_error_rate(episodes: Sequence[Episode]) -> float:
    return sum(owner(e) is Attribution.ENVIRONMENT for e in episodes) / max(1, len(episodes))


# ---- 3. headroom --------------------------------------------------------------------------


def _success(e: Episode) -> bool:
    return e.reward is not None and e.reward.succeeded


def headroom_numbers(groups: Sequence[Sequence[Episode]]) -> dict[str, float]:
    episodes = [e for g in groups for e in g]
    totals = [[_outcome(e.reward)[1] for e in g] for g in groups]
    turns = [s for e in episodes for s in e.steps if "action" in s]
    unreadable = sum(bool((s.get("fault") or {}).get("kind") == "parse_error") for s in turns)
    n_groups = max(1, len(groups))
    return {
        "pass_at_1": sum(map(_success, episodes)) / max(1, len(episodes)),
        "pass_at_k": sum(any(map(_success, g)) for g in groups) / n_groups,
        "k": float(max((len(g) for g in groups), default=0)),
        "groups_varying": sum(
            len({round(x, 9) for x in t if not math.isnan(x)}) > 1 for t in totals
        )
        / n_groups,
        "groups_all_success": sum(all(map(_success, g)) for g in groups) / n_groups,
        "groups_all_fail": sum(not any(map(_success, g)) for g in groups) / n_groups,
        "format_valid_rate": 1 - unreadable / len(turns) if turns else math.nan,
        # long horizons: episodes that ran out of context, and what compaction added
        "context_overflow_rate": sum(e.stop_reason.value == "context_overflow" for e in episodes)
        / max(1, len(episodes)),
        "samples_per_episode": sum(len(e.trajectories) for e in episodes) / max(1, len(episodes)),
    }


# ---- 4. cost -------------------------------------------------------------------------------


def cost_numbers(sample: Sample, update_s: float, steps: int) -> dict[str, float]:
    episodes = sample.episodes
    policy_tokens = sum(len(s.token_ids) for e in episodes for s in _policy(e))
    all_tokens = sum(len(s.token_ids) for e in episodes for t in e.trajectories for s in t.segments)
    step_s = sample.wall_s + update_s
    walls = [e.receipt.wall_time_s or 0.0 for e in episodes]
    groups = [max((e.receipt.wall_time_s or 0.0 for e in g), default=0.0) for g in sample.groups]
    return {
        "episode_s_mean": sum(walls) / max(1, len(walls)),
        "group_s_mean": sum(groups) / max(1, len(groups)),
        "sampling_s_per_step": sample.wall_s,
        "update_s_per_step": update_s,
        "step_s": step_s,
        "run_steps": float(steps),
        "run_s": step_s * steps,
        "episodes_per_step": float(len(episodes)),
        "policy_tokens_per_episode": policy_tokens / max(1, len(episodes)),
        "tokens_per_episode": all_tokens / max(1, len(episodes)),
        "tokens_per_step": float(all_tokens),
    }


def _policy(e: Episode) -> list[Any]:
    return [s for t in e.trajectories for s in t.policy_segments()]


def timed_update(model: Any, episodes: Sequence[Episode], learner_config: Any) -> float:
    """Seconds of one learner update on the sample, on a copy of the model (the policy being
    measured is left as it was). Advantages are +-1 by member parity: only the time counts."""
    from tracerl.train.learner import Learner

    trajectories = [t for e in episodes for t in e.trajectories if t.policy_segments()]
    if not trajectories:
        return 0.0
    learner = Learner(copy.deepcopy(model), learner_config)
    t0 = time.perf_counter()
    learner.update(trajectories, [1.0 if i % 2 else -1.0 for i in range(len(trajectories))])
    return time.perf_counter() - t0
