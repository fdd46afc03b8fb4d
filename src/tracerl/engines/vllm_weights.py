"""Full fine-tuning's weight sync to a vLLM server this process owns (LoRA's is
`tracerl.rollout.weight_sync.LoraAdapterSync`):

    FullWeightSync  the learner's weights written as safetensors and reloaded in place
                    (``/collective_rpc reload_weights``)
    IpcWeightSync   the same through CUDA IPC on a GPU (``model.vllm.weight_sync: ipc``)
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracerl.rollout.weight_sync import post


class FullWeightSync:
    """Full fine-tuning's weight sync to a vLLM server this process owns: write the
    learner's weights (safetensors, `dtype`) to `folder` and reload them in place
    (``POST /collective_rpc`` ``reload_weights``), generation paused around it; the prefix
    cache is reset, since its KV entries were computed with the old weights. ~1-2 s for a
    135M model on CPU (``time/weight_sync_s`` logs it)."""

    def __init__(self, base_url: str, folder: Path, dtype: str, timeout_s: float = 300) -> None:
        self.base_url, self.folder, self.dtype, self.timeout_s = base_url, folder, dtype, timeout_s

    def _post(self, route: str, **body: Any) -> None:
        post(
            f"{self.base_url}{route}",
            body or None,
            self.timeout_s,
            missing_route="the server needs VLLM_SERVER_DEV_MODE=1 (its weight-reload routes)",
        )

    def push(self, model: Any, version: int) -> None:
        import torch
        from safetensors.torch import save_file

        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            self.dtype, torch.float32
        )
        self.folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()
        }
        save_file(tensors, str(self.folder / "model.safetensors"))
        del tensors
        self._post("/pause?mode=wait")
        try:
            self._post(
                "/collective_rpc",
                method="reload_weights",
                kwargs={"weights_path": str(self.folder.resolve())},
            )
            self._post("/reset_prefix_cache")
        finally:
            self._post("/resume")


def cuda_ipc_handle(tensor: Any) -> tuple[str, tuple]:
    """`tensor` (on a GPU) shared with another process: its GPU's UUID and the arguments
    ``torch.multiprocessing.reductions.rebuild_cuda_tensor`` rebuilds it from there (what
    vLLM's IPC weight transfer engine takes)."""
    import torch
    from torch.multiprocessing.reductions import reduce_tensor

    if tensor.device.type != "cuda":
        raise RuntimeError(
            f"model.vllm.weight_sync=ipc shares the learner's weights through CUDA IPC, but "
            f"they are on {tensor.device}: use weight_sync=files"
        )
    uuid = str(torch.cuda.get_device_properties(tensor.device).uuid)
    return uuid, reduce_tensor(tensor)[1]


class IpcWeightSync:
    """Full fine-tuning's weight sync in place, through CUDA IPC (``model.vllm.weight_sync:
    ipc``): the server, on the learner's GPU and started with ``--weight-transfer-config
    {"backend": "ipc"}``, reads the learner's weights (cast to the server's dtype) from its
    memory; nothing is written to disk. vLLM 0.32's weight transfer routes:
    ``/init_weight_transfer_engine`` once, then per update ``/start_weight_update``,
    ``/update_weights`` (names, dtypes, shapes and the pickled IPC handles, which the server
    unpickles under ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``), ``/finish_weight_update``
    (the version), generation paused around it and the prefix cache reset, as
    `FullWeightSync`. The copies are kept until the server has loaded them. Written against
    vLLM 0.32's source (``vllm/distributed/weight_transfer/ipc_engine.py``) and unit-tested
    against a fake server; never run on a GPU (docs/gpu.md). `share` turns a tensor into
    (GPU UUID, rebuild arguments): `cuda_ipc_handle`, or a test's stand-in."""

    def __init__(
        self,
        base_url: str,
        dtype: str,
        timeout_s: float = 300,
        share: Callable[[Any], tuple[str, tuple]] = cuda_ipc_handle,
    ) -> None:
        self.base_url, self.dtype, self.timeout_s, self.share = base_url, dtype, timeout_s, share
        self.initialized = False

    def _post(self, route: str, **body: Any) -> None:
        post(
            f"{self.base_url}{route}",
            body or None,
            self.timeout_s,
            missing_route="the server needs VLLM_SERVER_DEV_MODE=1 and "
            '--weight-transfer-config \'{"backend": "ipc"}\' (vLLM 0.32 or later)',
        )

    def push(self, model: Any, version: int) -> None:
        import torch

        dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(
            self.dtype, torch.float32
        )
        if not self.initialized:
            self._post("/init_weight_transfer_engine", init_info={"packed": False})
            self.initialized = True
        tensors = [(k, v.detach().to(dtype).contiguous()) for k, v in model.state_dict().items()]
        handles = [dict([self.share(t)]) for _, t in tensors]
        update_info = {
            "names": [k for k, _ in tensors],
            "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in tensors],
            "shapes": [list(t.shape) for _, t in tensors],
            "ipc_handles_pickled": base64.b64encode(pickle.dumps(handles)).decode(),
        }
        self._post("/pause?mode=wait")
        try:
            self._post("/start_weight_update")
            self._post("/update_weights", update_info=update_info)
            self._post("/finish_weight_update", weight_version=str(version))
            self._post("/reset_prefix_cache")
        finally:
            self._post("/resume")
        del tensors, handles  # the server has loaded them: the copies may go
        if torch.cuda.is_available():
            torch.cuda.ipc_collect()
