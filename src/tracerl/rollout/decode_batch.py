"""How a running batch keeps its key/value cache while rows leave it and new rows join it.

`BatchedHFSampler` decodes one token per running row per step; between steps finished rows
leave and newly arrived turns join (continuous batching). Two ways to hold the rows' keys
and values, chosen by ``model.kv_cache``:

- `GrowingBatch` (``dynamic``, the default): transformers' `DynamicCache`, one growing
  tensor per layer holding only the running rows. A finished row is cut out
  (``batch_select_indices``); joining rows are prefilled and both sides left-padded to one
  length. Each step's shapes differ, so nothing can be captured once and replayed.
- `SlotBatch` (``static``): transformers' `StaticCache`, `max_batch_size` slots of `length`
  positions allocated once per size and reused batch after batch (their addresses never
  change). Every step feeds all slots one token at the same write position, so its shapes
  never change: with ``model.compile`` the step is ``torch.compile``'d with
  ``mode="reduce-overhead"`` (CUDA graphs on a GPU: one launch per step instead of one per
  kernel). A finished row's slot is reused by the next row that joins. A joining row's
  prompt is prefilled alone, then its keys and values are copied into a free slot so that
  they end at the current write position (positions before it, stale, are masked out); so
  a row joins once the write position has reached its prompt's length and while its
  ``max_tokens`` still fit in the slot. Every slot, with a row or not, sees at least its own
  position, so nothing in the cache is ever NaN (a NaN, even masked, would poison a slot's
  next row: masked weights are 0, and 0 x NaN is NaN).

Both give each row the tokens it would draw alone (its own positions, its own keys and
values; masked positions have weight exactly 0), up to the floating-point noise of batched
kernels.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger(__name__)

SLOT_LENGTH_STEP = 256
"""A static cache's length is the batch's longest need (prompt + ``max_tokens``) rounded up
to a multiple of this, so a compiled step is captured for few lengths."""


class GrowingBatch:
    """The running rows in transformers' growing `DynamicCache`."""

    def __init__(self, sampler: Any, dev: Any) -> None:
        self.sampler = sampler
        self.dev = dev
        self.cache: Any = None
        self.mask_R_T: Any = None
        self.pos_R: Any = None
        self.joinable = False

    def start(self, requests: Sequence[Any]) -> Any:
        """Prefill `requests` as the batch's rows; their next-token logits."""
        logits_R_V, self.cache, self.mask_R_T, self.pos_R = self.sampler._prefill(
            requests, self.dev
        )
        self.joinable = _mergeable(self.cache)  # its kind never changes within a batch
        return logits_R_V

    def fits(self, request: Any) -> bool:
        return self.joinable

    def row_cache(self, i: int) -> list[tuple[Any, Any]] | None:
        """Row `i`'s keys and values at its real positions (a copy: per layer [heads,
        positions, head_dim]), for its episode's next turn; None for a cache rows cannot
        join (its kept keys and values could not be merged back either)."""
        if not self.joinable:
            return None
        real_N = self.mask_R_T[i].nonzero()[:, 0]  # one host sync for the row, not per layer
        return [
            (ly.keys[i].index_select(1, real_N), ly.values[i].index_select(1, real_N))
            for ly in self.cache.layers
        ]

    def keep(self, keep: list[int], index_R: Any) -> None:
        """Only the rows at `keep` (`index_R`: the same on the device) go on."""
        self.cache.batch_select_indices(index_R)
        self.mask_R_T, self.pos_R = self.mask_R_T[index_R], self.pos_R[index_R]

    def step(self, next_R: Any) -> Any:
        """Feed each row its token; the next logits."""
        import torch

        mask = self.mask_R_T
        self.mask_R_T = mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=-1)
        logits_R_V, self.cache = self.sampler._forward(
            next_R[:, None], mask, self.pos_R[:, None], self.cache, self.dev
        )
        self.pos_R = self.pos_R + 1
        return logits_R_V

    def join(self, requests: Sequence[Any], logits_R_V: Any) -> Any:
        """Prefill `requests` and add them after the running rows; all rows' logits."""
        new = self.sampler._prefill(requests, self.dev)
        logits_R_V, self.cache, self.mask_R_T, self.pos_R = _merge(
            (logits_R_V, self.cache, self.mask_R_T, self.pos_R), new
        )
        return logits_R_V


class StaticSlots:
    """`batch` slots of `length` positions of keys and values (transformers' `StaticCache`)
    with the buffers a decode step reads (token, position, mask per slot), all allocated
    once on the model's device and kept at the same addresses, so one captured step can be
    replayed; reused by every batch that fits."""

    def __init__(self, model: Any, batch: int, length: int, dev: Any, pad: int) -> None:
        import torch
        from transformers import StaticCache

        self.batch, self.length, self.dev = batch, length, dev
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.ids_S = torch.full((batch, 1), pad, dtype=torch.long, device=dev)
        self.pos_S = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        self.mask_S_L = torch.zeros((batch, length), dtype=torch.long, device=dev)
        self.written = 0  # the next write position, shared by every slot (a host int)

    @staticmethod
    def supported(model: Any) -> str | None:
        """Why `model` cannot decode from static slots (None: it can)."""
        from transformers import StaticCache
        from transformers.cache_utils import StaticLayer

        try:
            layers = StaticCache(config=model.config, max_cache_len=1).layers
        except Exception as exc:  # a config transformers cannot size a cache for
            return f"transformers cannot build a StaticCache for it ({exc})"
        if not layers or any(type(layer) is not StaticLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers})
            return f"its layers are not all full attention ({', '.join(kinds)})"
        return None

    @staticmethod
    def compile_unsafe(device: Any) -> str | None:
        """Why a compiled decode step must not run on `device` with this torch (None: it
        may). torch 2.11 on a CPU: a step compiled (inductor) and run in the sampler's worker
        thread, then the learner's backward in the main thread, ends the process with a
        segmentation fault (reproduced with PyPI's torch 2.11.0, not with 2.13.0; on a GPU
        not yet known). Older releases are untested there: the same answer."""
        import torch

        if getattr(device, "type", None) != "cpu":
            return None
        release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if release < (2, 13):
            return (
                f"torch {torch.__version__} on a CPU crashes (a segmentation fault) in the "
                "learner's backward after a decode step compiled in the sampler's thread; "
                "torch 2.13 or newer does not"
            )
        return None

    def reset(self, written: int) -> None:
        """A new batch: the write position goes back to `written` (its prompts' width)."""
        self.written = written
        self.mask_S_L.zero_()
        self._set_write_position(written)

    def _set_write_position(self, written: int) -> None:
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.cumulative_length.fill_(written)

    def place(self, slots_J: Any, prefill_cache: Any, mask_J_W: Any, pos_J: Any) -> None:
        """Copy prefilled rows (left-padded to width W) into `slots_J` so that their keys and
        values end at the write position; everything before them in those slots is masked."""
        c, width = self.written, mask_J_W.shape[1]
        for slot_layer, layer in zip(self.cache.layers, prefill_cache.layers, strict=True):
            if not slot_layer.is_initialized:  # allocated at the dtype the model computes in
                k, v = layer.keys, layer.values
                slot_layer.lazy_initialization(
                    k.new_empty((self.batch, k.shape[1], 1, k.shape[-1])),
                    v.new_empty((self.batch, v.shape[1], 1, v.shape[-1])),
                )
                slot_layer.cumulative_length.fill_(c)
            slot_layer.keys[slots_J, :, c - width : c] = layer.keys.to(slot_layer.keys.dtype)
            slot_layer.values[slots_J, :, c - width : c] = layer.values.to(slot_layer.values.dtype)
        self.mask_S_L[slots_J] = 0
        self.mask_S_L[slots_J, c - width : c] = mask_J_W
        self.pos_S[slots_J, 0] = pos_J

    def step(self, slots_R: Any, next_R: Any, forward: Callable[..., Any]) -> Any:
        """Every slot decodes one token at the write position: the running rows (in
        `slots_R`) their `next_R`; a free slot computes on whatever it holds (its output is
        not used, and every key and value it writes is finite: each slot sees at least its
        own position). The logits of every slot (the caller picks its rows')."""
        c = self.written
        self.ids_S[slots_R, 0] = next_R
        self.mask_S_L[:, c] = 1
        logits_S_V = forward(self.ids_S, self.mask_S_L, self.pos_S, self.cache, c)
        self.pos_S[slots_R] += 1
        self.written = c + 1
        return logits_S_V


class SlotBatch:
    """The running rows in `StaticSlots`, one slot each (``model.kv_cache: static``)."""

    def __init__(self, sampler: Any, dev: Any) -> None:
        self.sampler = sampler
        self.dev = dev
        self.slots_R: list[int] = []  # each running row's slot, in row order
        self.slots: StaticSlots | None = None
        self._slots_dev: Any = None

    def _index(self) -> Any:
        import torch

        if self._slots_dev is None:
            self._slots_dev = torch.tensor(self.slots_R, device=self.dev)
        return self._slots_dev

    def _free(self) -> list[int]:
        taken = set(self.slots_R)
        assert self.slots is not None
        return [s for s in range(self.slots.batch) if s not in taken]

    def start(self, requests: Sequence[Any]) -> Any:
        width = max(len(r.prompt_ids) for r in requests)
        # every row's keys end at the widest prompt's, so each has `width` + its max_tokens
        need = width + max(r.max_tokens for r in requests)
        self.slots = self.sampler._static_slots(need, len(requests), self.dev)
        self.slots.reset(width)
        self.slots_R = []
        return self._place(requests)

    def _place(self, requests: Sequence[Any]) -> Any:
        import torch

        assert self.slots is not None
        logits_J_V, cache, mask_J_W, pos_J = self.sampler._prefill(requests, self.dev)
        free = self._free()[: len(requests)]
        assert len(free) == len(requests), "more rows than free slots"
        self.slots.place(torch.tensor(free, device=self.dev), cache, mask_J_W, pos_J)
        self.slots_R += free
        self._slots_dev = None
        return logits_J_V

    def row_cache(self, i: int) -> None:
        """Static slots keep nothing for a next turn (their rows are placed by their
        prompts' width, which a kept prefix's layout would exceed)."""
        return None

    def fits(self, request: Any) -> bool:
        s = self.slots
        assert s is not None
        return len(request.prompt_ids) <= s.written and s.written + request.max_tokens <= s.length

    def keep(self, keep: list[int], index_R: Any) -> None:
        """Only the rows at `keep` go on; the others' slots are free for rows to join."""
        self.slots_R = [self.slots_R[i] for i in keep]
        self._slots_dev = None

    def step(self, next_R: Any) -> Any:
        assert self.slots is not None
        slots_R = self._index()
        return self.slots.step(slots_R, next_R, self.sampler._slot_forward)[slots_R]

    def join(self, requests: Sequence[Any], logits_R_V: Any) -> Any:
        import torch

        return torch.cat([logits_R_V, self._place(requests)])


def _mergeable(cache: Any) -> bool:
    """Can rows join `cache` mid-batch? Its layers must be plain growing key/value tensors
    (transformers' `DynamicLayer`: full attention); a sliding-window or quantized cache
    keeps static batching."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _merge(running: tuple[Any, Any, Any, Any], joining: tuple[Any, Any, Any, Any]) -> tuple:
    """The running batch and the rows joining it as one batch: both left-padded to the longer
    one's length (padding keys and values are zeros, masked out; each row keeps its own
    positions, so its tokens see exactly what they saw before), then stacked."""
    import torch

    logits_a, cache_a, mask_a, pos_a = running
    logits_b, cache_b, mask_b, pos_b = joining
    width = max(mask_a.shape[1], mask_b.shape[1])

    def left(x: Any, dim: int) -> Any:
        missing = width - x.shape[dim]
        if missing == 0:
            return x
        shape = list(x.shape)
        shape[dim] = missing
        return torch.cat([x.new_zeros(shape), x], dim=dim)

    for a, b in zip(cache_a.layers, cache_b.layers, strict=True):
        a.keys = torch.cat([left(a.keys, -2), left(b.keys, -2)], dim=0)
        a.values = torch.cat([left(a.values, -2), left(b.values, -2)], dim=0)
    mask = torch.cat([left(mask_a, 1), left(mask_b, 1)], dim=0)
    return torch.cat([logits_a, logits_b]), cache_a, mask, torch.cat([pos_a, pos_b])


def slot_length(need: int) -> int:
    """The static cache length for a batch that needs `need` positions."""
    return -(-need // SLOT_LENGTH_STEP) * SLOT_LENGTH_STEP
