"""Adapters: environments written to standards others publish, as tracerl environments.

Each adapter lives in its own module, imports its standard's package only when it is built
(every one is an optional extra), and is registered by name in `tracerl.envs`:

* `reasoning_gym` — a reasoning-gym task family (``pip install 'tracerl[reasoning-gym]'``):
  its generator as seeded, disjoint splits, its own ``score_answer`` as the verifier.
* `openenv` — an OpenEnv environment (``pip install 'tracerl[openenv]'``; openenv-core and
  the servers in ``.venv-openenv``: ``make openenv``): a server tracerl starts before the
  first episode (or one running), a session per episode, its step reward as the reward.
* `verifiers` — a verifiers (0.4) taskset (verifiers in ``.venv-verifiers``: ``make
  verifiers``): one worker process per configuration, its harness playing each episode
  through tracerl's gateway, its rubric the reward.
"""
