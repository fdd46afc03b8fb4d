"""Supervised fine-tuning on trajectories, with the same batches and masks as RL.

The loss is the mean negative log-likelihood of the policy tokens only — exactly the tokens
RL would train on (the loss mask from provenance): prompts, tool output, echoes and template
scaffolding never carry loss here either. Input: a run directory (optionally only its
successful, gradient-eligible episodes) or a trajectories JSONL(.gz) file.

The NLL is reported before the first update and after the last one, each measured by a
forward pass over all the data (no gradient); the per-epoch numbers are the training loss,
averaged while the weights moved, so with one epoch it is neither "before" nor "after".

Token ids mean something only to the tokenizer that made them: `check_fit` refuses
trajectories that the model to fine-tune would read with another vocabulary (their receipts
name the model that sampled them), before its weights load.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tracerl.errors import UserError
from tracerl.jsonl import read_trajectories
from tracerl.models.placement import device_of
from tracerl.rollout.persist import read_run_trajectories
from tracerl.train.batch import bucketed_batches
from tracerl.train.logprobs import token_logprobs
from tracerl.types import Trajectory


def sft_data(source: str | os.PathLike[str], *, successful_only: bool = True) -> list[Trajectory]:
    """Trajectories to imitate: with `successful_only`, the eligible ones whose recorded
    reward succeeded (total >= 1); trajectories without a recorded reward are refused."""
    path = Path(source)
    if path.is_dir():
        trajs = [t for _, t in read_run_trajectories(path)]
    else:
        trajs = read_trajectories(path)
    if not successful_only:
        return trajs
    unscored = [t for t in trajs if not t.reward]
    if unscored:
        raise ValueError(
            f"{path}: {len(unscored)} of {len(trajs)} trajectories carry no reward, so "
            "'successful' cannot be told apart from 'answered wrongly'; use a scored run "
            "(tracerl eval writes rewards) or imitate everything with --all"
        )
    # an episode's eligibility is its own receipt's, for its sub-agents' samples too
    own = {
        t.episode_id: (t.receipt or {}).get("gradient_eligible", True) for t in trajs if not t.agent
    }
    return [
        t
        for t in trajs
        if own.get(t.episode_id, (t.receipt or {}).get("gradient_eligible", True))
        and t.reward.get("total", 0) >= 1.0
    ]


class TokenizerMismatch(UserError, ValueError):
    """Trajectories whose token ids the model to fine-tune would read with another
    vocabulary: sampled by a model with another tokenizer, or holding ids beyond its
    embedding."""


def _other_model(spec: str, where: str, recorded: str, why: str) -> TokenizerMismatch:
    return TokenizerMismatch(
        f"{where}: its trajectories were sampled by {recorded!r}, {why}",
        f"fine-tune the model that sampled them (--model {recorded}), or sample new "
        f"episodes with {spec} and fine-tune on those",
    )


def check_fit(trajectories: Sequence[Trajectory], spec: str, where: object) -> list[str]:
    """Refuse (`TokenizerMismatch`) `trajectories` that model `spec` cannot be fine-tuned on:
    their receipts name a model whose tokenizer differs from `spec`'s, or a token id is
    beyond `spec`'s vocabulary. Only tokenizers load, no weights. Returns warnings: what
    could not be checked (trajectories without a receipt naming their model; a recorded
    model that cannot be loaded here, whose chat template is `spec`'s), or a chat template
    that differs although the vocabulary agrees. `where`: the data, for the messages."""
    from tracerl.models.refs import tokenizer_of, vocabulary_difference, vocabulary_size
    from tracerl.models.render import ChatRenderer

    tokenizer = tokenizer_of(spec)
    template = ChatRenderer(tokenizer).template_hash
    warnings: list[str] = []
    recorded: Counter[str | None] = Counter()
    templates: dict[str, set[str]] = {}
    for t in trajectories:
        receipt = t.receipt or {}
        model = receipt.get("model_id") or None
        recorded[model] += 1
        if model is not None and receipt.get("template_hash"):
            templates.setdefault(model, set()).add(str(receipt["template_hash"]))
    for model in sorted(m for m in recorded if m is not None):
        same_template = templates.get(model, {template}) == {template}
        if model == spec:
            continue
        try:
            other = tokenizer_of(model)
        except UserError as e:  # a folder or run not here, a served model's name...
            if not same_template:
                raise _other_model(
                    spec,
                    str(where),
                    model,
                    "which cannot be loaded here to compare tokenizers "
                    f"({e.message}), with another chat template than --model {spec!r}",
                ) from None
            warnings.append(
                f"{where}: its trajectories were sampled by {model!r}, which cannot be loaded "
                f"here to compare tokenizers; its chat template is that of --model {spec!r}, so "
                "their tokenizer is taken to be the same"
            )
            continue
        difference = vocabulary_difference(other, tokenizer)
        if difference is not None:
            raise _other_model(
                spec,
                str(where),
                model,
                f"whose tokenizer differs from that of --model {spec!r} ({difference})",
            )
        if not same_template:
            warnings.append(
                f"{where}: its trajectories were rendered with {model!r}'s chat template, "
                f"not that of --model {spec!r} (their tokenizer is the same): {spec} learns that "
                "format"
            )
    if recorded[None]:
        warnings.append(
            f"{where}: {recorded[None]} of {len(trajectories)} trajectories carry no receipt "
            "naming the model that sampled them: only that their token ids are within the "
            f"vocabulary of --model {spec!r} was checked"
        )
    size = vocabulary_size(spec, tokenizer)
    _check_ids(trajectories, size, f"{where}: ", f"the vocabulary of --model {spec!r}", spec)
    return warnings


def _check_ids(
    trajectories: Sequence[Trajectory], size: int, where: str, whose: str, spec: str | None
) -> None:
    """`TokenizerMismatch` at the first trajectory holding a token id >= `size`."""
    for t in trajectories:
        top = max(t.token_ids, default=-1)
        if top >= size:
            sampled = (t.receipt or {}).get("model_id")
            by = f" (sampled by {sampled!r})" if sampled else ""
            redo = f"sample new episodes with {spec}" if spec else "sample new episodes with it"
            raise TokenizerMismatch(
                f"{where}episode {t.episode_id or '?'}{by} holds token id {top}, beyond "
                f"{whose} ({size} ids)",
                "the trajectories were tokenized for another model: fine-tune the model that "
                f"sampled them, or {redo}",
            )


@dataclass(frozen=True)
class SFTResult:
    nll_before: float
    """Mean NLL per policy token over the data before the first update (forward pass only)."""
    nll_after: float
    """The same after the last update."""
    nll_epochs: list[float]
    """Each epoch's training loss: the mean NLL of its micro-batches, each taken just before
    its own update (so it lags the weights it ends with)."""


def _nll_sum(model: Any, b: Any) -> torch.Tensor:
    """The summed negative log-likelihood of a batch's loss-masked tokens."""
    lp = token_logprobs(model, b.input_ids_B_T, b.attention_mask_B_T, only_B_T=b.loss_mask_B_T)
    return -(lp * b.loss_mask_B_T).sum()


@torch.no_grad()
def mean_nll(model: Any, batches: Sequence[Any]) -> float:
    """Mean negative log-likelihood per loss-masked token over `batches`, without gradients."""
    total = sum(float(b.loss_mask_B_T.sum()) for b in batches)
    return sum(float(_nll_sum(model, b)) for b in batches) / total


def sft(
    model: Any,
    trajectories: Sequence[Trajectory],
    *,
    lr: float = 1e-5,
    epochs: int = 1,
    micro_batch_tokens: int = 4096,
    max_grad_norm: float = 1.0,
    progress: Any = None,
) -> SFTResult:
    """Train; returns the mean NLL over policy tokens before and after training, and the
    training loss of each epoch. `progress` (a `tracerl.report.progress` object) gets a
    phase with one tick per micro-batch."""
    if not trajectories:
        raise ValueError("sft: no trajectories to learn from (none successful?)")
    embedding = model.get_input_embeddings()
    if embedding is not None:  # an id beyond it would fail deep inside the forward pass
        _check_ids(
            trajectories, int(embedding.num_embeddings), "sft: ", "the model's vocabulary", None
        )
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, fused=True)
    device = device_of(model)
    batches = [
        b.to(device)
        for b in bucketed_batches(trajectories, [0.0] * len(trajectories), micro_batch_tokens)
    ]
    total = sum(float(b.loss_mask_B_T.sum()) for b in batches)
    if total == 0:
        raise ValueError("sft: the trajectories hold no policy tokens; nothing to imitate")
    before = mean_nll(model, batches)
    if progress is not None:
        progress.phase("SFT micro-batches", epochs * len(batches))
    history = []
    for _ in range(epochs):
        nll = 0.0
        for b in batches:  # one optimizer step per micro-batch
            optimizer.zero_grad(set_to_none=True)
            tokens = float(b.loss_mask_B_T.sum())
            if tokens == 0:
                continue
            loss = _nll_sum(model, b) / tokens
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            nll += loss.item() * tokens / total
            if progress is not None:
                progress.advance()
        history.append(nll)
    return SFTResult(nll_before=before, nll_after=mean_nll(model, batches), nll_epochs=history)
