"""``envhub gateway``: serve any envhub backend behind OpenAI / Anthropic / Gemini-compatible routes that record exact
tokens."""
from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace

import click



def _policy(target: str | None):
    if target is None:
        raise click.UsageError("--model golden needs --policy module:function (a policy(task, messages) -> Action)")
    module, _, attr = target.partition(":")
    try:
        return getattr(importlib.import_module(module), attr or "policy")
    except (ImportError, AttributeError) as e:
        raise click.UsageError(f"--policy {target}: {e}") from None


@click.command("gateway")
@click.option("--model", "-m", required=True,
              help="As for envhub rollout: a model name or path (transformers), http://host:port (a token-id "
                   "server: vLLM, SGLang), or golden (a scripted --policy).")
@click.option("--tokenizer", default=None, help="The model's tokenizer (name or path); default: the model's own.")
@click.option("--policy", default=None, help="module:function, for --model golden.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address; anything but loopback needs --token.")
@click.option("--port", type=int, default=8090, show_default=True, help="Port (0: a free one).")
@click.option("--token", default=None, envvar="ENVHUB_GATEWAY_TOKEN",
              help="Admin key for the control routes (start_session, export...); required beyond loopback.")
@click.option("--served-name", default="envhub", show_default=True, help="Model name in replies and /v1/models.")
@click.option("--max-model-len", type=int, default=32768, show_default=True,
              help="Prompt + completion tokens; capped by the backend's own context (a model's "
                   "max_position_embeddings, a vLLM/SGLang server's max_model_len). A longer prompt gets the "
                   "provider's context-length error before the backend is called.")
@click.option("--system-tool-list", is_flag=True, default=False,
              help="For a chat template that does not render tools (SmolLM2's), append the tool list to the system "
                   "message. Off by default: vLLM's server renders no tool definitions for such a template, and the "
                   "policy should train on the prompts it will be served.")
@click.option("--max-tokens", type=int, default=1024, show_default=True,
              help="Completion budget when a request names none.")
@click.option("--capacity", type=int, default=None, help="Initial AReaL capacity for /rl/start_session.")
@click.option("--max-body-mb", type=float, default=None, help="Request body cap (default 16 MB).")
@click.option("--log-level", default="warning", show_default=True)
def gateway_cmd(model, tokenizer, policy, host, port, token, served_name, max_model_len, system_tool_list, max_tokens,
                capacity, max_body_mb, log_level):
    """Serve a model to black-box agents (Codex CLI, Claude Code, SDK apps) and record their exact tokens.

    Start a session (POST /rl/start_session or /sessions), give the agent the session key as its API key and
    http://HOST:PORT/v1 as its base URL, then fetch trajectories (POST /sessions/ID/trajectories, or AReaL's
    /export_trajectories). See docs/gateway.md."""
    from envhub.cli.common import load_backend
    from envhub.gateway import Gateway
    from envhub.gateway.context import effective_limit
    from envhub.gateway.server import check_gateway_binding, serve
    from envhub.http.server import bind

    # the cheap checks first, each one line naming what to change: the address, then the port (bound now, so a busy
    # port is not found after the model's weights load), then the model
    try:
        check_gateway_binding(host, token)
    except ValueError as e:
        raise click.ClickException(f"--host {host}: {e}") from None
    try:
        sock = bind(host, port)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port (0: any "
                                   "free port) or stop what holds it") from None
    spec = SimpleNamespace(golden=_policy(policy) if model == "golden" else None)
    try:
        backend, tok, tok_name = load_backend(model, spec, tokenizer)
    except click.ClickException:
        sock.close()
        raise
    except (OSError, ValueError, ImportError) as e:  # an unknown name, a missing directory, a bad spec
        sock.close()
        raise click.ClickException(f"--model {model}: {e}") from None
    gw = Gateway(backend, tok, max_model_len=effective_limit(max_model_len, backend), default_max_tokens=max_tokens,
                 capacity=capacity, system_tool_list=system_tool_list)

    def ready(bound: int) -> None:
        click.echo(json.dumps({"gateway": f"http://{host}:{bound}", "model": model, "tokenizer": tok_name,
                               "openai_base_url": f"http://{host}:{bound}/v1",
                               "anthropic_base_url": f"http://{host}:{bound}",
                               "gemini_base_url": f"http://{host}:{bound}",
                               "max_model_len": gw.max_model_len}))  # one line: scripts parse it
        sys.stdout.flush()

    try:
        serve(gw, host=host, port=port, token=token, on_ready=ready, sock=sock, model_name=served_name,
              log_level=log_level, max_body_bytes=int(max_body_mb * (1 << 20)) if max_body_mb else None)
    except KeyboardInterrupt:  # uvicorn re-raises the SIGINT it handled once it has shut down: a requested stop
        click.echo("envhub gateway: stopped", err=True)
        sys.exit(130)
