"""``envhub serve`` (the rollout service) and ``envhub status URL``."""
from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.table import Table

from envhub.cli.common import console


def _load_plugins(plugins: tuple[str, ...]) -> list[str]:
    """Make extra envs available: a plugin source directory (not installed) or an importable plugin module."""
    import importlib
    from pathlib import Path

    from envhub.plugins import PluginError, default_hub, load_path

    ids = []
    for target in plugins:
        try:
            if Path(target).is_dir():
                specs = load_path(target)
            else:
                specs = default_hub().load_module(importlib.import_module(target), target)
        except (ImportError, PluginError) as e:
            raise click.ClickException(f"--plugin {target}: {e}") from None
        ids += [s.id for s in specs]
    return ids


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but loopback requires a bearer token.")
@click.option("--port", type=int, default=8006, show_default=True, help="Port (0: a free one).")
@click.option("--init-workers", type=int, default=8, show_default=True, help="INIT pool: sandbox starts, env resets.")
@click.option("--run-workers", type=int, default=16, show_default=True, help="RUN pool: concurrent agent loops.")
@click.option("--eval-workers", type=int, default=4, show_default=True, help="EVAL pool: concurrent verifiers.")
@click.option("--backend", "backends", multiple=True,
              help="An LLM server (http://host:port[/v1], vLLM or SGLang) or 'golden' (the envs' golden players); "
                   "repeatable. More can be added at runtime: POST /add_llm_server.")
@click.option("--tokenizer", default=None,
              help="The served model's tokenizer (name or path; default smollm2 when installed, else tiny).")
@click.option("--timeout", type=float, default=300.0, show_default=True,
              help="Default per-job timeout in seconds, counting only time inside stages.")
@click.option("--sandbox-pool", type=int, default=2, show_default=True,
              help="Prewarmed sandboxes kept per repeating sandbox spec.")
@click.option("--max-sandboxes", type=int, default=None,
              help="Live sandboxes at most; at the limit jobs wait in INIT (see /status) instead of failing. "
                   "Default: what this node's open-files limit and memory allow.")
@click.option("--plugin", "plugins", multiple=True, help="Also serve the envs of a plugin directory or module.")
@click.option("--token", default=None, envvar="ENVHUB_SERVICE_TOKEN",
              help="Bearer token required on every endpoint (generated when binding beyond loopback without one).")
@click.option("--no-autostart", is_flag=True, help="Wait for POST /start before accepting jobs.")
@click.option("--max-body-mb", type=float, default=None, help="Request body cap (default 16 MB).")
@click.option("--log-level", default="warning", show_default=True)
@click.option("--preflight", "preflight_only", is_flag=True,
              help="Only check this node for the requested concurrency (descriptors, processes, sandbox runtime, "
                   "memory, disk, backends), print the findings and exit (1 if refused).")
@click.option("--no-preflight", is_flag=True, help="Skip the checks the server runs before it starts.")
@click.option("--concurrency", type=int, default=None,
              help="Sandboxes alive at once the preflight checks for (default: init + run workers).")
@click.option("--sandbox-runtime", default=None,
              help="The sandbox runtime the preflight must find working (default: any; a missing one only warns).")
@click.option("--controller", type=click.Choice(["off", "aimd"]), default="off", show_default=True,
              help="Adjust the rollouts in flight at run time from the LLM servers' queues and KV-cache usage "
                   "(AIMD; docs/metrics.md, 'The controller'). Off: the pools alone bound concurrency.")
@click.option("--controller-start", type=int, default=4, show_default=True, help="The controller's starting limit.")
@click.option("--controller-max", type=int, default=None,
              help="The controller's largest limit (default: init + run + eval workers); the sandbox limit and the "
                   "staleness gate bound it too.")
@click.option("--controller-interval", type=float, default=1.0, show_default=True,
              help="Seconds between the controller's decisions.")
@click.option("--controller-knob", "controller_knobs", multiple=True, metavar="NAME=VALUE",
              help="Any other setting of envhub.service.controller.Knobs (beta=0.5, queue_high=1.0...); repeatable.")
def serve_cmd(host, port, init_workers, run_workers, eval_workers, backends, tokenizer, timeout, sandbox_pool,
              max_sandboxes, plugins, token, no_autostart, max_body_mb, log_level, preflight_only, no_preflight,
              concurrency, sandbox_runtime, controller, controller_start, controller_max, controller_interval,
              controller_knobs):
    """Serve rollouts over HTTP (the ProRL Agent API): POST /process, /cancel, /add_llm_server, /status..."""
    import secrets

    from envhub.cli.common import default_tokenizer
    from envhub.testing.models import load_tokenizer, resolve_model
    from envhub.http.server import is_loopback
    from envhub.service.server import serve
    from envhub.service.service import RolloutService

    for name, n in (("--init-workers", init_workers), ("--run-workers", run_workers),
                    ("--eval-workers", eval_workers)):
        if n < 1:
            raise click.BadParameter(f"must be >= 1, got {n}", param_hint=name)
    if max_sandboxes is not None and max_sandboxes < 1:
        raise click.BadParameter(f"must be >= 1, got {max_sandboxes}", param_hint="--max-sandboxes")
    if max_body_mb is not None and max_body_mb <= 0:
        raise click.BadParameter(f"must be > 0, got {max_body_mb}", param_hint="--max-body-mb")
    if concurrency is not None and concurrency < 1:
        raise click.BadParameter(f"must be >= 1, got {concurrency}", param_hint="--concurrency")
    knobs = _controller_knobs(controller, controller_start, controller_max, controller_interval, controller_knobs)
    if preflight_only or not no_preflight:
        _preflight(concurrency or init_workers + run_workers, list(backends), sandbox_runtime, max_sandboxes,
                   only=preflight_only)
        if preflight_only:
            return
    extra = _load_plugins(plugins)
    generated = False
    if not is_loopback(host) and not token:
        token, generated = secrets.token_urlsafe(24), True
    tok_name = tokenizer or default_tokenizer()
    tok = load_tokenizer(resolve_model(tok_name))
    try:
        service = RolloutService(tok, backends=list(backends), init_workers=init_workers, run_workers=run_workers,
                                 eval_workers=eval_workers, timeout_s=timeout or None, sandbox_pool=sandbox_pool,
                                 max_sandboxes=max_sandboxes, controller=knobs)
    except Exception as e:
        raise click.ClickException(str(e)) from None

    def ready(bound_port: int) -> None:
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        url = f"http://{shown}:{bound_port}"
        names = ", ".join(service.pool.backends) or "none yet (POST /add_llm_server)"
        # one plain line first, for scripts that wait for the server: "listening on URL"
        print(f"envhub rollout service listening on {url}", flush=True)
        console.print(f"  bound to {host}:{bound_port}; workers init={init_workers} run={run_workers} "
                      f"eval={eval_workers}; tokenizer {tok_name}; backends: {names}"
                      + (f"; extra envs: {', '.join(extra)}" if extra else ""), soft_wrap=True)
        if token:  # plain print: a wrapped token would be copied wrong
            print("  bearer token required on every endpoint" + (f" (generated): {token}" if generated else ""),
                  flush=True)
        if knobs is not None:
            c = service.controller.knobs
            console.print(f"  controller: aimd from {c.start} rollouts in flight, at most {c.max} (and the sandbox "
                          f"limit, the staleness gate), a decision every {c.interval_s:g}s", soft_wrap=True)
        console.print(f"  API schema: {url}/docs   status: envhub status {url}", soft_wrap=True)
        sys.stdout.flush()

    limits = {"max_body_bytes": int(max_body_mb * (1 << 20))} if max_body_mb else {}
    serve(service, host=host, port=port, token=token, autostart=not no_autostart, log_level=log_level,
          on_ready=ready, **limits)


def _controller_knobs(kind: str, start: int, most: int | None, interval: float, extra: tuple[str, ...]) -> Any:
    """The controller's :class:`~envhub.service.controller.Knobs` from the flags (``None``: off); a bad value is a
    usage error naming the flag."""
    if kind == "off":
        if extra or most is not None:
            raise click.BadParameter("set --controller aimd to use the controller's settings", param_hint="--controller")
        return None
    from dataclasses import fields

    from envhub.service.controller import Knobs

    types = {f.name: f.type for f in fields(Knobs)}
    given: dict[str, Any] = {"start": start, "max": most, "interval_s": interval}
    for item in extra:
        name, sep, raw = item.partition("=")
        name = name.strip().replace("-", "_")
        if not sep or name not in types or name in ("start", "max", "interval_s"):
            raise click.BadParameter(f"{item!r}: expected NAME=VALUE with NAME one of "
                                     f"{sorted(set(types) - {'start', 'max', 'interval_s'})}",
                                     param_hint="--controller-knob")
        try:
            given[name] = int(raw) if "int" in str(types[name]) else float(raw)
        except ValueError:
            raise click.BadParameter(f"{item!r}: {raw!r} is not a number", param_hint="--controller-knob") from None
    try:
        return Knobs(**given)
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--controller-*") from None


def _preflight(concurrency: int, backends: list[str], runtime: str | None, max_sandboxes: int | None, *,
               only: bool) -> None:
    """Run :func:`envhub.service.preflight.preflight`; refuse (exit 1) with the failed checks' one-line reasons."""
    from envhub.service.preflight import preflight

    checks = preflight(concurrency, backends=backends, runtime=runtime or "auto", runtime_required=runtime is not None,
                       max_sandboxes=max_sandboxes)
    refused = [c for c in checks if not c.ok and c.fatal]
    for c in checks:
        if only or not c.ok:  # at start-up only what needs attention is printed
            click.echo(f"preflight {c.line()}", err=bool(refused) and not c.ok)
    if refused:
        raise click.ClickException("preflight refused to start: " + "; ".join(f"{c.name}: {c.detail}"
                                                                                for c in refused))


@click.command("status")
@click.argument("url")
@click.option("--token", default=None, envvar="ENVHUB_SERVICE_TOKEN", help="Bearer token of the server.")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON.")
def status_cmd(url: str, token: str | None, as_json: bool) -> None:
    """Show a rollout server's queues, in-flight jobs per stage, job counts and backends."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/status", headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise click.ClickException(f"cannot reach {url}: {type(e).__name__}: {e}") from None
    if resp.status_code != 200:
        raise click.ClickException(f"{url}/status answered {resp.status_code}: {resp.text[:300]}")
    st = resp.json()
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return
    console.print(f"[bold]{url}[/]: {st['status']}, up {st.get('uptime_s', 0):.0f}s, "
                  f"timeout {st.get('timeout_s')}s")
    stages = Table(title="stages")
    for col in ("stage", "workers", "queued", "in flight"):
        stages.add_column(col, justify="right" if col != "stage" else "left")
    for name, s in st["stages"].items():
        stages.add_row(name.upper(), str(s["workers"]), str(s["queued"]), str(s["in_flight"]))
    console.print(stages)
    console.print("jobs: " + ", ".join(f"{k}={v}" for k, v in st["jobs"].items()))
    backends = Table(title="backends")
    for col in ("name", "type", "assigned", "in flight", "requests", "healthy", "last error"):
        backends.add_column(col)
    for b in st["backends"]:
        backends.add_row(b["name"], b["type"], str(b["assigned"]), str(b["in_flight"]), str(b["requests"]),
                         "yes" if b["healthy"] else "[red]no[/]", (b.get("last_error") or "")[:60])
    console.print(backends if st["backends"] else "backends: none (POST /add_llm_server)")
    sb = st.get("sandboxes", {})
    console.print(f"sandboxes: live={sb.get('live', 0)} prewarmed={sb.get('ready', 0)} pools={sb.get('pools', 0)}")
    ctl = st.get("controller")
    if ctl:  # --controller aimd: the limit, what bounds it, and the last decision with its reason
        last = ctl["log"][-1] if ctl.get("log") else None
        console.print(f"controller: limit {ctl['limit']} ({ctl['in_flight']} in flight, ceiling {ctl['ceiling']} by "
                      f"{ctl['ceiling_by']}), oversampling {ctl['oversampling']:g}"
                      + (f"; last: {last['action']} {last['old']} -> {last['new']}: {last['reason']}" if last else ""),
                      soft_wrap=True)
