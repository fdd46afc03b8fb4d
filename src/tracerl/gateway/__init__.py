"""Bring your own agent: an OpenAI-compatible chat endpoint that records, token by token,
what the model really sampled for an agent harness that does not know tracerl.

* `GatewaySession` (`tracerl.gateway.session`): one episode's requests turned into a
  provenance-tagged token stream; history rewrites become recorded breaks, never splices.
* `Gateway` (`tracerl.gateway.server`): ``/v1/chat/completions`` over sessions named by the
  client's API key, ``user`` field or ``X-Tracerl-Session`` header.
* `AgentBackend` (`tracerl.gateway.agent`): ``agent: mypkg.agent:solve`` in a config; each
  episode is one call of the agent with an ``openai.AsyncOpenAI`` client, bounded in time
  and requests, attributed when it fails.
* `replay_exact`, `replay_live` (`tracerl.gateway.replay`): replay any recorded episode; a
  gateway episode exactly from its recorded requests and completions, or live by re-running
  the agent against them.

See docs/gateway.md.
"""

from tracerl.gateway.agent import AgentBackend, agent_backend
from tracerl.gateway.chat import GatewayError
from tracerl.gateway.harness import AgentOutcome, load_agent
from tracerl.gateway.server import Gateway
from tracerl.gateway.session import GatewaySession, new_token

__all__ = [
    "AgentBackend",
    "AgentOutcome",
    "Gateway",
    "GatewayError",
    "GatewaySession",
    "agent_backend",
    "load_agent",
    "new_token",
]
