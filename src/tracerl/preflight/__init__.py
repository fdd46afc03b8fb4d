"""Everything a run config needs, checked before anything is loaded or written.

`prepare(cfg)` resolves the model spec (without loading it), the environment (a built-in, an
entry point or an import path), its splits and the reward, and refuses a config the run
could not complete, with what, where and what to do (`ConfigError`): an unknown model, an
environment or reward that cannot be found, a split the environment does not have, an
adversarial evaluation on an environment without that split, a warm start on an environment
without a reference agent, a Ray cluster or a sampling server nothing answers at
(`tracerl.preflight.reach`), a vLLM Python without vllm. It returns the config with the
environment's split defaults filled in, and the objects the run uses.

`tracerl.preflight.rehearsal` is the second check, run once the cheaper ones (a run that
exists, a resume with another config) have passed and before the model loads: one episode
played the way the run will play them (`Run.rehearse`).

`tracerl train`, `readiness` and `eval` call it first: a mistake costs seconds, not a
baseline evaluation, and nothing is written to the run directory.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracerl.config import ConfigError, RunConfig
from tracerl.envs.base import Env
from tracerl.envs.registry import EnvSpec, resolve
from tracerl.errors import UserError
from tracerl.rewards.resolve import check_functions, resolve_reward
from tracerl.rewards.run_reward import RunReward

ADVERSARIAL = "adversarial"
EVAL_PREFERENCE = ("heldout", "test", "validation", "eval", "dev")


@dataclass
class Prepared:
    """A checked config and what it resolved to."""

    cfg: RunConfig
    """The config with ``env.train_split`` and ``env.eval_split`` filled in."""
    env: EnvSpec
    probe: Env
    """An instance of the environment (task sampling, citation lookups)."""
    reward: RunReward
    warnings: list[str] = field(default_factory=list)
    """What the run can do but probably should not (printed before it starts)."""


def _fail(key: str, e: Exception, hint: str | None = None) -> ConfigError:
    message = getattr(e, "message", None) or str(e.args[0] if e.args else e)
    where = "" if message.startswith(f"{key}:") else f"{key}: "
    return ConfigError(where + message, hint or getattr(e, "hint", None))


def reward_key(cfg: RunConfig) -> str:
    """The config key an error about the run's reward names."""
    return "trainer.reward_components" if cfg.trainer.reward_components else "trainer.reward"


def check_model(spec: str) -> None:
    from tracerl.models.specs import check_spec

    try:
        check_spec(spec)
    except UserError as e:
        raise _fail("model.spec", e) from e


def build_probe(
    name: str, kwargs: dict[str, Any], mcp: list[Any] | None = None
) -> tuple[EnvSpec, Env]:
    """The environment `name` resolves to, and one instance of it built with `kwargs`
    (offering the tools of the MCP servers `mcp`: each is reached and listed here)."""
    from tracerl.envs.registry import make

    try:
        spec = resolve(name)
    except UserError as e:
        raise _fail("env.name", e) from e
    key = "env.kwargs" if kwargs else "env.name"
    try:
        probe = make(name, **kwargs)
    except UserError as e:
        raise _fail(key, e) from e
    except TypeError as e:  # an argument the factory does not take
        raise _fail(key, e, f"check the arguments {_signature(spec)} takes") from e
    except (ValueError, KeyError, FileNotFoundError) as e:
        hint = (
            f"check the arguments given to {name!r} ({kwargs})"
            if kwargs
            else "fix the environment, or give it its arguments (env.kwargs)"
        )
        raise _fail(key, e, hint) from e
    except Exception as e:  # the environment's own code failed while being built
        raise ConfigError(
            f"env.name: building environment {name!r} raised {type(e).__name__}: {e}",
            "fix the environment's __init__ (tracerl --debug ... shows the traceback)",
        ) from e
    env_splits(probe)  # declared in a form that can be read
    if mcp:
        attach_mcp(probe, mcp)
    return spec, probe


def attach_mcp(probe: Env, servers: list[Any]) -> None:
    """Reach each MCP server of ``env.mcp`` and offer its tools on `probe`, or say which
    server failed and why (its stderr's tail included)."""
    try:
        from tracerl.envs.mcp import attach
        from tracerl.envs.mcp.client import import_mcp

        import_mcp()
    except ImportError as e:
        raise ConfigError(f"env.mcp: {e}", "pip install 'tracerl[mcp]'") from e
    for i, server in enumerate(servers):
        try:
            attach(probe, [server])
        except UserError as e:
            raise _fail("env.mcp", e) from e
        except Exception as e:  # would not start, refused, a wrong annotation or dry-run name
            raise ConfigError(
                f"env.mcp[{i}] ({getattr(server, 'name', server)}): {e}",
                "fix the server entry (docs/mcp.md); `tracerl check-env --config FILE` "
                "checks an environment with its servers",
            ) from e


def _signature(spec: EnvSpec) -> str:
    import inspect

    try:
        params = inspect.signature(spec.factory).parameters.values()
    except (TypeError, ValueError):
        return spec.name
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return spec.name
    params = [p.name for p in params if p.name != "self"]
    return f"{spec.name} ({', '.join(params) or 'no arguments'})"


def env_splits(probe: Env) -> tuple[str, ...] | None:
    """The split names the environment declares (None: undeclared)."""
    splits = getattr(probe, "splits", None)
    if splits is None:
        return None
    if isinstance(splits, str) or not all(isinstance(x, str) for x in splits):
        raise ConfigError(
            f"env.name: environment {probe.name or type(probe).__name__!r} declares splits = "
            f"{splits!r}",
            'splits is a tuple of names, e.g. ("train", "test") — ("train",) for one',
        )
    return tuple(splits)


def default_splits(splits: tuple[str, ...] | None) -> tuple[str, str]:
    """(train, eval) for an environment declaring `splits` (None: undeclared)."""
    if not splits:
        return "train", "heldout"
    train = "train" if "train" in splits else splits[0]
    rest = [s for s in splits if s not in (train, ADVERSARIAL)]
    preferred = [s for s in EVAL_PREFERENCE if s in rest]
    return train, (preferred or rest or [train])[0]


def check_split(probe: Env, name: str, split: str, key: str) -> None:
    """Refuse `split` if the environment lacks it (declared, or by sampling one task)."""
    declared = env_splits(probe)
    if declared is not None:
        if split not in declared:
            valid = ", ".join(declared) or "none"
            raise ConfigError(
                f"{key}: environment {name!r} has no split {split!r}; its splits: {valid}",
                f"set {key} to one of them" if declared else "this environment has no tasks",
            )
        return
    try:
        tasks = probe.sample_tasks(1, seed=0, split=split)
    except Exception as e:
        raise ConfigError(
            f"{key}: environment {name!r} could not sample split {split!r}: "
            f"{type(e).__name__}: {e}",
            f"set {key} to a split it has (declare them as `splits` on the environment)",
        ) from e
    if not tasks:
        raise ConfigError(f"{key}: environment {name!r} has no tasks in split {split!r}")


def check_teacher(cfg: RunConfig) -> None:
    """``trainer.distill.teacher`` names a model (a spec, a run's checkpoint) whose tokenizer
    is the student's: a teacher scores the student's token ids, which must mean the same
    tokens to it. Only tokenizers load here."""
    d = cfg.trainer.distill
    if d is None or d.teacher is None:
        return
    from tracerl.config.distill import vocabulary_mismatch
    from tracerl.models.refs import teacher_vocabulary

    try:
        ref, differs = teacher_vocabulary(cfg.model.spec, d.teacher)
    except UserError as e:
        raise _fail("trainer.distill.teacher", e) from e
    if differs:
        raise ConfigError(vocabulary_mismatch(d.teacher, ref.spec, cfg.model.spec, differs))


def prepare(cfg: RunConfig, *, workers: bool = True) -> Prepared:
    """Check `cfg` against what it names; the config with split defaults, and the objects.
    `workers`: the run will use its Ray rollout workers (``trainer.rollout.backend: ray``;
    training does, an evaluation or readiness check samples in process), so their cluster
    and sampling server are reached here (`tracerl.preflight.reach`)."""
    check_model(cfg.model.spec)
    check_teacher(cfg)
    if cfg.env.parser is not None:
        from tracerl.envs.parsers import PARSERS

        if cfg.env.parser not in PARSERS:
            raise ConfigError(
                f"env.parser: unknown action parser {cfg.env.parser!r}; valid: "
                f"{', '.join(sorted(PARSERS))}",
                "or leave it unset: the model family's default",
            )
    spec, probe = build_probe(cfg.env.name, cfg.env.env_kwargs(), cfg.env.mcp)
    declared = env_splits(probe)
    train, evaluation = default_splits(declared)
    env_cfg = cfg.env.model_copy(
        update={
            "train_split": cfg.env.train_split or train,
            "eval_split": cfg.env.eval_split or evaluation,
        }
    )
    check_split(probe, cfg.env.name, env_cfg.train_split, "env.train_split")
    check_split(probe, cfg.env.name, env_cfg.eval_split, "env.eval_split")
    if cfg.env.adversarial_eval_tasks:
        try:
            check_split(probe, cfg.env.name, ADVERSARIAL, "env.adversarial_eval_tasks")
        except ConfigError:
            args = ", ".join(f"{k}: {v}" for k, v in cfg.env.kwargs.items())
            has = ", ".join(declared) if declared else "undeclared"
            search = " (search has the traps only on corpus: synthetic)"
            raise ConfigError(
                f"env.adversarial_eval_tasks: {cfg.env.adversarial_eval_tasks} asks for the "
                f"{ADVERSARIAL!r} split, which environment {cfg.env.name!r}"
                + (f" ({args})" if args else "")
                + f" does not have; its splits: {has}",
                "set env.adversarial_eval_tasks: 0" + (search if cfg.env.name == "search" else ""),
            ) from None
    if cfg.warm_start is not None and type(probe).check_script is Env.check_script:
        raise ConfigError(
            f"warm_start: environment {cfg.env.name!r} has no reference agent to imitate "
            "(no check_script of its own)",
            "remove warm_start, or give the environment a check_script(task) that solves a task",
        )
    summarizer = cfg.rollout.context.summarizer
    if cfg.rollout.context.policy == "compact" and summarizer.by == "endpoint":
        from tracerl.rollout.endpoints import bearer_headers

        bearer_headers(summarizer.api_key_env, "rollout.context.summarizer")  # its key is set
    if cfg.rollout.context.policy == "compact" and summarizer.by == "function":
        from tracerl.imports import load_object

        fn = load_object(summarizer.fn or "", "rollout.context.summarizer.fn")
        if not callable(fn):
            raise ConfigError(
                f"rollout.context.summarizer.fn {summarizer.fn!r} is a "
                f"{type(fn).__name__}, not a function",
                "name a function taking the messages and returning the summary text",
            )
    if cfg.trainer.rollout.backend == "ray":
        from tracerl.rollout.ray_workers import import_ray

        try:
            import_ray()
        except ImportError as e:
            raise ConfigError(f"trainer.rollout.backend: {e}") from None
        if workers:
            from tracerl.preflight.reach import check_ray_address, check_sampler_url

            check_ray_address(cfg.trainer.rollout.address)  # a cluster that cannot be joined
            check_sampler_url(cfg.trainer.rollout.sampler_url)  # a server nothing answers at
    if cfg.agent is not None:  # the agent loads, the openai SDK is there, the classes exist
        from tracerl.gateway.agent import policy_exception_types
        from tracerl.gateway.harness import import_openai, load_agent, wants_url

        try:
            if not wants_url(load_agent(cfg.agent.entry)):  # it gets an openai SDK client
                import_openai()
            policy_exception_types(cfg.agent.policy_exceptions)
        except UserError as e:
            raise _fail("agent", e) from e
        import os

        from tracerl.gateway.ports import check_port

        try:  # the gateway's port, free before the model loads (as `tracerl gateway --port`);
            # under torchrun only rank 0 listens: another rank may check after it bound
            if os.environ.get("RANK", "0") == "0":
                check_port(cfg.agent.host, cfg.agent.port, "agent.port")
        except UserError as e:
            raise _fail("agent.port", e) from e
    if cfg.model.engine == "vllm":  # installed? (a model it cannot serve fails its start)
        from tracerl.engines.vllm_python import check_vllm_python

        check_vllm_python(cfg.model.vllm.python)  # it runs, and has vllm
    key = reward_key(cfg)
    try:
        reward = resolve_reward(
            cfg.trainer.reward, cfg.trainer.reward_components, probe, env_name=cfg.env.name
        )
    except UserError as e:
        raise _fail(key, e) from e
    task = probe.sample_tasks(1, seed=cfg.trainer.seed, split=env_cfg.train_split)[0]
    problem = check_functions(reward, task)
    if problem:
        raise ConfigError(
            f"{key}: {problem}",
            "rename the parameter to one tracerl passes, or give it a default",
        )
    warnings = []
    if env_cfg.eval_split == env_cfg.train_split and len(declared or ()) > 1:
        warnings.append(
            f"env.eval_split is the training split ({env_cfg.train_split!r}): evaluations "
            "measure tasks the policy trains on, not held-out success"
        )
    k = cfg.eval.samples_per_task
    if k > 1 and cfg.eval.temperature == 0:
        warnings.append(
            f"eval.samples_per_task={k} at eval.temperature=0: greedy decoding plays each task "
            f"the same way {k} times (pass@{k} = mean@{k}); sample above 0 to measure pass@{k}"
        )
    cfg = cfg.model_copy(update={"env": env_cfg})
    return Prepared(cfg, spec, probe, reward, warnings)
