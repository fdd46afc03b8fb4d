"""How tracerl reaches an OpenAI-compatible server (vLLM, SGLang, `tracerl serve`, a hosted
API): its URL, given either as the server's root or as the OpenAI SDK's ``base_url``, and its
API key, from the environment variable a config names (never from the config itself, so it
never lands in a run directory or a cache).

    server_root      ``http://host:8000`` from either form: the sampler appends ``/v1/...``
    openai_base_url  the SDK's ``base_url`` (a bare root gets ``/v1``): the judge, the
                     distillation teacher and the summarizer append ``/chat/completions``...
    bearer_headers   the ``Authorization`` header, or a `UserError` naming the config key
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from tracerl.errors import UserError


def server_root(url: str) -> str:
    """The root of an OpenAI-compatible server at `url`, which may be given either way:
    ``http://host:8000`` or, as the OpenAI SDK's ``base_url``, ``http://host:8000/v1``
    (trailing slashes ignored). The routes (``/v1/completions``...) are appended to it.
    A `ValueError` for a URL that is not http(s) with a host."""
    root = url.strip().rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")].rstrip("/")
    parts = urlsplit(root)
    try:
        ok = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        ok = False
    if not ok:
        raise ValueError(
            "not an http(s) URL with a host: give the server's, e.g. http://host:8000 or "
            "http://host:8000/v1"
        )
    return root


def openai_base_url(url: str) -> str:
    """The OpenAI SDK's ``base_url`` for a server at `url`, the routes (``/chat/completions``,
    ``/completions``) appended to it: a bare server root (``http://host:8000``) gets
    ``/v1``; a URL with a path (``http://host:8000/v1``, a provider's
    ``https://host/api/v1`` or ``.../v1beta/openai``) is kept as given (trailing slashes
    ignored). A `ValueError` for a URL that is not http(s) with a host."""
    base = url.strip().rstrip("/")
    server_root(base)  # the same check of scheme, host and port
    return base + "/v1" if not urlsplit(base).path else base


def bearer_headers(api_key_env: str | None, who: str) -> dict[str, str]:
    """The ``Authorization`` header from the environment variable `api_key_env` names (none
    without one); a `UserError` naming `who` (the config key) when it is not set. The key
    itself never comes from a config, so it never lands in a run directory or a cache."""
    if not api_key_env:
        return {}
    key = os.environ.get(api_key_env)
    if not key:
        raise UserError(
            f"{who}: the environment variable {api_key_env} (api_key_env) is not set",
            f"export {api_key_env}=... with the endpoint's key, or drop api_key_env",
        )
    return {"Authorization": f"Bearer {key}"}
