"""`tracerl serve` (a model over the OpenAI-compatible completion subset and chat
completions, `tracerl.rollout.serve`) and `tracerl gateway` (the gateway on its own,
recording an agent harness's sessions, `tracerl.gateway.standalone`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SPEC_HELP = "model spec: smollm2-135m-instruct, tiny-random, hf:DIR, run:RUN[@STEP]"


def serve_command(
    model: Annotated[str, typer.Argument(help=SPEC_HELP)],
    port: Annotated[int, typer.Option(help="port to listen on", min=0, max=65535)] = 8000,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    temperature: Annotated[
        float, typer.Option(help="sampling temperature (0: greedy, as a judge asks)", min=0.0)
    ] = 1.0,
    max_batch_size: Annotated[int, typer.Option(help="requests sampled together", min=1)] = 16,
    enable_lora: Annotated[
        bool, typer.Option(help="accept LoRA adapter hot-loads (/v1/load_lora_adapter)")
    ] = False,
    kv_cache: Annotated[
        str, typer.Option(help="dynamic, or static: slots allocated once (model.kv_cache)")
    ] = "dynamic",
    compile: Annotated[
        bool, typer.Option(help="torch.compile the decode step (needs --kv-cache static)")
    ] = False,
) -> None:
    """Serve a model over the OpenAI-compatible completion subset (token ids in and out) and
    chat completions (text in and out, through the model's chat template)."""
    from tracerl.cli.common import port_free
    from tracerl.models import ModelNotFoundError, load
    from tracerl.models.placement import for_inference
    from tracerl.rollout.serve import serve_model

    if kv_cache not in ("dynamic", "static") or (compile and kv_cache != "static"):
        typer.echo(
            f"error: --kv-cache is 'dynamic' or 'static' (got {kv_cache!r}), and --compile "
            "needs --kv-cache static",
            err=True,
        )
        raise typer.Exit(2)
    port_free(host, port)  # before the model loads
    try:
        bundle = load(model)
    except ModelNotFoundError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    bundle.model = for_inference(bundle.model)  # the GPU when there is one
    serve_model(
        bundle,
        model,
        host=host,
        port=port,
        temperature=temperature,
        max_batch_size=max_batch_size,
        enable_lora=enable_lora,
        kv_cache=kv_cache,
        compile=compile,
        log=typer.echo,
    )


def gateway_command(
    model: Annotated[str, typer.Argument(help=SPEC_HELP)],
    port: Annotated[int, typer.Option(help="port to listen on", min=0, max=65535)] = 8001,
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    out: Annotated[Path, typer.Option(help="where ended sessions are written")] = Path(
        "runs/gateway"
    ),
    temperature: Annotated[
        float, typer.Option(help="sampling temperature (0: greedy)", min=0.0)
    ] = 1.0,
    max_turn_tokens: Annotated[
        int, typer.Option(help="the most tokens a turn samples", min=1)
    ] = 256,
    max_requests: Annotated[
        int, typer.Option(help="model turns a session may ask for", min=1)
    ] = 32,
    parser: Annotated[
        str | None, typer.Option(help="tool-call parser (default: the model family's)")
    ] = None,
) -> None:
    """Serve a model to any agent, recording every session's tokens with their authors.

    The OpenAI Chat Completions and Responses APIs and Anthropic's Messages API; each
    session ends into OUT as an episode."""
    from tracerl.cli.common import port_free
    from tracerl.gateway.standalone import run_gateway

    port_free(host, port)  # before the model loads
    run_gateway(
        model,
        port=port,
        host=host,
        out=out,
        temperature=temperature,
        max_turn_tokens=max_turn_tokens,
        max_requests=max_requests,
        parser=parser,
        log=typer.echo,
    )
