"""Rollout workers on Ray: environments and episode loops in Ray actors, generation on a
completion server, the learner where it is (`trainer.rollout.backend: ray`).

    training process (driver)                          Ray actors (any node)
    run_group -> RayRollouts.run_episode(factory, task, config, seed, episode id)
        sends it to the live worker with the fewest
        episodes in flight                      ->     RolloutWorker.run:
                                                           run_episode(factory(), task, policy)
                                                           policy = RemoteSampler(server)
                                                                    + the driver's renderer
                                                                    + the driver's parser
        <- the Episode, its receipt stamped with where it ran

Each worker has its own environment instances (built from the factory it is sent, so a
search index or a sandbox lives on the worker's node) and its own `RemoteSampler`; the
server is the learner's own (`ServerThread` over its live weights) or a vLLM/SGLang server.
Episodes are the same objects the in-process path makes: token ids, masks, log-probs,
receipts; the trainer, the run directory and the report see no difference.

A worker that dies (process killed, out of memory, node lost) fails every episode in flight
on it. Each of those is run again from the start (fresh env, same seed) on another live
worker, and a replacement is started for the dead one; the receipt's ``worker`` lists the
failed attempts. An episode that lost its worker `max_attempts` times ends as
``infra_failure``: the environment's, never trained on. Nothing is dropped silently. With no
live worker left and no replacement allowed, nothing can run and the run stops. Re-running
from the start is safe because an environment instance is per episode; a write action
against a real service should run under a dry-run guard.

An exception inside the episode loop is not a death: the runner already turns every crash it
can into a recorded episode, so what escapes (a factory that cannot build the env on that
node, say) is raised in the driver as it would be in process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tracerl.envs.base import Env
from tracerl.errors import UserError
from tracerl.rollout.backend_config import RolloutBackendConfig
from tracerl.rollout.budget import RolloutConfig
from tracerl.rollout.episode import Episode, Policy
from tracerl.rollout.remote import RemoteSampler
from tracerl.rollout.runner import failed_episode, run_episode
from tracerl.rollout.sampler import SampleRequest, SamplerUnavailable
from tracerl.rollout.weight_sync import WeightSync, weight_sync_from_config

RAY_PIP = "pip install 'tracerl[ray]'"
CLUSTER_HINT = (
    "start a cluster there with `ray start --head` (and give the address it prints), or "
    "leave trainer.rollout.address unset: the run starts a local cluster of its own"
)


class RayClusterError(UserError, ConnectionError):
    """``trainer.rollout.address`` names a Ray cluster that cannot be joined."""


class RolloutWorkersError(UserError, RuntimeError):
    """The Ray rollout workers did not start (a server they cannot sample from, a factory
    that does not build on their node): what, and the first worker's own words."""


def cluster_unreachable(address: str, why: str, found: str = "") -> RayClusterError:
    """The error for a Ray cluster at `address` (``trainer.rollout.address``, or what
    ``auto`` `found`) that cannot be joined, and `why`: the same words from preflight
    (`tracerl.preflight.reach`) and from here."""
    return RayClusterError(
        f"trainer.rollout.address: cannot join the Ray cluster at {address!r}{found}: {why}",
        CLUSTER_HINT,
    )


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ImportError(
            f"trainer.rollout.backend=ray needs Ray: {RAY_PIP} (or use backend: inprocess)"
        ) from None
    return ray


class RolloutWorker:
    """One Ray actor: runs episodes concurrently (an async actor), each in a fresh env, with
    a remote sampler to the completion server."""

    def __init__(
        self,
        index: int,
        renderer: Any,
        parser: Any,
        model_id: str,
        sampler: dict[str, Any],
    ) -> None:
        import ray

        self.sampler = RemoteSampler(**sampler)
        self.policy = Policy(self.sampler, renderer, parser, model_id)
        self.where = {
            "backend": "ray",
            "worker": index,
            "node": ray.util.get_node_ip_address(),
            "pid": os.getpid(),
        }

    async def ready(self) -> dict[str, Any]:
        """Started, and the server answers this worker (reachable from its node, the model
        name and temperature accepted): one token, before any episode is sent here."""
        try:
            await self.sampler.sample(SampleRequest((0,), 1, seed=0))
        except Exception as e:
            hint = (
                "; workers on other nodes need trainer.rollout.serve_host: 0.0.0.0 (or "
                "advertise_host)"
                if isinstance(e, SamplerUnavailable)
                else ""
            )
            raise RuntimeError(
                f"rollout worker {self.where['worker']} on {self.where['node']} cannot sample "
                f"from {self.sampler.base_url} ({type(e).__name__}: {e}){hint}"
            ) from None
        return self.where

    async def set_model(self, model: str) -> None:
        """After a weight sync: the next turn of every episode here asks for `model`."""
        self.sampler.model = model

    async def run(
        self,
        env: Callable[[], Env],
        task: dict[str, Any],
        config: RolloutConfig | None,
        seed: int,
        episode_id: str,
        policy_version: int | None,
        model: str,
    ) -> Episode:
        if policy_version is not None:  # what a receipt says before the server has answered
            self.sampler.policy_version = max(self.sampler.policy_version, policy_version)
        self.sampler.model = model
        episode = await run_episode(
            env(), task, self.policy, config, seed=seed, episode_id=episode_id
        )
        episode.receipt.worker = dict(self.where)
        return episode


@dataclass
class _Slot:
    index: int
    handle: Any
    in_flight: int = 0
    alive: bool = True


class RayRollouts:
    """The `RolloutBackend` that runs episodes in Ray actors, as `settings` (the run's
    ``trainer.rollout``) says.

    `base_url`/`served_model`: the completion server the workers sample from, at the
    policy's temperature; `weight_sync` keeps it in step with the learner when the learner
    does not serve its weights itself (`publish`). Without a running Ray, a local cluster
    is started, sized so the workers fit, and shut down on `close()`."""

    def __init__(
        self,
        policy: Policy,
        base_url: str,
        *,
        served_model: str | None = None,
        temperature: float = 1.0,
        weight_sync: WeightSync | None = None,
        settings: RolloutBackendConfig | None = None,
        name: str = "tracerl",
        start_timeout_s: float = 300.0,
    ) -> None:
        p = settings or RolloutBackendConfig(backend="ray")
        ray = import_ray()
        self._ray, self._owns_ray, self.slots = ray, False, []
        if not ray.is_initialized():
            if p.address is None:  # a cluster of our own, not RAY_ADDRESS's, big enough
                cpus = max(os.cpu_count() or 1, math.ceil(p.workers * p.worker_cpus))
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    object_store_memory=256 << 20,
                    include_dashboard=False,
                )
            else:  # unreachable, no cluster found ("auto"), a malformed address
                try:
                    ray.init(address=p.address)
                except (ConnectionError, TimeoutError, ValueError) as e:
                    raise cluster_unreachable(p.address, _first_line(e)) from e
            self._owns_ray = True
        self.policy = policy
        self.served_model = served_model or policy.model_id
        self.weight_sync = weight_sync
        self.max_attempts = p.max_attempts
        self.restarts_left = 2 * p.workers if p.max_restarts is None else p.max_restarts
        self.capacity = p.workers * p.episodes_per_worker
        """Episodes the pool runs at once: what the trainer keeps in flight."""
        self.deaths = 0
        self._name = f"{name}-{uuid.uuid4().hex[:6]}"
        self._next_index = 0
        try:
            self._actor = ray.remote(RolloutWorker)
            self._options = {
                "num_cpus": p.worker_cpus,
                "max_concurrency": p.episodes_per_worker,
                "max_restarts": 0,  # a replacement is ours to start (see `_died`)
            }
            sampler = {
                "base_url": base_url,
                "model": self.served_model,
                "temperature": temperature,
                "timeout_s": p.sampler_timeout_s,
                "retries": p.sampler_retries,
            }
            self._args = (ray.put(policy.renderer), policy.parser, policy.model_id, sampler)
            self.slots = [self._start() for _ in range(p.workers)]
            ray.get([s.handle.ready.remote() for s in self.slots], timeout=start_timeout_s)
        except Exception as e:
            self.close()
            cause = e.cause if isinstance(e, ray.exceptions.RayTaskError) else e
            raise RolloutWorkersError(
                f"Ray rollout workers did not start: {cause}", _start_hint(cause, ray)
            ) from None

    def _start(self) -> _Slot:
        index, self._next_index = self._next_index, self._next_index + 1
        options = {**self._options, "name": f"{self._name}-w{index}"}
        handle = self._actor.options(**options).remote(index, *self._args)
        return _Slot(index, handle)

    def _pick(self) -> _Slot | None:
        live = [s for s in self.slots if s.alive]
        return min(live, key=lambda s: s.in_flight) if live else None

    def _died(self, slot: _Slot, handle: Any) -> None:
        """The first episode to see `handle` die replaces it (the others only retry)."""
        if slot.handle is not handle or not slot.alive:
            return
        self.deaths += 1
        slot.alive = False
        with contextlib.suppress(Exception):  # unreachable rather than dead: free its CPUs
            self._ray.kill(handle, no_restart=True)
        if self.restarts_left > 0:
            self.restarts_left -= 1
            self.slots[self.slots.index(slot)] = self._start()

    async def run_episode(
        self,
        env: Callable[[], Env],
        task: dict[str, Any],
        policy: Policy,
        config: RolloutConfig | None,
        *,
        seed: int,
        episode_id: str,
    ) -> Episode:
        ray = self._ray
        died = (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError)
        failures: list[dict[str, Any]] = []
        version = getattr(policy.sampler, "policy_version", None)
        for _ in range(self.max_attempts):
            slot = self._pick()
            if slot is None:  # nothing can run: stop the run (a resume starts a new pool)
                raise RuntimeError(
                    f"no live rollout worker is left: {self.deaths} died and the "
                    "replacements (trainer.rollout.max_restarts) are used up; the Ray logs "
                    "(/tmp/ray/session_latest/logs) say why; then --resume"
                )
            handle = slot.handle
            slot.in_flight += 1
            try:
                episode = await handle.run.remote(
                    env, task, config, seed, episode_id, version, self.served_model
                )
            except ray.exceptions.RayTaskError as e:  # the episode loop itself raised
                raise e.as_instanceof_cause() from None
            except ray.exceptions.RayError as e:  # the worker, its node or the result lost
                failures.append({"worker": slot.index, "error": _first_line(e)})
                if isinstance(e, died):
                    self._died(slot, handle)
                continue
            finally:
                slot.in_flight -= 1
            where = episode.receipt.worker or {}
            return _stamp(episode, {**where, "failed_attempts": failures})
        lost = "; ".join(f"worker {f['worker']}: {f['error']}" for f in failures)
        episode = await failed_episode(
            env(),
            task,
            policy,
            config,
            seed=seed,
            episode_id=episode_id,
            error=f"its rollout worker was lost {len(failures)} times ({lost})",
        )
        return _stamp(episode, {"backend": "ray", "worker": None, "failed_attempts": failures})

    def publish(self, model: Any, version: int) -> None:
        """After an update: the server the workers sample from gets the new weights, and
        the workers the name to ask for (a no-op when the learner serves its own weights)."""
        if self.weight_sync is None:
            return
        name = self.weight_sync.push(model, version)
        if name and name != self.served_model:
            self.served_model = name
            acks = [s.handle.set_model.remote(name) for s in self.slots if s.alive]
            with contextlib.suppress(self._ray.exceptions.RayError):  # a lost one is retried
                self._ray.get(acks, timeout=60)

    def close(self) -> None:
        for s in self.slots:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(s.handle)
        if self._owns_ray:
            self._ray.shutdown()
            self._owns_ray = False


@contextlib.contextmanager
def rollout_backend(
    cfg: Any, bundle: Any, sampler: Any, policy: Policy, engine: Any = None
) -> Iterator[RayRollouts | None]:
    """The run's backend (`trainer.rollout`): None in process; with ``ray``, the Ray
    workers and the server they sample from: the run's sampling engine's when it is a
    server (``model.engine: vllm``, which keeps it in step), `sampler_url`'s, kept in step
    by `weight_sync`, or else the learner's own over its live weights (`ServerThread`).
    Stopped on exit."""
    rc = cfg.trainer.rollout
    if rc.backend == "inprocess":
        yield None
        return
    from tracerl.rollout.serve import ServerThread

    server, sync = None, None
    served = rc.served_model or bundle.spec
    url = rc.sampler_url
    if engine is not None and engine.url is not None:  # a server the run owns
        url, served, sync = engine.url, engine.sampler.model, engine
    elif rc.sampler_url is None:  # the learner serves its live weights: nothing to sync
        advertise = rc.advertise_host
        if advertise is None and rc.serve_host == "0.0.0.0":  # this node, as Ray sees it
            advertise = import_ray().util.get_node_ip_address()
        server = ServerThread(
            sampler,
            bundle.spec,
            bundle.tokenizer,
            host=rc.serve_host,
            port=rc.serve_port,
            advertise=advertise,
        )
    else:
        sync = weight_sync_from_config(
            rc.weight_sync,
            base_url=rc.sampler_url,
            served_model=served,
            folder=cfg.run_dir / "adapters",
        )
    backend = None
    try:
        url = server.start() if server is not None else url
        backend = RayRollouts(
            policy,
            url,
            served_model=served,
            temperature=cfg.model.temperature,
            weight_sync=sync,
            settings=rc,
            name=f"tracerl-{cfg.name}",
        )
        yield backend
    finally:
        if backend is not None:
            backend.close()
        if server is not None:
            server.stop()


def _stamp(episode: Episode, where: dict[str, Any]) -> Episode:
    """Record where the episode ran in its receipt (and in each trajectory's copy of it)."""
    episode.receipt.worker = where
    d = episode.receipt.to_dict()
    episode.trajectories = [
        # a sub-agent's samples keep their own receipt (its parent link, its compactions)
        dataclasses.replace(t, receipt={**(t.receipt or {}), "worker": where} if t.agent else d)
        for t in episode.trajectories
    ]
    return episode


def _start_hint(cause: BaseException, ray: Any) -> str:
    """What to do about workers that did not start because of `cause`."""
    if "cannot sample from" in str(cause):
        return (
            "start the server, or fix trainer.rollout.sampler_url (the learner's own server: "
            "serve_host/advertise_host); it must be reachable from the workers' nodes"
        )
    if isinstance(cause, ray.exceptions.GetTimeoutError):
        return (
            "the cluster may lack the CPUs for trainer.rollout.workers x worker_cpus "
            "(`ray status` shows what it has)"
        )
    return "the Ray logs (/tmp/ray/session_latest/logs) say more; tracerl --debug shows where"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
