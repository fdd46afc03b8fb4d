"""One GPU, one call: tracerl's sampler, learner and GRPO step against TRL's `GRPOTrainer`.

Run: .venv/bin/python benchmarks/gpu_step.py [--device cuda|cpu] [--shape 1.7b|tiny]
     [--budget 450] [--out runs/gpu-step/report.md] [--bandwidth 4.8e12] [--peak-flops 989e12]
     [--prompts 8] [--group 8] [--new-tokens 256] [--steps 3] [--trl-gradient-checkpointing on]
     [--decode dynamic|static|compiled]
CPU dry run (tiny shape, a few minutes on 2 cores):
     .venv/bin/python benchmarks/gpu_step.py --shape tiny --device cpu --budget 240

The model: a random-init Llama of SmolLM2-1.7B's shape (hidden 2048, 24 layers, 32 heads, 32
KV heads, intermediate 8192, vocabulary 49152, tied embeddings, rope theta 130000: 1.711 B
parameters), or with --shape tiny a 2-layer one of width 64, built seeded on the device (no
weights are read from disk), with SmolLM2's tokenizer and chat template
(`tracerl.models.loading.smollm2_tokenizer`, or --tokenizer DIR), placed as `tracerl train`
places it (`tracerl.models.placement.resolve`: on a GPU ``bf16-mixed``, fp32 master weights
with bf16 autocast; on a CPU fp32). Both sides build the same weights from the same seed.

Worker processes, one after the other (each its own peak memory; a crash or hang in one
leaves the others' figures): "ours" runs parts 1-4, "trl" runs TRL's GRPO step, "hfcb" the
reference below. TRL's worker keeps --trl-s seconds of the budget (1.7b: 150), tracerl's
gets the rest, the reference what TRL leaves. Each part is skipped, and says so, when the
budget left is too small for it.

  1 sampling   `BatchedHFSampler.generate_batch`: P prompts x G samples (64 rows) x NEW new
               tokens, stop tokens off (every row samples NEW tokens), after a short warm-up,
               decoding as --decode says (dynamic: transformers' growing cache; static:
               `model.kv_cache: static`; compiled: static and `model.compile`, CUDA graphs
               on a GPU; parts 2-4 decode the same way), then (after parts 2-4, while the
               budget lasts) in the other two modes beside --decode's again on the weights
               the GRPO steps left; against HF `generate` on the same rows as GRPOTrainer
               calls it (its GenerationConfig: do_sample, temperature 1, top_k 0, top_p 1,
               disable_compile; min_new_tokens=NEW so it runs as long; under the model's autocast as
               accelerate's bf16 does). The memory-bound limit: a decode step at batch B must
               read the weights (bf16: 2 bytes a parameter) and the KV cache (2 x layers x KV
               heads x head dim x 2 bytes per token of context, at the mean context of the
               run), so tokens/s <= bandwidth / bytes per step x B (--bandwidth, H200's 4.8e12
               B/s by default). Printed: our share of that limit.
  2 multi-turn 64 concurrent episodes (P tasks x G) of a tool env whose one tool sleeps
               --tool-s (0.5 s), through tracerl's rollout runner (`run_groups`) on
               `BatchedHFSampler`; up to --turns model turns of --turn-tokens tokens. A random
               model writes no tool calls, so a scripted parser reads every turn but the last
               as a call of the tool (the tokens are the model's; the env, its latency and
               the runner's concurrency are real). GPU busy fraction: the time inside the
               model's forward passes (timestamps around each, with a device sync) over the
               rollout's wall time.
  3 learner    `Learner.update` (tracerl's path: bucketed micro-batches, chunked LM head on
               policy tokens, PPO loss, backward, clipping, fused AdamW) on the trajectories of
               part 4's last step, with micro-batches sized from the memory left
               (--micro-batch-tokens 0: auto, see `auto_micro_batch_tokens`); tokens/s of
               forward+backward (the update's time less the optimizer step's) and of the
               whole update; MFU = 6 x params x tokens / time / peak (--peak-flops: H200's
               989e12 dense bf16 on a GPU; on a CPU, this run's fp32 matmul rate).
  4 GRPO step  `tracerl.train.grpo.grpo_step` on the `arithmetic` env (P prompts x G, at most
               NEW tokens a turn; a random model seldom samples EOS, so ~P x G x NEW tokens)
               with the learner at tracerl's default micro-batches (--step-micro-batch-tokens,
               4096), --steps steps, the first a warm-up; against TRL's `GRPOTrainer` on the
               same weights, prompts and digit reward: per_device_train_batch_size=P*G,
               num_generations=G, steps_per_generation=1, num_iterations=1, beta=0, lr 1e-6,
               max_completion_length=NEW, temperature 1 (top_k 0, top_p 1: TRL's defaults),
               gradient checkpointing as TRL's default (on; --trl-gradient-checkpointing
               off), bf16 on a GPU. TRL's step time: between `on_step_end` callbacks; its
               generation: `_generate_and_score_completions`, wrapped. TRL runs offline:
               HF_HUB_OFFLINE=1 and USE_HUB_KERNELS=0 (transformers 5.25's switch for the
               `kernels` hub layers: with it on, TRL's path asks the hub for
               ``kernels-community/rotary``).
  1 reference  after TRL, while the budget lasts (--hf-cb on): part 1's rows through
               transformers' own continuous batching (`generate_batch`, paged KV cache, log-
               probs on), in plain bf16 on a GPU, a third process: its tokens/s beside ours
  5 memory     every part's peak: `torch.cuda.max_memory_allocated()` after a reset at the
               part's start (weights included); on a CPU the process's peak RSS (VmHWM,
               reset through /proc/self/clear_refs at the part's start).

Printed: one line per figure with its unit, then the table (ours, TRL, ratio); --out gets the
table as markdown (docs/performance.md carries it) and, beside it, the JSON of everything.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

for _k, _v in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "USE_HUB_KERNELS": "0",  # transformers: no `kernels` layers from the hub (offline)
    "JAX_PLATFORMS": "cpu",  # JAX, if something imports it, must not take the GPU
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
}.items():
    os.environ.setdefault(_k, _v)

SHAPES: dict[str, dict[str, Any]] = {
    "1.7b": dict(  # SmolLM2-1.7B's config
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
}
ROPE_THETA = 130000.0
VOCAB = 49152
LR = 1e-6
REPORT_S = 10  # the budget's last seconds: the summary's


def say(*a: Any) -> None:
    print(*a, flush=True)


def write_json(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


# ---- the machine ---------------------------------------------------------------------------
class Machine:
    """Device, syncs, peak memory and timers for one worker."""

    def __init__(self, device: str) -> None:
        import torch

        self.torch = torch
        self.cuda = device == "cuda"
        if self.cuda and not torch.cuda.is_available():
            raise SystemExit("--device cuda: no GPU is visible (use --device cpu)")

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def now(self) -> float:
        self.sync()
        return time.perf_counter()

    def reset_peak(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()
            return
        with contextlib.suppress(OSError):  # 5: reset the peak RSS (VmHWM), Linux >= 4.0
            Path("/proc/self/clear_refs").write_text("5")

    def peak_gib(self) -> float:
        if self.cuda:
            return self.torch.cuda.max_memory_allocated() / 2**30
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20
        return float("nan")

    @property
    def memory_kind(self) -> str:
        return "max_memory_allocated" if self.cuda else "peak RSS"

    def name(self) -> str:
        if self.cuda:
            return self.torch.cuda.get_device_name(0)
        return f"CPU ({os.cpu_count()} cores, torch {self.torch.get_num_threads()} threads)"


# ---- the model -----------------------------------------------------------------------------
def tokenizer(folder: str | None) -> Any:
    if folder:
        from transformers import AutoTokenizer

        from tracerl.models.loading import _smollm2_turn_end

        return _smollm2_turn_end(AutoTokenizer.from_pretrained(folder, local_files_only=True))
    from tracerl.models.loading import smollm2_tokenizer

    return smollm2_tokenizer()


def build(shape: str, device: str, tok: Any) -> tuple[Any, dict[str, Any]]:
    """The random-init model, seeded, built on `device` and placed as `tracerl train` does."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tracerl.models.placement import place, resolve

    t0 = time.perf_counter()
    cfg = LlamaConfig(
        vocab_size=max(VOCAB, len(tok)),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        rope_theta=ROPE_THETA,
        **SHAPES[shape],
    )
    rope = getattr(cfg, "rope_parameters", None)
    if isinstance(rope, dict) and rope.get("rope_theta") != ROPE_THETA:  # transformers 5
        rope["rope_theta"] = ROPE_THETA
    placement = resolve(device)
    torch.manual_seed(0)
    with torch.device(placement.device):  # initialised where it runs: seconds, not minutes
        model = LlamaForCausalLM(cfg).to(placement.weights)
    model = place(model, placement).eval()
    params = sum(p.numel() for p in model.parameters())
    info = {
        "shape": shape,
        "params": params,
        "placement": placement.describe(),
        "build_s": time.perf_counter() - t0,
        "layers": cfg.num_hidden_layers,
        "kv_heads": cfg.num_key_value_heads,
        "head_dim": cfg.hidden_size // cfg.num_attention_heads,
        "hidden": cfg.hidden_size,
        "intermediate": cfg.intermediate_size,
        "vocab": cfg.vocab_size,
    }
    return model, info


def arithmetic_tasks(n: int, offset: int = 0) -> list[dict[str, Any]]:
    from tracerl.envs import make

    pool = make("arithmetic").sample_tasks(100, seed=0)
    return [pool[(offset + i) % len(pool)] for i in range(n)]


def prompt_ids(tok: Any, tasks: list[dict[str, Any]]) -> list[list[int]]:
    """The prompts as TRL renders them (chat template, then tokens): "a+b=" from the user."""
    out = []
    for t in tasks:
        msgs = [{"role": "user", "content": f"{t['a']}+{t['b']}="}]
        text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        out.append(list(tok(text, add_special_tokens=False)["input_ids"]))
    return out


# ---- the worker: ours ----------------------------------------------------------------------
class ForwardTimer:
    """Wraps the sampler's model calls (`_forward`: prefills and dynamic-cache steps;
    `_slot_forward`: static-slot steps, compiled or not; instance attributes, so the
    sampler goes through them and a compiled step is timed whole, never traced): the time
    inside them, a device sync after each (the sampler syncs every decode step anyway)."""

    NAMES = ("_forward", "_slot_forward")

    def __init__(self, sampler: Any, m: Machine) -> None:
        self.sampler, self.m, self.busy_s, self.calls = sampler, m, 0.0, 0
        for name in self.NAMES:
            setattr(sampler, name, self._timed(getattr(sampler, name)))

    def _timed(self, orig: Any) -> Any:
        def timed(*a: Any, **k: Any) -> Any:
            t0 = self.m.now()
            try:
                return orig(*a, **k)
            finally:
                self.busy_s += self.m.now() - t0
                self.calls += 1

        return timed

    def close(self) -> None:
        for name in self.NAMES:
            delattr(self.sampler, name)  # the class's methods again


def auto_micro_batch_tokens(model: Any, m: Machine, cap: int) -> tuple[int, str]:
    """``trainer.micro_batch_tokens: auto`` (`tracerl.train.memory`: the free memory less the
    update's gradients and AdamW state, over an estimate of each token's activations; 8192
    on a CPU here), at most `cap` (the step's tokens: one micro-batch holds them all)."""
    from tracerl.train.memory import micro_batch_tokens

    if not m.cuda:
        return min(8192, cap), "CPU: 8192"
    tokens, why = micro_batch_tokens("auto", model)
    return min(tokens, max(1024, cap)), why


DECODE_MODES = ("dynamic", "static", "compiled")


def decoding_sampler(model: Any, rows: int, mode: str) -> Any:
    """`BatchedHFSampler` decoding as --decode says: ``dynamic`` (transformers' growing
    cache, the default), ``static`` (`model.kv_cache: static`) or ``compiled`` (static, and
    the decode step compiled: CUDA graphs on a GPU)."""
    from tracerl.rollout import BatchedHFSampler

    return BatchedHFSampler(
        model,
        temperature=1.0,
        seed=0,
        max_batch_size=rows,
        kv_cache="dynamic" if mode == "dynamic" else "static",
        compile=mode == "compiled",
    )


def time_sampling(sampler: Any, reqs: list[Any], m: Machine, left: Any) -> tuple[list, list]:
    """`reqs` sampled in one batch after a short warm-up (static slots reserved at the
    run's full length first, so a compiled step is compiled in the warm-up, not timed); a
    second run when it is cheap (the first may pay one-off costs). The results and the
    runs' seconds."""
    from tracerl.rollout.sampler import SampleRequest

    sampler.reserve(len(reqs), max(len(r.prompt_ids) + r.max_tokens for r in reqs))
    warm = [SampleRequest(r.prompt_ids, 4, frozenset(), seed=r.seed) for r in reqs]
    sampler.generate_batch(warm)
    reps: list[float] = []
    while not reps or (len(reps) < 2 and reps[0] < 0.05 * left()):
        t0 = m.now()
        out = sampler.generate_batch(reqs)
        reps.append(m.now() - t0)
    return out, reps


def compare_decode_modes(
    model: Any, sampler: Any, reqs: list[Any], a: Any, m: Machine, left: Any
) -> dict[str, Any]:
    """Part 1 again in the decode modes --decode did not use, after parts 2-4 (their
    figures first; each mode while the budget has room for it: compiling takes a while):
    --decode's `sampler` once more on the weights the GRPO steps left, then each other mode:
    tokens/s, the ratio to --decode's, and how many seeded rows drew --decode's tokens (all,
    up to the rounding of batched bf16 kernels breaking a near-tie)."""
    out: dict[str, Any] = {}
    first, reps = time_sampling(sampler, reqs, m, left)
    dt = min(reps)
    rate = sum(len(r.token_ids) for r in first) / dt
    out["baseline"] = {"decode": a.decode, "tok_per_s": rate, "runs_s": reps}
    say(f"[1] decode modes: --decode {a.decode} again on the trained weights: {rate:,.0f} tokens/s")
    for mode in DECODE_MODES:
        if mode == a.decode:
            continue
        need = 3 * dt + (90 if mode == "compiled" else 10)
        if left() < need:
            out[mode] = {"skipped": f"{left():.0f} s left, needs ~{need:.0f} s"}
            say(f"    decode {mode}: skipped ({out[mode]['skipped']})")
            continue
        m.reset_peak()
        t0 = m.now()
        sampler = decoding_sampler(model, len(reqs), mode)
        try:
            got, reps = time_sampling(sampler, reqs, m, left)
        except Exception as exc:  # one mode failing leaves the others' figures
            out[mode] = {"failed": f"{type(exc).__name__}: {exc}"[:300]}
            say(f"    decode {mode}: FAILED {out[mode]['failed']}")
            continue
        tokens = sum(len(r.token_ids) for r in got)
        r = {
            "tok_per_s": tokens / min(reps),
            "runs_s": reps,
            "setup_s": m.now() - t0 - sum(reps),
            "ratio": tokens / min(reps) / rate,
            "compiled": bool(getattr(sampler, "compile", False)),
            "peak_gib": m.peak_gib(),
            "rows_same_tokens": sum(
                x.token_ids == y.token_ids for x, y in zip(got, first, strict=True)
            ),
        }
        out[mode] = r
        fell_back = mode == "compiled" and not r["compiled"]
        say(
            f"    decode {mode}: {r['tok_per_s']:,.0f} tokens/s ({r['ratio']:.2f}x --decode "
            f"{a.decode}; {r['rows_same_tokens']}/{len(reqs)} rows drew its tokens; warm-up "
            f"and compile {r['setup_s']:.1f} s; peak "
            f"{r['peak_gib']:.2f} GiB{'; compile FAILED, ran eagerly' if fell_back else ''})"
        )
        del sampler
        gc.collect()
    return out


def worker_ours(a: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    import torch

    from tracerl.envs.arithmetic import digit_reward
    from tracerl.models import ChatRenderer
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.episode import Policy
    from tracerl.rollout.sampler import SampleRequest
    from tracerl.train.grpo import GRPOConfig, grpo_step
    from tracerl.train.learner import Learner, LearnerConfig

    m = Machine(a.device)
    deadline = a.deadline
    rows = a.prompts * a.group
    tok = tokenizer(a.tokenizer)
    model, info = build(a.shape, a.device, tok)
    res["model"] = info
    res["machine"] = m.name()
    say(
        f"model: {info['params'] / 1e9:.3f} B params ({a.shape}), {info['placement']}, "
        f"built in {info['build_s']:.1f} s on {m.name()}"
    )
    save()
    sampler = decoding_sampler(model, rows, a.decode)
    left = lambda: deadline - time.time()  # noqa: E731

    # ---- part 1: single-turn sampling, 64 x NEW, stop tokens off ----
    ids = prompt_ids(tok, arithmetic_tasks(a.prompts))
    rate = None
    if left() < a.need_sampling:
        res["sampling"] = {"skipped": f"{left():.0f} s left, needs ~{a.need_sampling} s"}
        say(f"[1] sampling: skipped ({res['sampling']['skipped']})")
    else:
        m.reset_peak()
        reqs = [
            SampleRequest(ids[i // a.group], a.new_tokens, frozenset(), seed=i) for i in range(rows)
        ]
        out, reps = time_sampling(sampler, reqs, m, left)
        dt = min(reps)  # the best run counts
        tokens = sum(len(r.token_ids) for r in out)
        rate = tokens / dt
        # the memory-bound limit: weights (bf16) + the KV cache at the mean context, per step
        mean_ctx = sum(len(r.prompt_ids) for r in reqs) / rows + a.new_tokens / 2
        kv_per_token = 2 * info["layers"] * info["kv_heads"] * info["head_dim"] * 2
        step_bytes = 2 * info["params"] + kv_per_token * mean_ctx * rows
        limit = a.bandwidth / step_bytes * rows
        s = {
            "rows": rows,
            "new_tokens": a.new_tokens,
            "tokens": tokens,
            "time_s": dt,
            "tok_per_s": rate,
            "runs_s": reps,
            "bytes_per_step_gb": step_bytes / 1e9,
            "weights_gb": 2 * info["params"] / 1e9,
            "kv_gb_mean": kv_per_token * mean_ctx * rows / 1e9,
            "bandwidth": a.bandwidth,
            "limit_tok_per_s": limit,
            "limit_share": rate / limit,
            "peak_gib": m.peak_gib(),
        }
        say(
            f"[1] sampling, BatchedHFSampler: {rows} rows x {a.new_tokens} new tokens = "
            f"{tokens} tokens in {dt:.2f} s: {rate:,.0f} tokens/s (runs: "
            f"{', '.join(f'{x:.2f} s' for x in reps)}, the best counts); peak "
            f"{s['peak_gib']:.2f} GiB"
        )
        say(
            f"    memory-bound limit: {step_bytes / 1e9:.2f} GB a decode step (weights "
            f"{s['weights_gb']:.2f} GB bf16 + KV {s['kv_gb_mean']:.3f} GB at the mean context "
            f"{mean_ctx:.0f}) at {a.bandwidth / 1e12:.2f} TB/s -> {limit:,.0f} tokens/s; "
            f"ours {100 * s['limit_share']:.1f}% of it"
        )
        save_part(res, "sampling", s, save)
        # HF generate as GRPOTrainer calls it, on the same rows
        if left() > 2 * dt + 5:
            s["hf_generate"] = hf_generate(model, tok, reqs, a, m)
            g = s["hf_generate"]
            say(
                f"    HF generate (TRL's generation path): {g['tokens']} tokens in "
                f"{g['time_s']:.2f} s: {g['tok_per_s']:,.0f} tokens/s (runs: "
                f"{', '.join(f'{x:.2f} s' for x in g['runs_s'])}); peak "
                f"{g['peak_gib']:.2f} GiB; ours/HF generate {rate / g['tok_per_s']:.2f}x"
            )
        else:
            s["hf_generate"] = {"skipped": f"{left():.0f} s left"}
            say("    HF generate: skipped (budget)")
        save()

    # ---- part 2: multi-turn, tools that take --tool-s ----
    est_turn = rows * a.turn_tokens / rate if rate else 30.0
    need = 1.5 * (a.turns * est_turn + (a.turns - 1) * a.tool_s) + 5
    if left() < need + a.reserve_for_step:
        res["multi_turn"] = {"skipped": f"{left():.0f} s left, needs ~{need:.0f} s"}
        say(f"[2] multi-turn: skipped ({res['multi_turn']['skipped']})")
    else:
        save_part(res, "multi_turn", multi_turn(model, tok, sampler, a, m), save)

    # ---- part 4: the GRPO step (its last step's trajectories feed part 3) ----
    from tracerl.rollout.episode import Episode

    def reward(e: Episode) -> float:
        texts = [s.text or "" for t in e.trajectories for s in t.policy_segments()]
        return digit_reward(texts[0] if texts else "", e.receipt.task["answers"][0])

    policy = Policy(sampler, ChatRenderer(tok), NoToolParser(), f"random-{a.shape}")
    rollout = RolloutConfig(
        budgets=Budgets(steps=1, sampled_tokens=None), reserve=None, max_turn_tokens=a.new_tokens
    )
    gcfg = GRPOConfig(group_size=a.group, rollout=rollout, max_concurrent_episodes=rows)
    est_sample = rows * a.new_tokens / rate if rate else 60.0
    est_step = 1.5 * est_sample + 10
    steps = a.steps
    while steps > 1 and left() < steps * est_step + 5:
        steps -= 1
    last_episodes: list[Any] = []
    if left() < est_step + 5:
        res["grpo_step"] = {"skipped": f"{left():.0f} s left, needs ~{est_step:.0f} s"}
        say(f"[4] GRPO step: skipped ({res['grpo_step']['skipped']})")
    else:
        learner = Learner(
            model,
            LearnerConfig(lr=LR, temperature=1.0, micro_batch_tokens=a.step_micro_batch_tokens),
        )
        tasks = arithmetic_tasks(a.prompts * steps, offset=a.prompts)
        srows: list[dict[str, Any]] = []
        part = {"steps": srows, "micro_batch_tokens": a.step_micro_batch_tokens}
        res["grpo_step"] = part
        m.reset_peak()
        for i in range(steps):
            if i and left() < est_step:
                part["cut"] = f"after {i} steps: {left():.0f} s left"
                break
            t0 = m.now()
            metrics, episodes = grpo_step(
                "arithmetic",
                tasks[a.prompts * i : a.prompts * (i + 1)],
                policy,
                learner,
                reward,
                gcfg,
                step=i,
            )
            dt = m.now() - t0
            upd = float(metrics.get("time/update_s", float("nan")))
            sampled = sum(e.receipt.ledger["used"]["sampled_tokens"] for e in episodes)
            trained = sum(len(t.token_ids) for e in episodes for t in e.trajectories)
            row = {
                "time_s": dt,
                "update_s": upd,
                "sample_s": dt - upd,
                "sampled_tokens": sampled,
                "trained_tokens": trained,
                "sample_tok_per_s": sampled / max(dt - upd, 1e-9),
                "update_tok_per_s": trained / max(upd, 1e-9),
                "micro_batches": metrics.get("train/micro_batches"),
                "reward": metrics.get("train/reward_mean"),
                "peak_gib": m.peak_gib(),
            }
            srows.append(row)
            est_step = max(est_step, 1.2 * dt)
            say(
                f"[4] GRPO step {i}{' (warm-up)' if i == 0 else ''}: {dt:.2f} s (sampling "
                f"{row['sample_s']:.2f} s, {sampled} tokens, {row['sample_tok_per_s']:,.0f} "
                f"tokens/s; update {upd:.2f} s, {trained} tokens, {row['micro_batches']:.0f} "
                f"micro-batches of <= {a.step_micro_batch_tokens}); peak {row['peak_gib']:.2f} GiB"
            )
            last_episodes = episodes
            save()
        part.update(summarize_steps(srows))
        part["peak_gib"] = m.peak_gib()
        save()
        del learner
    # ---- part 3: the learner alone, micro-batches that use the memory ----
    if not last_episodes:
        res["learner"] = {"skipped": "no trajectories (the GRPO step did not run)"}
        say("[3] learner: skipped (no GRPO step ran)")
    else:
        trajectories = [t for e in last_episodes for t in e.trajectories]
        del last_episodes
        g = torch.Generator().manual_seed(0)
        adv = [float(x) for x in torch.randn(len(trajectories), generator=g)]
        model.zero_grad(set_to_none=True)  # the step's gradients: the new learner's to make
        gc.collect()
        if m.cuda:
            torch.cuda.empty_cache()
        tokens = sum(len(t.token_ids) for t in trajectories)
        padded = len(trajectories) * max(len(t.token_ids) for t in trajectories)
        mbt, why = (
            (a.micro_batch_tokens, "--micro-batch-tokens")
            if a.micro_batch_tokens
            else auto_micro_batch_tokens(model, m, padded)
        )
        upd_s = res.get("grpo_step", {}).get("update_s") or 30.0
        if left() < 3 * upd_s + 5:
            res["learner"] = {"skipped": f"{left():.0f} s left, needs ~{3 * upd_s + 5:.0f} s"}
            say(f"[3] learner: skipped ({res['learner']['skipped']})")
        else:
            for _ in range(3):  # out of memory: half the micro-batch, while time is left
                try:
                    part = learner_part(model, trajectories, adv, tokens, mbt, why, a, m)
                except torch.OutOfMemoryError as e:
                    say(f"[3] learner: out of memory at {mbt} micro-batch tokens ({e!s:.200})")
                    res.setdefault("learner_oom", []).append(mbt)
                    model.zero_grad(set_to_none=True)
                    gc.collect()
                    torch.cuda.empty_cache()
                    mbt, why = max(512, mbt // 2), f"halved after an out-of-memory at {mbt}"
                    if left() < 3 * upd_s + 5:
                        break
                    continue
                save_part(res, "learner", part, save)
                break

    # ---- part 1 again: the other decode modes, while the budget lasts ----
    if "tok_per_s" in res.get("sampling", {}):
        model.zero_grad(set_to_none=True)  # the learner's gradients: not the sampler's memory
        gc.collect()
        if m.cuda:
            torch.cuda.empty_cache()
        if left() < 3 * res["sampling"]["time_s"] + 15:
            res["sampling"]["decode_modes"] = {"skipped": f"{left():.0f} s left"}
            say(f"[1] decode modes: skipped ({left():.0f} s left)")
        else:
            res["sampling"]["decode_modes"] = compare_decode_modes(model, sampler, reqs, a, m, left)
        save()


class NoToolParser:
    """Every turn is the final answer (the single-turn task)."""

    name = "answer"

    def parse(self, text: str, *, step: int) -> Any:
        from tracerl.envs import Action

        return Action(text=text, answer=text)

    def format_calls(self, calls: Any) -> str:
        return ""

    def format_answer(self, answer: str) -> str:
        return answer

    def strip_calls(self, text: str) -> str:
        return text


class ScriptedCallParser(NoToolParser):
    """A random model writes no tool calls: every turn before the last one is read as a
    call of ``lookup`` (its text stays the model's), the last as the answer."""

    name = "scripted-calls"

    def __init__(self, calls: int) -> None:
        self.calls = calls

    def parse(self, text: str, *, step: int) -> Any:
        from tracerl.envs import Action
        from tracerl.types import ToolCall

        if step < self.calls:
            return Action(
                text=text, tool_calls=(ToolCall(f"call_{step}_0", "lookup", {"key": "k"}),)
            )
        return Action(text=text, answer=text)


def scripted_episodes(
    env: Any, tasks: list[dict], sampler: Any, bundle: Any, turns: int, turn_tokens: int
) -> list[Any]:
    """One episode of `env` per task, all at once, through tracerl's rollout runner: up to
    `turns` model turns of `turn_tokens` tokens, each but the last read as one tool call
    (`ScriptedCallParser`). The multi-turn CPU benchmarks' rollout (continuous batching,
    prefix caching)."""
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.episode import Policy
    from tracerl.rollout.groups import run_groups

    policy = Policy(sampler, bundle.renderer, ScriptedCallParser(turns - 1), bundle.model_id)
    cfg = RolloutConfig(
        budgets=Budgets(steps=turns, tool_calls=None, sampled_tokens=None),  # calls: the parser's
        reserve=None,
        max_turn_tokens=turn_tokens,
    )
    groups = asyncio.run(
        run_groups(env, tasks, policy, cfg, group_size=1, seed=7,
                   max_concurrent_episodes=len(tasks))
    )  # fmt: skip
    return [e for g in groups for e in g]


def save_part(res: dict[str, Any], name: str, part: dict[str, Any], save: Any) -> None:
    res[name] = part
    save()


def summarize_steps(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Means over the measured steps (the first is a warm-up, dropped when there are more)."""
    use = rows[1:] if len(rows) > 1 else rows
    keys = ("time_s", "sample_s", "update_s", "sample_tok_per_s", "update_tok_per_s")
    out: dict[str, float] = {}
    for k in keys:
        xs = [float(r[k]) for r in use if r.get(k) is not None and r[k] == r[k]]
        out[k] = sum(xs) / len(xs) if xs else float("nan")
    out["measured_steps"] = len(rows) - 1 if len(rows) > 1 else 0
    out["warmup_s"] = rows[0]["time_s"] if rows else float("nan")
    return out


def hf_generate(model: Any, tok: Any, reqs: list[Any], a: argparse.Namespace, m: Machine) -> dict:
    """HF `generate` with GRPOTrainer's generation config on the same left-padded rows."""
    import torch
    from transformers import GenerationConfig

    from tracerl.models.placement import computing, device_of

    dev = device_of(model)
    width = max(len(r.prompt_ids) for r in reqs)
    pad = tok.pad_token_id
    ids = torch.full((len(reqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, r in enumerate(reqs):
        ids[b, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
        mask[b, width - len(r.prompt_ids) :] = 1
    gen = GenerationConfig(
        max_new_tokens=a.new_tokens,
        min_new_tokens=a.new_tokens,  # as our rows: no early stop
        do_sample=True,
        pad_token_id=pad,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        disable_compile=True,
    )
    m.reset_peak()
    torch.manual_seed(0)
    with torch.no_grad(), computing(model):
        model.generate(
            input_ids=ids.to(dev),
            attention_mask=mask.to(dev),
            generation_config=GenerationConfig(
                **{**gen.to_dict(), "max_new_tokens": 4, "min_new_tokens": 4}
            ),
        )
        reps: list[float] = []
        while not reps or (len(reps) < 2 and reps[0] < 0.05 * (a.deadline - time.time())):
            t0 = m.now()  # as ours: a second run when it is cheap
            out = model.generate(
                input_ids=ids.to(dev), attention_mask=mask.to(dev), generation_config=gen
            )
            reps.append(m.now() - t0)
    dt = min(reps)
    tokens = (out.shape[1] - width) * out.shape[0]
    return {
        "tokens": tokens,
        "time_s": dt,
        "runs_s": reps,
        "tok_per_s": tokens / dt,
        "peak_gib": m.peak_gib(),
    }


def multi_turn(model: Any, tok: Any, sampler: Any, a: argparse.Namespace, m: Machine) -> dict:
    from tracerl.envs import ToolEnv, tool
    from tracerl.models import ChatRenderer
    from tracerl.rollout.budget import Budgets, RolloutConfig
    from tracerl.rollout.episode import Policy
    from tracerl.rollout.groups import run_groups

    tool_s = a.tool_s

    class SlowLookup(ToolEnv):
        name = "gpu_step_lookup"
        version = "1.0"

        @tool(effect="read", timeout_s=30.0, version="1")
        async def lookup(self, key: str) -> str:
            """Look up the value stored under a key.

            Args:
                key: the key.
            """
            await asyncio.sleep(tool_s)
            return f"{key}: 42"

        async def setup(self, task: dict[str, Any], seed: int) -> list[dict[str, str]]:
            return [{"role": "user", "content": f"Look up {task['key']} and tell me its value."}]

        def sample_tasks(self, n: int, *, seed: int = 0, split: str = "train") -> list[dict]:
            return [{"id": f"lookup-{i}", "key": f"k{i}", "answers": ["42"]} for i in range(n)]

    rounds = a.turns - 1
    policy = Policy(sampler, ChatRenderer(tok), ScriptedCallParser(rounds), f"random-{a.shape}")
    cfg = RolloutConfig(
        budgets=Budgets(steps=a.turns, tool_calls=None, sampled_tokens=None),  # calls: the parser's
        reserve=None,
        max_turn_tokens=a.turn_tokens,
        max_parse_errors=1,
    )
    tasks = SlowLookup().sample_tasks(a.prompts)
    rows = a.prompts * a.group

    def run() -> list[Any]:
        groups = asyncio.run(
            run_groups(
                SlowLookup, tasks, policy, cfg, group_size=a.group, max_concurrent_episodes=rows
            )
        )
        return [e for g in groups for e in g]

    # warm-up (short turns), then measured
    run_small = cfg.model_copy(update={"max_turn_tokens": 2})
    asyncio.run(run_groups(SlowLookup, tasks[:1], policy, run_small, group_size=2))
    m.reset_peak()
    before = dict(sampler.stats.__dict__)
    kept_before = dict(sampler.prefixes.stats.__dict__)
    timer = ForwardTimer(sampler, m)
    try:
        t0 = m.now()
        episodes = run()
        wall = m.now() - t0
    finally:
        timer.close()
    used = [e.receipt.ledger["used"] for e in episodes]
    tokens = sum(u["sampled_tokens"] for u in used)
    calls = sum(u["tool_calls"] for u in used)
    turns = sum(u.get("steps", 0) for u in used)
    out = {
        "episodes": len(episodes),
        "turns": turns,
        "tool_calls": calls,
        "tool_s": tool_s,
        "turn_tokens": a.turn_tokens,
        "sampled_tokens": tokens,
        "wall_s": wall,
        "tok_per_s": tokens / wall,
        "forward_s": timer.busy_s,
        "forwards": timer.calls,
        "busy_fraction": timer.busy_s / wall,
        "batches": sampler.stats.batches - before["batches"],
        "tool_wait_floor_s": rounds * tool_s,
        "peak_gib": m.peak_gib(),
        # prefix caching (model.prefix_cache_gb): later turns that prefilled only new tokens
        "prefix_cache_gib": sampler.prefixes.max_bytes / 2**30,
        "prefix_hits": sampler.prefixes.stats.hits - kept_before["hits"],
        "prefix_reused_tokens": sampler.prefixes.stats.reused_tokens - kept_before["reused_tokens"],
        "prefix_evicted": sampler.prefixes.stats.evicted - kept_before["evicted"],
    }
    say(
        f"[2] multi-turn: {len(episodes)} episodes, {turns} model turns of <= {a.turn_tokens} "
        f"tokens, {calls} tool calls of {tool_s:g} s, {tokens} tokens in {wall:.2f} s "
        f"({out['tok_per_s']:,.0f} tokens/s; {out['batches']} sampler batches); GPU busy "
        f"{100 * out['busy_fraction']:.1f}% ({timer.busy_s:.2f} s in {timer.calls} forwards; "
        f"the tools alone take >= {rounds * tool_s:.1f} s); peak {out['peak_gib']:.2f} GiB; "
        f"kept prefixes ({out['prefix_cache_gib']:.1f} GiB cap): {out['prefix_hits']} of "
        f"{turns - len(episodes)} later turns, {out['prefix_reused_tokens']} prompt tokens "
        f"not prefilled again, {out['prefix_evicted']} evicted"
    )
    return out


def learner_part(
    model: Any,
    trajectories: list[Any],
    adv: list[float],
    tokens: int,
    mbt: int,
    why: str,
    a: argparse.Namespace,
    m: Machine,
) -> dict:
    from tracerl.train.learner import Learner, LearnerConfig

    m.reset_peak()
    learner = Learner(model, LearnerConfig(lr=LR, temperature=1.0, micro_batch_tokens=mbt))
    opt_s = [0.0]
    step = learner.optimizer.step

    def timed_step(*x: Any, **k: Any) -> Any:
        t0 = m.now()
        try:
            return step(*x, **k)
        finally:
            opt_s[0] += m.now() - t0

    learner.optimizer.step = timed_step
    params = sum(p.numel() for p in model.parameters())
    peak = a.peak_flops or matmul_rate(m)
    times, opts, mbs = [], [], 0.0
    for rep in range(1 + a.learner_reps):
        opt_s[0] = 0.0
        t0 = m.now()
        metrics = learner.update(trajectories, adv)
        dt = m.now() - t0
        mbs = metrics.get("train/micro_batches", 0.0)
        if rep:  # the first: warm-up
            times.append(dt)
            opts.append(opt_s[0])
    t = sum(times) / len(times)
    o = sum(opts) / len(opts)
    fb = t - o
    out = {
        "trajectories": len(trajectories),
        "tokens": tokens,
        "micro_batch_tokens": mbt,
        "micro_batch_why": why,
        "micro_batches": mbs,
        "update_s": t,
        "optimizer_s": o,
        "fwd_bwd_s": fb,
        "fwd_bwd_tok_per_s": tokens / fb,
        "update_tok_per_s": tokens / t,
        "params": params,
        "peak_flops": peak,
        "peak_flops_source": "--peak-flops" if a.peak_flops else "this CPU's fp32 matmul rate",
        "mfu": 6 * params * tokens / fb / peak,
        "mfu_update": 6 * params * tokens / t / peak,
        "peak_gib": m.peak_gib(),
    }
    say(
        f"[3] learner: {len(trajectories)} rows, {tokens} tokens, {mbs:.0f} micro-batches of <= "
        f"{mbt} tokens ({why}): forward+backward {fb:.2f} s = {out['fwd_bwd_tok_per_s']:,.0f} "
        f"tokens/s, MFU {100 * out['mfu']:.1f}% of {peak / 1e12:.3g} TFLOP/s "
        f"({out['peak_flops_source']}); whole update (+ AdamW {o:.2f} s) "
        f"{out['update_tok_per_s']:,.0f} tokens/s, MFU {100 * out['mfu_update']:.1f}%; peak "
        f"{out['peak_gib']:.2f} GiB"
    )
    return out


def matmul_rate(m: Machine) -> float:
    """This machine's dense matmul rate (fp32 on a CPU, bf16 on a GPU), best of a few sizes."""
    torch = m.torch
    dev, dt = ("cuda", torch.bfloat16) if m.cuda else ("cpu", torch.float32)
    best = 0.0
    for n in (512, 1024, 2048):
        x = torch.randn(n, n, device=dev, dtype=dt)
        x @ x
        reps, t0 = 0, m.now()
        while m.now() - t0 < 0.3:
            x @ x
            reps += 1
        best = max(best, 2 * n**3 * reps / (m.now() - t0))
    return best


# ---- the worker: TRL -----------------------------------------------------------------------
def worker_trl(a: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    m = Machine(a.device)
    t0 = time.perf_counter()
    import datasets
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOTrainer

    from tracerl.envs.arithmetic import digit_reward
    from vs_trl_sides import matched_grpo_config

    res["versions"] = {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "datasets": datasets.__version__,
    }
    res["import_s"] = time.perf_counter() - t0
    tok = tokenizer(a.tokenizer)
    model, info = build(a.shape, a.device, tok)
    res["model"] = info
    rows = a.prompts * a.group
    steps = a.steps
    tasks = arithmetic_tasks(a.prompts * steps, offset=a.prompts)
    data = [
        {"prompt": [{"role": "user", "content": f"{t['a']}+{t['b']}="}], "gold": t["answers"][0]}
        for t in tasks
    ]

    def reward(completions: list[list[dict[str, Any]]], gold: list[str], **_: Any) -> list[float]:
        return [
            digit_reward(c[-1].get("content") or "", g)
            for c, g in zip(completions, gold, strict=True)
        ]

    srows: list[dict[str, Any]] = []
    gen: list[float] = []
    part: dict[str, Any] = {"steps": srows, "gradient_checkpointing": a.trl_gc == "on"}
    res["grpo_step"] = part

    class StepTimer(TrainerCallback):
        trainer: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            m.reset_peak()
            self.t = m.now()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            now = m.now()
            metrics = self.trainer._metrics["train"]
            mean_len = float((metrics.get("completions/mean_length") or [float("nan")])[-1])
            dt = now - self.t
            g = gen[-1] if gen else float("nan")
            sampled = mean_len * rows
            seen = state.num_input_tokens_seen - getattr(self, "seen", 0)
            self.seen = state.num_input_tokens_seen
            row = {
                "time_s": dt,
                "sample_s": g,
                "update_s": dt - g,
                "sampled_tokens": sampled,
                "trained_tokens": seen,
                "sample_tok_per_s": sampled / max(g, 1e-9),
                "update_tok_per_s": seen / max(dt - g, 1e-9),
                "peak_gib": m.peak_gib(),
            }
            srows.append(row)
            part["peak_gib"] = max(r["peak_gib"] for r in srows)
            say(
                f"[4] TRL GRPO step {len(srows) - 1}{' (warm-up)' if len(srows) == 1 else ''}: "
                f"{dt:.2f} s (generation {g:.2f} s, {sampled:.0f} tokens, "
                f"{row['sample_tok_per_s']:,.0f} tokens/s; update {dt - g:.2f} s); peak "
                f"{row['peak_gib']:.2f} GiB"
            )
            save()
            self.t = m.now()

    with tempfile.TemporaryDirectory(prefix="gpu_step_trl_") as out:
        args = matched_grpo_config(
            out,
            steps=steps,
            lr=LR,
            rows=rows,
            group=a.group,
            max_completion=a.new_tokens,
            gradient_checkpointing=a.trl_gc == "on",
            cuda=m.cuda,
            include_num_input_tokens_seen=True,
        )
        timer = StepTimer()
        t1 = time.perf_counter()
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=args,
            train_dataset=Dataset.from_list(data),
            processing_class=tok,
            callbacks=[timer],
        )
        res["trainer_init_s"] = time.perf_counter() - t1
        timer.trainer = trainer
        orig = trainer._generate_and_score_completions

        def timed(*x: Any, **k: Any) -> Any:
            t = m.now()
            r = orig(*x, **k)
            gen.append(m.now() - t)
            return r

        trainer._generate_and_score_completions = timed
        save()
        trainer.train()
    part.update(summarize_steps(srows))
    save()


# ---- the worker: transformers' own continuous batching (a reference) -----------------------
def worker_hfcb(a: argparse.Namespace, res: dict[str, Any], save: Any) -> None:
    """Part 1's rows through transformers' own continuous batching (`generate_batch`: a
    paged KV cache, its scheduler, CUDA graphs where it captures them), with log-probs, in
    plain bf16 on a GPU (its loop runs in a thread of its own, where the caller's autocast
    does not reach, so fp32 master weights would decode in fp32). A reference for the
    sampler, not a candidate for it: it draws every row's token in one ``multinomial`` from
    the global generator, so a seeded request's tokens depend on its batch-mates (docs/
    rollout.md: "Why not transformers' continuous batching")."""
    import torch
    import transformers
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    m = Machine(a.device)
    res["versions"] = {"transformers": transformers.__version__}
    tok = tokenizer(a.tokenizer)
    model, info = build(a.shape, a.device, tok)
    if m.cuda:
        model = model.to(torch.bfloat16)
    res["model"] = info
    ids = prompt_ids(tok, arithmetic_tasks(a.prompts))
    inputs = [ids[i // a.group] for i in range(a.prompts * a.group)]
    gen = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=a.new_tokens,
        eos_token_id=None,  # as our rows: every row samples NEW tokens
        pad_token_id=tok.pad_token_id,
    )
    # its KV cache: on a GPU as it sizes it (most of the free memory, as a serving engine
    # would); on a CPU, where it would size it from the machine's memory (14 GiB for the
    # tiny shape), the pages these rows need
    pages = -(-(max(len(x) for x in inputs) + a.new_tokens) // 256)
    cb = {} if m.cuda else {"num_blocks": len(inputs) * pages + 1}
    runs: list[dict[str, float]] = []
    part: dict[str, Any] = {"runs": runs, "dtype": str(next(model.parameters()).dtype)}
    res["hf_continuous"] = part
    m.reset_peak()
    for warmup in (True, False):  # the first run includes its warm-up (graph capture)
        t0 = m.now()
        out = model.generate_batch(
            inputs,
            generation_config=gen,
            continuous_batching_config=ContinuousBatchingConfig(return_logprobs=True, seed=0, **cb),
            warmup=warmup,
        )
        dt = m.now() - t0
        tokens = sum(len(o.generated_tokens) for o in out.values())
        runs.append({"time_s": dt, "tokens": tokens, "warmup": warmup})
        part.update(tok_per_s=tokens / dt, time_s=dt, tokens=tokens, peak_gib=m.peak_gib())
        save()
        say(
            f"[1] transformers continuous batching (reference){' incl. warm-up' if warmup else ''}"
            f": {tokens} tokens in {dt:.2f} s: {tokens / dt:,.0f} tokens/s; peak "
            f"{part['peak_gib']:.2f} GiB ({part['dtype']})"
        )
        if a.deadline - time.time() < 2 * dt + 5:
            break


# ---- the orchestrator ------------------------------------------------------------------------
def run_worker(which: str, a: argparse.Namespace, deadline: float, scratch: Path) -> dict[str, Any]:
    """One worker process, stopped at `deadline`; what it wrote so far (and why it ended)."""
    result = scratch / f"{which}.json"
    cmd = [sys.executable, __file__, *sys.argv[1:], "--worker", which]
    cmd += ["--deadline", f"{deadline - 5:.1f}", "--result", str(result)]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
    try:
        rc: int | str = proc.wait(timeout=max(1.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        rc = f"stopped at the budget ({time.time() - t0:.0f} s)"
    out = json.loads(result.read_text()) if result.is_file() else {}
    out["rc"] = rc
    out["wall_s"] = time.time() - t0
    return out


def ratio(x: Any, y: Any) -> float:
    try:
        return float(x) / float(y)
    except (TypeError, ValueError, ZeroDivisionError):
        return float("nan")


def fmt(x: Any, spec: str = ",.0f", unit: str = "") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    return f"{x:{spec}}{unit}"


def table(
    a: argparse.Namespace, ours: dict[str, Any], trl: dict[str, Any], hfcb: dict[str, Any]
) -> list[str]:
    """The markdown table: figure, ours, TRL, ours/TRL (and one row against transformers'
    continuous batching, `hfcb`: the reference worker's figures)."""
    s, mt, ln = ours.get("sampling", {}), ours.get("multi_turn", {}), ours.get("learner", {})
    st, tt = ours.get("grpo_step", {}), trl.get("grpo_step", {})
    hf = s.get("hf_generate", {}) if isinstance(s.get("hf_generate"), dict) else {}
    rows = a.prompts * a.group
    lines = [
        "| part | figure | tracerl | TRL | tracerl / TRL |",
        "|---|---|---|---|---|",
    ]

    def row(part: str, what: str, o: Any, t: Any, spec: str, unit: str, r: Any = None) -> None:
        rr = r if r is not None else (ratio(o, t) if t is not None else None)
        lines.append(
            f"| {part} | {what} | {fmt(o, spec, unit)} | {fmt(t, spec, unit)} | "
            f"{fmt(rr, '.2f', 'x')} |"
        )

    peak_tf = fmt(ln["peak_flops"] / 1e12 if ln.get("peak_flops") else None, ".3g")
    trl_gen = tt.get("sample_tok_per_s")
    row(
        "1 sampling",
        f"{rows} x {a.new_tokens} single-turn, tokens/s (TRL: HF generate as GRPOTrainer calls it)",
        s.get("tok_per_s"),
        hf.get("tok_per_s"),
        ",.0f",
        "",
    )
    if trl_gen is not None:
        row(
            "1 sampling",
            "sampling tokens/s inside the GRPO step (TRL: its generation)",
            st.get("sample_tok_per_s"),
            trl_gen,
            ",.0f",
            "",
        )
    row(
        "1 sampling",
        f"share of the memory-bound limit ({fmt(s.get('limit_tok_per_s'))} tokens/s at "
        f"{a.bandwidth / 1e12:.2f} TB/s)",
        100 * s["limit_share"] if "limit_share" in s else None,
        100 * hf["tok_per_s"] / s["limit_tok_per_s"] if hf.get("tok_per_s") and s else None,
        ".1f",
        "%",
    )
    row("1 sampling", "peak memory, GiB", s.get("peak_gib"), hf.get("peak_gib"), ".2f", "")
    if hfcb.get("tok_per_s"):
        row(
            "1 sampling",
            f"the same rows, tokens/s (here not TRL but transformers' continuous batching, "
            f"generate_batch, {hfcb.get('dtype', '?').removeprefix('torch.')}: a reference)",
            s.get("tok_per_s"),
            hfcb["tok_per_s"],
            ",.0f",
            "",
        )
    for mode, d in (s.get("decode_modes") or {}).items():
        if mode not in DECODE_MODES or not isinstance(d, dict):
            continue
        row(
            "1 sampling",
            f"the same, decode {mode} (the rows above: --decode {a.decode}), tokens/s",
            d.get("tok_per_s"),
            hf.get("tok_per_s"),
            ",.0f",
            "",
        )
    row(
        "2 multi-turn",
        f"{mt.get('episodes', rows)} episodes, {a.turns} turns x {a.turn_tokens} tokens, "
        f"{a.tool_s:g} s tools: wall s",
        mt.get("wall_s"),
        None,
        ".2f",
        "",
    )
    row(
        "2 multi-turn",
        "GPU busy fraction",
        100 * mt["busy_fraction"] if mt.get("busy_fraction") is not None else None,
        None,
        ".1f",
        "%",
    )
    row("2 multi-turn", "sampled tokens/s", mt.get("tok_per_s"), None, ",.0f", "")
    if "prefix_hits" in mt:
        later = mt["turns"] - mt["episodes"]
        row(
            "2 multi-turn",
            f"later turns from kept prefixes (of {later}; cap {mt['prefix_cache_gib']:.1f} GiB, "
            f"{mt['prefix_reused_tokens']:,} prompt tokens not prefilled again)",
            mt["prefix_hits"],
            None,
            "d",
            "",
        )
    row("3 learner", "forward+backward tokens/s", ln.get("fwd_bwd_tok_per_s"), None, ",.0f", "")
    row(
        "3 learner",
        f"MFU (6·N·tokens / time / {peak_tf} TFLOP/s)",
        100 * ln["mfu"] if "mfu" in ln else None,
        None,
        ".1f",
        "%",
    )
    row(
        "3 learner",
        f"micro-batch tokens {ln.get('micro_batch_tokens', '—')}: peak memory, GiB",
        ln.get("peak_gib"),
        None,
        ".2f",
        "",
    )
    row(
        "4 GRPO step",
        f"{a.prompts} prompts x {a.group}, <= {a.new_tokens} tokens: s/step",
        st.get("time_s"),
        tt.get("time_s"),
        ".2f",
        "",
    )
    row("4 GRPO step", "sampling s", st.get("sample_s"), tt.get("sample_s"), ".2f", "")
    row("4 GRPO step", "update s", st.get("update_s"), tt.get("update_s"), ".2f", "")
    row(
        "4 GRPO step",
        "update tokens/s",
        st.get("update_tok_per_s"),
        tt.get("update_tok_per_s"),
        ",.0f",
        "",
    )
    row("5 memory", "GRPO step peak, GiB", st.get("peak_gib"), tt.get("peak_gib"), ".2f", "")
    return lines


def orchestrate(a: argparse.Namespace) -> int:
    t_start = time.time()
    end = t_start + a.budget
    out = Path(a.out)
    md = out if out.suffix == ".md" else out.with_suffix(".md")
    js = md.with_suffix(".json")
    peak = fmt(a.peak_flops / 1e12 if a.peak_flops else None, ".0f")
    if peak == "—":
        peak = "(this CPU's matmul rate)"
    say(
        f"gpu_step: device {a.device}, shape {a.shape}, budget {a.budget:.0f} s; {a.prompts} "
        f"prompts x {a.group} samples, {a.new_tokens} new tokens; bandwidth "
        f"{a.bandwidth / 1e12:.2f} TB/s, peak {peak} TFLOP/s; offline: "
        f"HF_HUB_OFFLINE={os.environ['HF_HUB_OFFLINE']} "
        f"USE_HUB_KERNELS={os.environ['USE_HUB_KERNELS']}"
    )
    with tempfile.TemporaryDirectory(prefix="gpu_step_") as tmp:
        scratch = Path(tmp)
        usable = a.budget - REPORT_S
        ours_end = t_start + usable - (0 if a.no_trl else a.trl_s)
        ours = run_worker("ours", a, ours_end, scratch)
        if ours["rc"] != 0:
            say(f"ours: ended with {ours['rc']}" + (f": {ours.get('error', '')[-800:]}"))

        def then(which: str, label: str, off: str | None, need: float) -> dict[str, Any]:
            """Worker `which` until the budget's end, unless `off` says why not or fewer
            than `need` seconds are left."""
            left = end - REPORT_S - time.time()
            if off:
                return {"skipped": off}
            if left < need:
                out = {"skipped": f"{left:.0f} s left, needs ~{need:.0f} s"}
                say(f"{label}: skipped ({out['skipped']})")
                return out
            out = run_worker(which, a, end - REPORT_S, scratch)
            if out["rc"] != 0:
                err = out.get("error", "")
                say(f"{label}: ended with {out['rc']}" + (f": {err[-1500:]}" if err else ""))
            return out

        trl = then("trl", "[4] TRL", "--no-trl" if a.no_trl else None, a.need_trl)
        hfcb = then(
            "hfcb",
            "[1] transformers continuous batching",
            "--hf-cb off" if a.hf_cb == "off" else None,
            a.need_sampling + 15,
        )
    st, tt = ours.get("grpo_step", {}), trl.get("grpo_step", {})
    lines = table(a, ours, trl, hfcb.get("hf_continuous") or {})
    date = time.strftime("%Y-%m-%d")
    cmd = "python benchmarks/gpu_step.py " + " ".join(sys.argv[1:])
    head = [
        f"`{cmd}` — {date}, {ours.get('machine', a.device)}; model "
        f"{(ours.get('model') or {}).get('params', 0) / 1e9:.3f} B params ({a.shape}, random "
        f"init), {(ours.get('model') or {}).get('placement', '?')}; TRL "
        f"{(trl.get('versions') or {}).get('trl', '—')} (gradient checkpointing {a.trl_gc}); "
        f"total {time.time() - t_start:.0f} s of {a.budget:.0f} s",
        "",
    ]
    notes = []
    for side, r in (("tracerl", ours), ("TRL", trl), ("transformers CB", hfcb)):
        for k, v in r.items():
            if isinstance(v, dict) and v.get("skipped"):
                notes.append(f"- {side} {k}: skipped ({v['skipped']})")
        if r.get("skipped"):
            notes.append(f"- {side}: skipped ({r['skipped']})")
        if r.get("rc") not in (None, 0):
            notes.append(f"- {side}: worker ended with {r['rc']}")
    if st.get("time_s") and tt.get("time_s"):
        notes.append(
            f"- whole GRPO step: tracerl/TRL {ratio(st['time_s'], tt['time_s']):.2f}x "
            f"(target <= 0.5x); peak memory {ratio(st.get('peak_gib'), tt.get('peak_gib')):.2f}x "
            f"(target <= 1x)"
        )
    doc = "\n".join(head + lines + (["", *notes] if notes else [])) + "\n"
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(doc)
    write_json(js, {"args": vars(a), "date": date, "ours": ours, "trl": trl, "hfcb": hfcb})
    say("")
    say(doc)
    say(f"report: {md} (JSON: {js})")
    return 0 if ours.get("rc") == 0 else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default=None)
    ap.add_argument("--shape", choices=tuple(SHAPES), default="1.7b")
    ap.add_argument("--budget", type=float, default=450.0, help="seconds for everything")
    ap.add_argument("--out", default="runs/gpu-step/report.md")
    ap.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s (H200: 4.8e12)")
    ap.add_argument(
        "--peak-flops", type=float, default=None, help="FLOP/s (cuda: 989e12, H200 bf16 dense)"
    )
    ap.add_argument("--prompts", type=int, default=None, help="1.7b: 8, tiny: 4")
    ap.add_argument("--group", type=int, default=None, help="1.7b: 8, tiny: 4")
    ap.add_argument("--new-tokens", type=int, default=None, help="1.7b: 256, tiny: 16")
    ap.add_argument(
        "--steps", type=int, default=None, help="GRPO steps per side, 1st a warm-up (3; tiny 2)"
    )
    ap.add_argument("--turns", type=int, default=3, help="multi-turn: model turns")
    ap.add_argument("--turn-tokens", type=int, default=None, help="1.7b: 128, tiny: 8")
    ap.add_argument("--tool-s", type=float, default=0.5)
    ap.add_argument("--micro-batch-tokens", type=int, default=0, help="learner; 0: auto")
    ap.add_argument("--step-micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--learner-reps", type=int, default=2)
    ap.add_argument(
        "--trl-gc",
        "--trl-gradient-checkpointing",
        choices=("on", "off"),
        default="on",
        dest="trl_gc",
    )
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument(
        "--trl-s",
        type=float,
        default=None,
        help="seconds of the budget kept for TRL's worker (1.7b: 150, tiny: 45); tracerl's "
        "worker gets the rest, and the reference (--hf-cb) what TRL leaves",
    )
    ap.add_argument(
        "--decode",
        choices=DECODE_MODES,
        default="dynamic",
        help="the sampler's decoding for every part (part 1 also times the other modes)",
    )
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder (default: SmolLM2's)")
    ap.add_argument(
        "--hf-cb",
        choices=("on", "off"),
        default="on",
        help="after TRL, while the budget lasts: part 1's rows through transformers' own "
        "continuous batching (a reference)",
    )
    ap.add_argument("--worker", choices=("ours", "trl", "hfcb"), help=argparse.SUPPRESS)
    ap.add_argument("--deadline", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.device is None:
        import torch

        a.device = "cuda" if torch.cuda.is_available() else "cpu"
    big = a.shape == "1.7b"
    a.prompts = a.prompts or (8 if big else 4)
    a.group = a.group or (8 if big else 4)
    a.new_tokens = a.new_tokens or (256 if big else 16)
    a.turn_tokens = a.turn_tokens or (128 if big else 8)
    a.steps = a.steps or (3 if big else 2)
    if a.peak_flops is None and a.device == "cuda":
        a.peak_flops = 989e12
    a.need_sampling = 30 if big else 10  # seconds a part needs at least
    a.need_trl = 90 if big else 30
    a.trl_s = max(a.need_trl, a.trl_s if a.trl_s is not None else (150 if big else 45))
    a.reserve_for_step = 40 if big else 15  # part 2 leaves this for the GRPO step
    if not a.worker:
        return orchestrate(a)
    res: dict[str, Any] = {"side": a.worker, "pid": os.getpid()}
    path = Path(a.result)

    def save() -> None:
        write_json(path, res)

    try:
        {"ours": worker_ours, "trl": worker_trl, "hfcb": worker_hfcb}[a.worker](a, res, save)
        res["done"] = True
        save()
        return 0
    except BaseException as e:  # what ran so far is saved; the orchestrator prints why
        res["error"] = "".join(traceback.format_exception(e))[-6000:]
        save()
        raise


if __name__ == "__main__":
    sys.exit(main())
