"""Policies and the chat renderer."""

from tracerl.models.conversation import Conversation
from tracerl.models.loading import (
    MODEL_SPECS,
    ModelNotFoundError,
    PolicyBundle,
    cache_dir,
)
from tracerl.models.render import ChatRenderer, tools_block
from tracerl.models.specs import load

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
