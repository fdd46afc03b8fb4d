"""Sampler efficiency: our batched sampler against plain `model.generate`, same batch.

Run: .venv/bin/python benchmarks/sampler_efficiency.py [--batch 8] [--new-tokens 64]

B chat prompts of different lengths (real refund_desk and search questions rendered with the
model's template), each continued by exactly N sampled tokens (no stop token, so both sides
produce B x N tokens), temperature 1.0, measured in one process after a warm-up, alternating
the two and keeping each side's best of --repeats:

  ours      `BatchedHFSampler.generate_batch`: left-padded prefill, one forward per decode
            step for the whole batch, per-request seeded sampling, log-probs kept;
  generate  `model.generate(do_sample=True)` on the same left-padded batch.

Prints tokens/s for both and the ratio ours / generate (1.0 = as fast as transformers'
own loop; our sampler also returns per-token log-probs and per-request seeds).
"""

from __future__ import annotations

import argparse
import time

import torch

from tracerl.envs import make
from tracerl.models import load
from tracerl.rollout import BatchedHFSampler
from tracerl.rollout.sampler import SampleRequest


def prompts(bundle, n: int) -> list[list[int]]:
    questions = [t["question"] for t in make("search").sample_tasks(n, split="train")]
    texts = [
        bundle.renderer.render_text(
            [{"role": "user", "content": q}], None, add_generation_prompt=True
        )
        for q in questions
    ]
    return [bundle.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    bundle = load(args.model)
    model = bundle.model.eval()
    batch = prompts(bundle, args.batch)
    sampler = BatchedHFSampler(model, temperature=1.0, seed=0, max_batch_size=args.batch)
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

    ours(4), generate(4)  # warm-up
    t_ours, t_gen = [], []
    for _ in range(args.repeats):
        t_ours.append(ours(args.new_tokens))
        t_gen.append(generate(args.new_tokens))
    n = args.batch * args.new_tokens
    lengths = sorted(len(p) for p in batch)
    print(
        f"{bundle.model_id}: {args.batch} prompts ({lengths[0]}-{lengths[-1]} tokens) x "
        f"{args.new_tokens} new tokens, fp32 CPU, best of {args.repeats}"
    )
    print(f"  ours     : {min(t_ours):6.2f} s  {n / min(t_ours):7.1f} tokens/s")
    print(f"  generate : {min(t_gen):6.2f} s  {n / min(t_gen):7.1f} tokens/s")
    print(f"  ours / generate (throughput): {min(t_gen) / min(t_ours):.2f}x")


if __name__ == "__main__":
    main()
