"""Learner efficiency: forward+backward tokens/s against this machine's fp32 matmul rate.

Run: .venv/bin/python benchmarks/learner_efficiency.py [--batch 8] [--tokens 512] [--compile]

Measured in one process:

  matmul    the machine's fp32 GEMM rate: square matmuls of the model's shapes' order
            (the best of several sizes), in FLOP/s;
  learner   one PPO loss forward + backward on B x T tokens through our learner's path
            (`token_logprobs`: decoder, chunked LM head, log-softmax, gather; then `ppo_clip`),
            median of --repeats after a warm-up; model FLOPs = 6 x parameters x tokens
            (+ the attention's 12 x layers x hidden x T per token), as in the PaLM appendix.

The headline is the fraction: achieved model FLOP/s over the matmul rate (the "MFU" against
what this CPU's GEMM actually reaches, not a datasheet peak). With --compile the decoder runs
under `torch.compile` (the learner's `compile: true`); with --gradient-checkpointing the
decoder layers recompute their activations in backward (less memory, more FLOPs executed
than counted).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tracerl.algos.losses import ClipConfig, PolicyLossInput, ppo_clip
from tracerl.models import load
from tracerl.train.logprobs import token_logprobs


def matmul_rate(seconds: float = 2.0) -> float:
    """Best fp32 GEMM FLOP/s over a few square sizes."""
    best = 0.0
    for n in (512, 1024, 2048):
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds / 3:
            a @ b
            reps += 1
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0))
    return best


def model_flops(model, tokens: int, seq: int) -> float:
    cfg = model.config
    params = sum(p.numel() for p in model.parameters())
    attention = 12 * cfg.num_hidden_layers * cfg.hidden_size * seq
    return (6 * params + attention) * tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    args = ap.parse_args()

    bundle = load(args.model)
    model = bundle.model.train()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    body = torch.compile(model.get_decoder(), dynamic=True) if args.compile else None
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.tokens), generator=g)
    mask = torch.ones_like(ids)
    loss_mask = torch.ones_like(ids, dtype=torch.float32)
    loss_mask[:, : args.tokens // 4] = 0  # a prompt that carries no loss
    adv = torch.randn(args.batch, generator=g)

    def step() -> float:
        t0 = time.perf_counter()
        lp = token_logprobs(model, ids, mask, body=body)
        loss, _ = ppo_clip(PolicyLossInput(lp, lp.detach(), adv, loss_mask), ClipConfig())
        loss.backward()
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    rate = matmul_rate()
    warm = step()  # includes compilation with --compile
    times = [step() for _ in range(args.repeats)]
    t = statistics.median(times)
    n = args.batch * args.tokens
    achieved = model_flops(model, n, args.tokens) / t
    mode = "compiled" if args.compile else "eager"
    if args.gradient_checkpointing:
        mode += " + gradient checkpointing"
    print(
        f"{bundle.model_id}: forward+backward on {args.batch} x {args.tokens} tokens, fp32, {mode}"
    )
    print(f"  fp32 matmul rate   : {rate / 1e9:7.1f} GFLOP/s  (best square GEMM, this run)")
    print(
        f"  first step         : {warm:7.2f} s  (warm-up{', compilation' if args.compile else ''})"
    )
    print(f"  step (median of {len(times)}) : {t:7.2f} s  {n / t:7.1f} tokens/s")
    print(f"  model FLOP/s       : {achieved / 1e9:7.1f} GFLOP/s")
    print(f"  fraction of matmul : {achieved / rate:7.2f}")


if __name__ == "__main__":
    main()
