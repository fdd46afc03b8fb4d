"""The arithmetic environment and its OpenEnv apps (served by the adapter in the tests).

`app` serves up to 64 sessions at once; `app_single` one (a second episode waits).
A reply of ``raise`` makes the environment raise while stepping, and one of ``misreport``
makes it build an observation its own class refuses (pydantic's ValidationError, which
openenv-core answers as VALIDATION_ERROR, as it answers an action that does not fit): two
environment bugs.
"""

from __future__ import annotations

from uuid import uuid4

from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata, State

from tests.openenv_arith import problem, score
from tests.openenv_arith.models import ArithAction, ArithObservation


class ArithEnvironment(Environment):
    """One question per episode; the reply is scored and ends it."""

    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._question, self._answer = problem(None)

    def reset(self, seed: int | None = None, episode_id: str | None = None) -> ArithObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._question, self._answer = problem(seed)
        return ArithObservation(prompt=self._question, done=False, reward=None)

    def step(self, action: ArithAction) -> ArithObservation:  # type: ignore[override]
        if action.message == "raise":
            raise RuntimeError("the arithmetic environment broke")
        if action.message == "misreport":  # a reward that is no number: the class refuses it
            return ArithObservation(prompt=self._question, done=True, reward="one")  # type: ignore[arg-type]
        self._state.step_count += 1
        return ArithObservation(
            prompt=self._question,
            answer=self._answer,
            done=True,
            reward=score(action.message, self._answer),
        )

    @property
    def state(self) -> State:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="ArithEnvironment", description="Add two digits", version="1.0.0"
        )


app = create_app(ArithEnvironment, ArithAction, ArithObservation, max_concurrent_envs=64)
app_single = create_app(ArithEnvironment, ArithAction, ArithObservation, max_concurrent_envs=1)
