"""The code-repair environment (issue 9, in progress): so far, the sandbox that runs
model-written code (`tracerl.envs.coderepair.sandbox`)."""
