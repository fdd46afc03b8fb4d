"""Keys and values an episode's last turn computed, kept for its next turn (prefix caching).

A multi-turn episode's next prompt is its last prompt, the tokens it sampled, the tool's
answer and the chat template's scaffolding: everything up to the sampled tokens was already
run through the model, and a causal model's keys and values at a position depend only on the
tokens up to it. `BatchedHFSampler` (with the dynamic cache) keeps each finished row's keys
and values here under its episode; the episode's next turn takes them back and prefills only
what follows the longest common prefix of the kept tokens and its new prompt. So a turn costs
its new tokens, not its whole conversation: on a CPU, prefilling 8 rows of 1,200 tokens of
SmolLM2-135M takes as long as 85 decode steps (docs/rollout.md has the figures).

Exactness: the kept keys and values are the ones the model computed for exactly those tokens
at exactly those positions, so the next turn sees what a full prefill would compute, up to
the floating-point noise of a different kernel order (as with batching). A prompt that is not
an extension (a compacted context, a stripped reasoning block) reuses only the common prefix.

Staleness: keys and values belong to the weights that made them. Every entry is stamped with
the weights' version (the sampler's ``policy_version`` and the weights lock's count of
writers); a lookup under any other version empties the store first. tracerl's loops bump
``policy_version`` with every update, and every writer of the weights that shares the lock
(an async learner, a weight sync) bumps the lock's count.

Memory: at most ``max_bytes`` (``model.prefix_cache_gb``; ``auto``: a tenth of a GPU's memory,
1 GiB on a CPU), least recently stored first out;
an entry is taken (removed) by the turn that uses it, which stores its own when it ends, and
dropped when its episode ends (`forget`: the rollout runner tells the sampler), so between
steps, while the learner updates, the store holds nothing.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

AUTO_CPU_GIB = 1.0
"""``prefix_cache_gb: auto`` off a GPU: 1 GiB (about 45k tokens of SmolLM2-135M in fp32)."""
AUTO_GPU_SHARE = 0.10
"""``prefix_cache_gb: auto`` on a CUDA device: this share of the device's memory (14 GiB of an
H200, 8 of an 80 GB H100: about 70k and 40k tokens of a 1.7B model's bf16 keys and values,
192 KiB a token). A share of the whole card, not of what is free when the sampler is made:
the optimizer's state is allocated later, at the first update."""

Kept = tuple[int, list[tuple[Any, Any]]]
"""A prompt's kept prefix: its length n and per layer keys and values [heads, n, head_dim]."""


@dataclass
class PrefixStats:
    """What the store saved, for `BatchStats` and the benchmarks."""

    hits: int = 0
    """Turns that prefilled after a kept prefix."""
    reused_tokens: int = 0
    """Prompt tokens not prefilled again."""
    stored: int = 0
    evicted: int = 0
    """Entries dropped to stay under the memory cap."""
    cleared: int = 0
    """Times the weights changed and the store was emptied."""


@dataclass
class Entry:
    tokens: tuple[int, ...]
    """The tokens the keys and values are of (a turn's prompt and its sampled tokens but the
    last, which was never fed)."""
    layers: list[tuple[Any, Any]]
    """Per layer, keys and values of shape [heads, len(tokens), head_dim]."""
    nbytes: int


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def store_bytes(setting: float | str, device: Any) -> int:
    """The store's cap in bytes for ``model.prefix_cache_gb`` (GiB, 0: off, or ``auto``) on
    `device` (a `torch.device`): ``auto`` is `AUTO_GPU_SHARE` of a CUDA device's memory and
    `AUTO_CPU_GIB` elsewhere."""
    if setting == "auto":
        if getattr(device, "type", None) == "cuda":
            import torch

            total = torch.cuda.get_device_properties(device).total_memory
            return int(total * AUTO_GPU_SHARE)
        return int(AUTO_CPU_GIB * 2**30)
    if isinstance(setting, str) or setting < 0:
        raise ValueError(f"prefix_cache_gb must be 'auto' or GiB >= 0 (0: off), got {setting!r}")
    return int(setting * 2**30)


class PrefixStore:
    """Kept keys and values by episode, under one weights version, within a memory cap."""

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.version: Hashable = None
        self.bytes = 0
        self.stats = PrefixStats()
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._lock = threading.Lock()  # batches store and take in a worker thread

    def __len__(self) -> int:
        return len(self._entries)

    def _at(self, version: Hashable) -> None:
        if version != self.version:
            if self._entries:
                self.stats.cleared += 1
            self._entries.clear()
            self.bytes = 0
            self.version = version

    def take(self, key: Hashable, prompt: Sequence[int], version: Hashable) -> Kept | None:
        """The kept keys and values `prompt` can start from: ``(n, layers)``, the first `n`
        positions (at most all but the prompt's last token: a forward needs one token to
        give the next logits), or None. The entry is removed either way."""
        with self._lock:
            self._at(version)
            entry = self._entries.pop(key, None)
            if entry is None:
                return None
            self.bytes -= entry.nbytes
        n = min(common_prefix(entry.tokens, prompt), len(prompt) - 1)
        if n <= 0:
            return None
        return n, [(k[:, :n], v[:, :n]) for k, v in entry.layers]

    def put(
        self, key: Hashable, tokens: Sequence[int], layers: list[tuple[Any, Any]], version: Hashable
    ) -> None:
        """Keep `layers` (per layer keys and values [heads, len(tokens), head_dim]) for
        `key`'s next turn, dropping the oldest entries while over the cap."""
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        with self._lock:
            self._at(version)
            self._drop(key)
            if nbytes > self.max_bytes:
                return
            while self._entries and self.bytes + nbytes > self.max_bytes:
                _, dropped = self._entries.popitem(last=False)
                self.bytes -= dropped.nbytes
                self.stats.evicted += 1
            self._entries[key] = Entry(tuple(tokens), layers, nbytes)
            self.bytes += nbytes
            self.stats.stored += 1

    def take_for(
        self,
        episodes: Sequence[Hashable | None],
        which: Sequence[int],
        prompts: Sequence[Sequence[int]],
        version: Hashable,
    ) -> list[Kept | None]:
        """Per distinct prompt (`prompts`; request i asks for ``prompts[which[i]]`` for
        episode ``episodes[i]``), the longest kept prefix one of its requests' episodes left,
        or None; each request's entry is taken either way."""
        kept: list[Kept | None] = [None] * len(prompts)
        for episode, u in zip(episodes, which, strict=True):
            if episode is None:
                continue
            got, best = self.take(episode, prompts[u], version), kept[u]
            if got is not None and (best is None or got[0] > best[0]):
                kept[u] = got
        for got in kept:
            if got is not None:
                self.stats.hits += 1
                self.stats.reused_tokens += got[0]
        return kept

    def forget(self, key: Hashable) -> None:
        """Drop `key`'s entry (its episode ended: no turn will take it)."""
        with self._lock:
            self._drop(key)

    def _drop(self, key: Hashable) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes


def kept_cache(config: Any, kept: Sequence[Kept | None]) -> tuple[Any, Any]:
    """A transformers `DynamicCache` holding each row's kept positions right-aligned in the
    longest kept length C (zeros before them), and the rows' mask over those C columns (on
    the CPU; the rows without a kept prefix: all zeros)."""
    import torch
    from transformers import DynamicCache

    n_U = [got[0] if got is not None else 0 for got in kept]
    c = max(n_U)
    mask_U_C = torch.zeros((len(kept), c), dtype=torch.long)
    for u, n in enumerate(n_U):
        mask_U_C[u, c - n :] = 1
    layers_of = [got[1] for got in kept if got is not None]
    cache = DynamicCache(config=config)
    for li, layer in enumerate(cache.layers):
        k0, v0 = layers_of[0][li]
        keys = k0.new_zeros((len(kept), k0.shape[0], c, k0.shape[-1]))
        values = v0.new_zeros((len(kept), v0.shape[0], c, v0.shape[-1]))
        for u, got in enumerate(kept):
            if got is not None:
                keys[u, :, c - got[0] :] = got[1][li][0]
                values[u, :, c - got[0] :] = got[1][li][1]
        layer.update(keys, values)
    return cache, mask_U_C
