"""Weight sync to a generation server the learner does not own (vLLM, SGLang, a second
`tracerl serve`): after every update the server must sample from the new weights, and every
token it samples must say which version it came from.

    WeightSync.push(model, version) -> the model name requests use from now on

* `LoraAdapterSync` (``trainer.rollout.weight_sync: lora``, needs ``model.lora``): writes the
  adapters (a few MB) to ``RUN/adapters/v<version>``, hot-loads them through the server's
  ``POST /v1/load_lora_adapter`` under the name ``<served model>-<tag>@v<version>`` (the
  tag is this process's: a server refuses a name it holds, and keeps the adapters of a run
  that crashed), unloads adapters older than the last `keep`, and deletes their folders.
  The rollout workers switch to the new name before the next episode or turn. The server answers
  requests for that name with the new weights and returns the name, so each result carries
  its version (`RemoteSampler`). The folder must be readable by the server at the same path
  (a shared file system when the server is on another machine).
* Full weights: pass ``trainer.rollout.weight_sync: package.module:factory``. The factory is
  called as ``factory(base_url=..., served_model=..., folder=...)`` and returns an object
  with this `push`; how full weights reach a server is the deployment's (vLLM's weight-update
  interfaces differ between versions and need a process group to the server), so it is a
  hook, not a built-in.

The server side of the LoRA protocol for `tracerl serve --enable-lora` is `load_adapter`:
one active adapter, swapped in place under the sampler's weights lock, so a turn is sampled
from one version, and the version named in the adapter is what the server reports.
"""

from __future__ import annotations

import importlib
import re
import shutil
import uuid
from pathlib import Path
from typing import Any, Protocol

from tracerl.rollout.endpoints import server_root


class WeightSync(Protocol):
    def push(self, model: Any, version: int) -> str | None:
        """Make the server sample from `model` (policy `version`); returns the model name
        requests must use from now on (None: unchanged)."""


def adapter_version(name: str) -> int | None:
    """The policy version in an adapter name ``<base>@v<version>``, if any."""
    m = re.search(r"@v(\d+)$", name)
    return int(m.group(1)) if m else None


class LoraAdapterSync:
    def __init__(
        self,
        base_url: str,
        served_model: str,
        folder: str | Path,
        *,
        keep: int = 2,
        timeout_s: float = 60.0,
        tag: str | None = None,
    ) -> None:
        self.base_url = server_root(base_url)  # .../v1 or the root, either way
        self.served_model = served_model
        self.folder = Path(folder)
        self.keep = max(1, keep)
        self.timeout_s = timeout_s
        # adapter names are unique to this process: a server keeps the adapters of a run
        # that crashed (or of another run), and refuses a name it already holds
        self.tag = tag or uuid.uuid4().hex[:8]
        self.loaded: list[tuple[str, Path]] = []

    def _post(self, route: str, body: dict[str, Any]) -> None:
        post(
            f"{self.base_url}{route}",
            body,
            self.timeout_s,
            missing_route="a vLLM server needs --enable-lora and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True, `tracerl serve` needs --enable-lora",
        )

    def push(self, model: Any, version: int) -> str:
        from tracerl.models.lora import is_lora

        if not is_lora(model):
            raise ValueError(
                "trainer.rollout.weight_sync=lora needs LoRA adapters (set model.lora); "
                "full weights need a weight_sync hook of your own (package.module:factory)"
            )
        name = f"{self.served_model}-{self.tag}@v{version}"
        path = (self.folder / f"v{version}").resolve()
        model.save_pretrained(path)
        self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": str(path)})
        self.loaded.append((name, path))
        while len(self.loaded) > self.keep:
            old, old_path = self.loaded.pop(0)
            self._post("/v1/unload_lora_adapter", {"lora_name": old})
            shutil.rmtree(old_path, ignore_errors=True)
        return name


def post(
    url: str, body: dict[str, Any] | None, timeout_s: float, *, missing_route: str = ""
) -> None:
    """POST `body` as JSON for a weight sync: a server that cannot be reached or answers
    anything but HTTP 200 is a `RuntimeError` naming the URL; a 404 that names no adapter
    (the route itself is missing) says `missing_route`, what the server must be started with."""
    import httpx

    try:
        r = httpx.post(url, json=body, timeout=timeout_s)
    except httpx.HTTPError as e:
        raise RuntimeError(f"weight sync: {url} unreachable: {type(e).__name__}: {e}") from e
    if r.status_code == 404 and missing_route and "adapter" not in r.text:
        raise RuntimeError(
            f"weight sync: {url} answered HTTP 404 ({r.text[:200]}): {missing_route}"
        )
    if r.status_code != 200:
        raise RuntimeError(f"weight sync: {url} answered HTTP {r.status_code}: {r.text[:300]}")


def weight_sync_from_config(
    spec: str, *, base_url: str, served_model: str, folder: str | Path
) -> WeightSync:
    """``lora`` or ``package.module:factory`` (see the module docstring)."""
    if spec == "lora":
        return LoraAdapterSync(base_url, served_model, folder)
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(
            f"trainer.rollout.weight_sync={spec!r}: expected 'lora' or 'package.module:factory'"
        )
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"trainer.rollout.weight_sync={spec!r}: cannot load it: {e}") from e
    return factory(base_url=base_url, served_model=served_model, folder=Path(folder))


def load_adapter(sampler: Any, path: str | Path, name: str) -> int:
    """Serve the LoRA adapter at `path` (a `save_pretrained` folder) from `sampler`'s model,
    in place of the one before; returns the policy version the server now reports (the one
    in `name`, else one more than before). Taken under the sampler's weights lock."""
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load_file

    from tracerl.models.lora import is_lora

    path = Path(path)
    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        raise ValueError(f"{path}: no adapter_model.safetensors (a peft save_pretrained folder)")
    version = adapter_version(name)
    with sampler._model_lock:
        model = sampler.model
        if is_lora(model):
            set_peft_model_state_dict(model, load_file(str(weights)))
        else:
            sampler.model = PeftModel.from_pretrained(model, str(path)).eval()
        sampler.policy_version = sampler.policy_version + 1 if version is None else version
        return sampler.policy_version
