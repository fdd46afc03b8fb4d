"""Agents written with real agent frameworks, as each framework's docs write one, and no
tracerl import: only their base URL and key point at tracerl. Each solves
`examples/calculator_agent.yaml`'s task (the arithmetic environment: the sum's last digit,
with an ``add`` tool), so `tracerl train examples/calculator_agent.yaml agent=...` trains it
(tests/integration/test_frameworks.py) and the gateway tests script it
(tests/unit/test_gateway_frameworks.py)."""
