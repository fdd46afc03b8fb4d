"""Policies and the chat renderer.

The names below are loaded lazily (PEP 562): a config imports this package's torch-free
modules (`tracerl.models.precision`) without torch and transformers coming with them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tracerl.imports import lazy_names

_WHERE = {
    "MODEL_SPECS": "tracerl.models.loading",
    "ChatRenderer": "tracerl.models.render",
    "Conversation": "tracerl.models.conversation",
    "ModelNotFoundError": "tracerl.models.loading",
    "PolicyBundle": "tracerl.models.loading",
    "cache_dir": "tracerl.models.loading",
    "load": "tracerl.models.specs",
    "tools_block": "tracerl.models.render",
}

__all__ = [
    "MODEL_SPECS",
    "ChatRenderer",
    "Conversation",
    "ModelNotFoundError",
    "PolicyBundle",
    "cache_dir",
    "load",
    "tools_block",
]

if TYPE_CHECKING:
    from tracerl.models.conversation import Conversation
    from tracerl.models.loading import MODEL_SPECS, ModelNotFoundError, PolicyBundle, cache_dir
    from tracerl.models.render import ChatRenderer, tools_block
    from tracerl.models.specs import load


__getattr__ = lazy_names(__name__, _WHERE)
