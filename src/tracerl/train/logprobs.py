"""Per-token log-probs of a causal LM without a ``[batch, tokens, vocab]`` log-softmax.

SmolLM2's vocabulary has 49,152 entries: for 8 x 512 tokens the full fp32 log-softmax alone
is 800 MB (and its gradient as much again). Instead the model's final hidden states are
computed once, and the LM head, log-softmax and gather run over chunks of tokens; autograd
keeps only one chunk's logits alive at a time (each chunk is checkpointed).

The log-prob at position t is of token t given tokens < t (position 0 gets 0), at the given
temperature — the sampler's, so learner and sampler log-probs are comparable.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from tracerl.models.placement import check_device, computing


def _head_logprobs(
    hidden_N_H: torch.Tensor, targets_N: torch.Tensor, head: Any, temperature: float
) -> torch.Tensor:
    logits_N_V = head(hidden_N_H).float() / temperature
    return torch.log_softmax(logits_N_V, dim=-1).gather(-1, targets_N[:, None])[:, 0]


def token_logprobs(
    model: Any,
    input_ids_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    body: Any = None,
    only_B_T: torch.Tensor | None = None,
    prefix_len: int = 0,
) -> torch.Tensor:
    """``logprobs_B_T``: log p(token_t | tokens_<t), 0 at t = 0 and on padding. `body`
    replaces the model's decoder (a `torch.compile`d one). With `only_B_T` (the loss mask),
    the LM head runs only at the positions it marks (0 elsewhere): the head is a fifth of a
    135M model's FLOPs, and prompts and tool output need none of it. With `prefix_len` (every
    row starts with the same `prefix_len` tokens, e.g. a group's prompt) the decoder runs the
    prefix once and the rows' continuations on its KV cache, repeated per row: the same
    values and gradients (the cache is differentiable) for a fraction of the FLOPs.

    The inputs must be on the model's device (`DeviceMismatch`, naming the tensor, if not);
    the forward runs in the model's compute precision (`tracerl.models.placement.computing`:
    bf16 autocast over fp32 master weights under ``bf16-mixed``), the log-softmax in fp32."""
    check_device(
        model,
        "token_logprobs",
        input_ids_B_T=input_ids_B_T,
        attention_mask_B_T=attention_mask_B_T,
        only_B_T=only_B_T,
    )
    with computing(model):
        return _token_logprobs(
            model,
            input_ids_B_T,
            attention_mask_B_T,
            temperature,
            chunk_tokens,
            body,
            only_B_T,
            prefix_len,
        )


def _token_logprobs(
    model: Any,
    input_ids_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    temperature: float,
    chunk_tokens: int,
    body: Any,
    only_B_T: torch.Tensor | None,
    prefix_len: int,
) -> torch.Tensor:
    body = body if body is not None else model.get_decoder()
    head = model.get_output_embeddings()
    if 0 < prefix_len < input_ids_B_T.shape[1]:
        hidden_B_T_H = _shared_prefix_hidden(
            model, body, input_ids_B_T, attention_mask_B_T, prefix_len
        )
    else:
        hidden_B_T_H = body(input_ids=input_ids_B_T, attention_mask=attention_mask_B_T)[0]
    b, t = hidden_B_T_H.shape[:2]
    need_B_T = attention_mask_B_T[:, 1:].bool()  # predicts positions 1..T-1
    if only_B_T is not None:
        need_B_T = need_B_T & only_B_T[:, 1:].bool()
    hidden_N_H = hidden_B_T_H[:, :-1][need_B_T]
    targets_N = input_ids_B_T[:, 1:][need_B_T]
    pieces = []
    for start in range(0, hidden_N_H.shape[0], chunk_tokens):
        sl = slice(start, start + chunk_tokens)
        if torch.is_grad_enabled():
            piece = checkpoint(
                _head_logprobs,
                hidden_N_H[sl],
                targets_N[sl],
                head,
                temperature,
                use_reentrant=False,
            )
        else:
            piece = _head_logprobs(hidden_N_H[sl], targets_N[sl], head, temperature)
        pieces.append(piece)
    values_N = torch.cat(pieces) if pieces else hidden_N_H.new_zeros(0, dtype=torch.float32)
    rows_N, cols_N = torch.nonzero(need_B_T, as_tuple=True)
    out_B_T = torch.zeros(b, t, dtype=values_N.dtype, device=values_N.device)
    return out_B_T.index_put((rows_N, cols_N + 1), values_N)  # differentiable in values_N


def _shared_prefix_hidden(
    model: Any,
    body: Any,
    input_ids_B_T: torch.Tensor,
    attention_mask_B_T: torch.Tensor,
    prefix_len: int,
) -> torch.Tensor:
    """The decoder's hidden states, running the shared prefix once (see `token_logprobs`)."""
    from tracerl.rollout.sampler import _cache_keyword

    b, t = input_ids_B_T.shape
    kw = _cache_keyword(model)
    prefix = body(
        input_ids=input_ids_B_T[:1, :prefix_len],
        attention_mask=attention_mask_B_T[:1, :prefix_len],
        use_cache=True,
    )
    cache = getattr(prefix, kw)
    cache.batch_repeat_interleave(b)  # differentiable: gradients flow back into the prefix
    positions = torch.arange(prefix_len, t, device=input_ids_B_T.device).expand(b, -1)
    rest = body(
        input_ids=input_ids_B_T[:, prefix_len:],
        attention_mask=attention_mask_B_T,
        position_ids=positions,
        use_cache=True,
        **{kw: cache},
    )
    head_B_P_H = prefix[0].expand(b, -1, -1)
    return torch.cat([head_B_P_H, rest[0]], dim=1)
