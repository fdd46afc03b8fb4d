"""Can the servers a run config names be reached? Asked before the model loads, in seconds:
a TCP connection to each (nothing is sent), so an address that is wrong, or a server that
was never started, is told as a mistake in the config rather than as a traceback after the
model has loaded and Ray has retried for a minute.

    trainer.rollout.address       host:port and ray://host:port are reached, and asked the
                                  standard gRPC health check (a Ray head's GCS answers it);
                                  ``auto`` is resolved as Ray resolves it ($RAY_ADDRESS,
                                  else the cluster ``ray start`` recorded on this node, else
                                  a raylet running here) and refused when that finds nothing
    trainer.rollout.sampler_url   something must answer at its host and port, and not
                                  answer ``GET /v1/models`` with 404 (an OpenAI-compatible
                                  server lists its models there)

Only what cannot be the server is refused (nothing listening, a name that does not resolve,
an HTTP server where a Ray cluster should be): an answer these checks cannot judge is left
to the run. What the server answers a sample request (a model it does not serve, a
temperature it refuses) is the workers' start-up check (`tracerl.rollout.ray_workers`).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from tracerl.config import ConfigError

PROBE_TIMEOUT_S = 3.0
"""How long a connection may take before the address counts as unreachable."""
RAY_CLIENT_PORT = 10001
"""Ray Client's port when a ``ray://`` address names none."""
SERVE_HINT = (
    "start the server there (e.g. `tracerl serve MODEL --port PORT`, or vLLM's `vllm serve`), "
    "or fix the URL"
)


def connect_problem(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection to `host`:`port` opens within `timeout_s`, else what went
    wrong, in a few words."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except socket.gaierror as e:
        return f"the host {host!r} does not resolve ({e.strerror or e})"
    except TimeoutError:
        return f"nothing answered at {_join(host, port)} within {timeout_s:g} s"
    except ConnectionRefusedError:
        return f"{_join(host, port)} refused the connection (nothing listens there)"
    except OSError as e:
        return f"{_join(host, port)}: {e.strerror or e}"


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def host_port(address: str, default_port: int | None = None) -> tuple[str, int] | None:
    """(host, port) of ``host:port``, ``[v6]:port`` or ``scheme://host:port/...``; None when
    it has no host, or no port and no `default_port`."""
    parts = urlsplit(address if "://" in address else f"//{address}")
    try:
        port = parts.port or default_port
    except ValueError:  # a port that is not a number
        return None
    if not parts.hostname or port is None:
        return None
    return parts.hostname, port


def grpc_problem(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None unless what listens at `host`:`port` is surely not a gRPC server (as a Ray
    cluster's head is): the standard health check (``grpc.health.v1.Health/Check``) is
    answered by an HTTP server's status, a connection that does not speak HTTP/2, or
    nothing in `timeout_s`. A gRPC server that does not offer the check passes; so does
    everything when grpc is not installed, or Ray is told to use TLS (``RAY_USE_TLS``)."""
    if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
        return None
    try:
        import grpc
    except ImportError:
        return None
    with grpc.insecure_channel(_join(host, port)) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            check(b"", timeout=timeout_s)  # an empty HealthCheckRequest: the whole server
            return None
        except grpc.RpcError as e:
            code, details = e.code(), e.details() or ""
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"{_join(host, port)} accepts connections but did not answer within {timeout_s:g} s"
    http = "header with status" in details  # an HTTP server's status, not a gRPC one
    if code is grpc.StatusCode.UNAVAILABLE or http:
        return (
            f"what answers at {_join(host, port)} is not a Ray cluster "
            f"({code.name}: {details.strip()[:160]})"
        )
    return None


def check_sampler_url(url: str | None, key: str = "trainer.rollout.sampler_url") -> None:
    """Refuse `url` (`key`'s, a server's root: `tracerl.rollout.backend_config.server_root`)
    when nothing answers at its host and port, or what answers has no ``/v1/models``."""
    if url is None:
        return
    parts = urlsplit(url)
    target = host_port(url, 443 if parts.scheme == "https" else 80)
    if target is None:  # the config's own validation refuses such a URL first
        raise ConfigError(f"{key}: {url!r} has no host", SERVE_HINT)
    problem = connect_problem(*target)
    if problem is not None:
        raise ConfigError(f"{key}: no server answers at {url}: {problem}", SERVE_HINT)
    problem = _models_problem(url.rstrip("/") + "/v1/models")
    if problem is not None:
        raise ConfigError(f"{key}: {url} is not an OpenAI-compatible server: {problem}", SERVE_HINT)


def _models_problem(models: str) -> str | None:
    """None unless `models` (a server's ``/v1/models``) is answered with 404, or with
    something that is not HTTP. Anything else (a list, a refusal without a key, an error
    while loading) leaves the server to the workers' start-up check."""
    import httpx

    try:
        status = httpx.get(models, timeout=PROBE_TIMEOUT_S).status_code
    except httpx.TimeoutException:  # busy, perhaps: not proof of a wrong URL
        return None
    except httpx.HTTPError as e:
        return f"GET {models} failed ({type(e).__name__}: {str(e)[:160]})"
    if status == 404:
        return f"GET {models} answered 404 (such a server lists its models there)"
    return None


def ray_address_file() -> Path:
    """Where ``ray start`` records the cluster it started, for ``address: auto`` to find
    (``ray stop`` removes it): ``ray_current_cluster`` in Ray's temporary folder,
    ``$RAY_TMPDIR``, else ``$TMPDIR`` on Linux, else ``/tmp``, then ``ray/``."""
    base = os.environ.get("RAY_TMPDIR")
    if not base and sys.platform.startswith("linux"):
        base = os.environ.get("TMPDIR")
    return Path(base or "/tmp") / "ray" / "ray_current_cluster"


def local_raylet_addresses() -> list[str]:
    """The cluster addresses (``--gcs-address``) of the raylets running on this node: what
    ``address: auto`` falls back to when no cluster was recorded (any Ray started here,
    ``ray.init()``'s included)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone, or not ours to read
            continue
        if not args or "raylet" not in os.path.basename(args[0]):
            continue
        for arg in " ".join(args).split():
            if arg.startswith("--gcs-address="):
                value = arg.split("=", 1)[1]
                if value and value != "None":
                    found.append(value)
    return list(dict.fromkeys(found))


def check_ray_address(address: str | None) -> None:
    """Refuse ``trainer.rollout.address`` when the Ray cluster it names cannot be joined:
    a host:port (or ``ray://``) nothing answers at, or ``auto`` where Ray would find no
    cluster. None and ``local`` start a cluster of the run's own: nothing to reach. A
    process already connected to Ray (``ray.init()`` before the run) joins that one."""
    from tracerl.rollout.ray_workers import cluster_unreachable, import_ray

    if address is None or address == "local" or import_ray().is_initialized():
        return
    target, found = address, ""
    if address == "auto":
        recorded, variable = ray_address_file(), os.environ.get("RAY_ADDRESS", "")
        try:
            last = recorded.read_text().strip()
        except OSError:  # none recorded (or not ours to read: Ray could not either)
            last = ""
        if variable and variable != "auto":
            target, found = variable, " (auto: $RAY_ADDRESS)"
        elif last:
            target, found = last, f" (auto: the cluster `ray start` recorded in {recorded})"
        elif local_raylet_addresses():  # Ray joins one of these
            return
        else:
            e = cluster_unreachable(
                "auto",
                f"no running Ray cluster was found ($RAY_ADDRESS is unset, {recorded} does "
                "not exist, no raylet runs on this node)",
            )
            raise ConfigError(e.message, e.hint)
    if target == "local":  # RAY_ADDRESS=local: Ray starts a cluster of the run's own
        return
    if "://" in target and not target.startswith("ray://"):
        return  # another Ray Client protocol: its own package connects
    where = host_port(target, RAY_CLIENT_PORT if target.startswith("ray://") else None)
    if where is None:
        problem = "not an address Ray can join: give host:port, ray://host:port or auto"
    else:
        problem = connect_problem(*where) or grpc_problem(*where)
    if problem is not None:
        e = cluster_unreachable(target, problem, found)
        raise ConfigError(e.message, e.hint)
