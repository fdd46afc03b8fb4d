"""`openenv`: an OpenEnv environment (Meta/PyTorch's standard: an ``Environment`` served over
HTTP and websocket by openenv-core's server) as a tracerl environment.

    env:
      name: openenv
      kwargs: {app: my_env.server.app:app, action: message}

The server: ``base_url`` of one already running, or one tracerl starts before the first
episode (in the environment's ``prepare``, never inside an episode's time budget), once per
process, on a free loopback port, and stops when the process ends: ``app``, an OpenEnv app
(``module:attribute``, what openenv's ``create_app`` returns) served with uvicorn by the
Python that has openenv-core (``python``; default ``$TRACERL_OPENENV_PYTHON``, else
``.venv-openenv`` from ``make openenv``), or ``command``, any command that serves one on
``{port}``; both run in ``cwd`` (also on ``PYTHONPATH``) with ``env_vars`` added. Ready
when ``/health`` answers (``start_timeout_s``), and never another server that holds the
port (an app's server binds its own; a command's must not find it taken first); its
``/metadata`` and ``/schema`` are read then. openenv-core pins packages tracerl's
environment has at other versions (its gradio wants ``pillow<13``), so its servers run in
their own environment and tracerl speaks the session protocol itself (`client`, checked
against openenv's own client in the tests).

An episode is one session (a websocket: its own environment instance on the server, so
episodes never share state), reset with the task's arguments and the episode's id, and
closed when the episode ends. A server at its limit of sessions makes an episode wait for
a free one (``session_wait_s``), inside the episode's clock (it counts against its wall
time; a warning says so the first time). The first observation is the user message: its
``observation`` field's text (default: its one text field, else the observation as JSON),
then ``instruction`` if given.

The model's reply is the action: with ``action: <field>`` its text fills that field of the
environment's action (default: the action's one required text field, as in OpenEnv's text
environments); with ``action: json`` (the default when there is no such field) the reply is
the action, a JSON object (a fenced block too). A tracerl episode of text replies is one
reply long: a multi-turn OpenEnv environment ends after its first step, and as the
environment was not done, the reward so far is undecided, never trained on (a warning says
so), unless ``single_step: true`` (score an unfinished environment after its first step).

The reward is the environment's own: the sum of the rewards its steps returned. A reply
that is no action the environment takes (not JSON, or refused by the server and not
fitting the action's JSON schema from ``/schema``) scores 0, the policy's. A server that
cannot be reached, breaks the session, times out or raises while stepping makes the episode
the environment's failure, never trained on (not retried: the session's state is gone with
it); so does a step the server refuses for an action that fits the schema (openenv-core
answers VALIDATION_ERROR also for an observation the environment failed to build). The
server's ``state`` when the episode ends is its ``final_state``. Receipts name the adapter,
openenv-core's release (of the Python that serves the app) and the environment (its
``/metadata`` name and version).

Tasks: ``train`` and ``heldout`` are reset seeds (``train_size`` and ``heldout_size`` of
them, from ``seed * 10**7``, the held-out ones ``5 * 10**6`` above), with ``reset`` (the
arguments of every reset) added; or ``tasks``, each split a list of reset arguments. An
OpenEnv environment has no gold answers tracerl can see: ``check_actions`` is the reply
check-env plays (a list: its first reply; or an import path of a function of the task
returning the reply); without it check-env's reward check cannot pass.
"""

from tracerl.envs.adapters.openenv.env import OPENENV_REWARD, OpenEnv
from tracerl.envs.adapters.openenv.server import INSTALL, ServerError, find_python, stop_all

__all__ = ["INSTALL", "OPENENV_REWARD", "OpenEnv", "ServerError", "find_python", "stop_all"]
