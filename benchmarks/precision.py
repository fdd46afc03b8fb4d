"""What each precision does to the sampler-learner log-prob gap, and what it costs.

Run: .venv/bin/python benchmarks/precision.py [--models tiny-random smollm2-135m-instruct]
     [--device auto] [--samples 4] [--tokens 32]

For each model and each `trainer.precision` (fp32, bf16-mixed, bf16), on `--device`
(`model.device`: auto is the GPU when there is one): the model is placed as a run places it
(`tracerl.models.placement`), `BatchedHFSampler` samples `--samples` seeded continuations of
one prompt (token by token, on its KV cache), and the learner's `token_logprobs` recomputes
the log-probs of the same tokens with one full forward. Printed per precision: the mean and
max absolute gap over every sampled token (docs/gpu.md states the tolerance this measures),
the bytes the weights take, and the sampling and recomputation times (after a warm-up; a
CPU's bf16 matmul is several times slower than its fp32: the CPU default stays fp32).
"""

from __future__ import annotations

import argparse
import copy
import time

import torch

from tracerl.models import load
from tracerl.models.placement import device_of, place, resolve
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.sampler import SampleRequest
from tracerl.train import token_logprobs

PROMPT = "What is 12 + 7? Answer in one short sentence."


def measure(bundle, device: str, precision: str, samples: int, tokens: int) -> dict:
    model = place(copy.deepcopy(bundle.model), resolve(device, "auto", precision))
    prompt = bundle.tokenizer.encode(PROMPT)
    requests = [SampleRequest(prompt, tokens, [], seed=s) for s in range(samples)]
    sampler = BatchedHFSampler(model, temperature=1.0, seed=0)
    sampler.generate_batch(requests[:1])  # warm-up
    t0 = time.perf_counter()
    results = sampler.generate_batch(requests)
    sample_s = time.perf_counter() - t0
    gaps, recompute_s = [], 0.0
    for r in results:
        ids = torch.tensor([prompt + r.token_ids], device=device_of(model))
        t0 = time.perf_counter()
        with torch.no_grad():
            lp = token_logprobs(model, ids, torch.ones_like(ids))[0, len(prompt) :].float().cpu()
        recompute_s += time.perf_counter() - t0
        gaps.append((lp - torch.tensor(r.logprobs)).abs())
    gap = torch.cat(gaps)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "gap_mean": float(gap.mean()),
        "gap_max": float(gap.max()),
        "weights_mb": weights / 1e6,
        "sample_s": sample_s,
        "recompute_s": recompute_s,
        "tokens": int(gap.numel()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m-instruct"])
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    print(f"device {resolve(args.device).device}, {args.samples} x {args.tokens} sampled tokens")
    print(
        f"{'model':24} {'precision':10} {'gap mean':>9} {'gap max':>9} {'weights':>10} "
        f"{'sample s':>9} {'recompute s':>12}"
    )
    for spec in args.models:
        bundle = load(spec)
        for precision in ("fp32", "bf16-mixed", "bf16"):
            m = measure(bundle, args.device, precision, args.samples, args.tokens)
            print(
                f"{spec:24} {precision:10} {m['gap_mean']:9.2e} {m['gap_max']:9.2e} "
                f"{m['weights_mb']:8.1f}MB {m['sample_s']:9.2f} {m['recompute_s']:12.2f}"
            )


if __name__ == "__main__":
    main()
