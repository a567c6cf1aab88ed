"""``envhub list | search | info | install | uninstall | registry``: browse the hub index and manage plugins.

The index is ``registry.toml`` (see :mod:`envhub.registry` for which file is used and its schema); what is
installed comes from package metadata (``envhub.plugins``), so ``list`` and ``search`` import no plugin and ``info``
imports only the one it shows.
"""
from __future__ import annotations

import json
from functools import wraps
from pathlib import Path
from typing import Any, Callable

import click

registry_option = click.option(
    "--registry", "registry_path", type=click.Path(dir_okay=False), default=None,
    help="Index to read first (browsing/install: above the user, project, $ENVHUB_REGISTRY and built-in indexes; "
         "registry add/verify: the one file to use).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
python_option = click.option(
    "--python", default=None, type=click.Path(dir_okay=False),
    help="Python interpreter of the environment to act on (default: this one).",
)


def _friendly(fn: Callable) -> Callable:
    """Turn the hub's expected errors into a one-line message and exit status 1 (no traceback)."""

    @wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        from envhub.plugins import PluginError, UnknownEnv
        from envhub.registry import RegistryError

        try:
            return fn(*args, **kwargs)
        except (RegistryError, PluginError, UnknownEnv) as e:
            raise click.ClickException(str(e)) from None

    return run


def _console():
    from rich.console import Console

    return Console()


def _installed() -> tuple[dict[str, Any], dict[str, str]]:
    """Installed plugins by id (metadata only) and the ids disabled by a collision, with why (only those ids)."""
    from envhub.plugins import default_hub

    hub = default_hub()
    refs = hub.refs()
    return refs, {env_id: str(c) for env_id, c in hub.collisions.items()}


def _rows(registry, ids: list[str], refs: dict[str, Any], clashes: dict[str, str] | None = None) -> list[dict[str, Any]]:
    rows = []
    for env_id in ids:
        entry, ref = registry.entries.get(env_id), refs.get(env_id)
        clash = (clashes or {}).get(env_id)
        rows.append({
            "collision": clash,
            "id": env_id,
            "version": entry.version if entry else "",
            "installed": ref.version if ref else None,
            "distribution": ref.distribution if ref else None,
            "admission": entry.admission_summary if entry else "-",
            "index": entry.origin if entry else "installed",
            "shadows": entry.shadows if entry else [],
            "tags": entry.tags if entry else [],
            "summary": entry.summary if entry else "(installed, not in the registry)",
        })
    return rows


def _table(rows: list[dict[str, Any]], title: str):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("id", "version", "installed", "index", "admission", "summary"):
        table.add_column(col, overflow="fold")
    for r in rows:
        installed = f"[green]{r['installed']}[/]" if r["installed"] else "[dim]-[/]"
        if r.get("collision"):
            installed = "[red]COLLISION[/]"
        index = r["index"] + "".join(f" [yellow](over {s})[/]" for s in r["shadows"])
        table.add_row(r["id"], r["version"] or "-", installed, index, r["admission"], r["summary"])
    return table


@click.command("list")
@registry_option
@json_option
@_friendly
def list_cmd(registry_path: str | None, as_json: bool) -> None:
    """List the registry's environments and which are installed (imports no plugin)."""
    from envhub.registry.layers import load_index

    registry = load_index(registry_path)
    refs, clashes = _installed()
    rows = _rows(registry, sorted(set(registry.entries) | set(refs) | set(clashes)), refs, clashes)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    console = _console()
    console.print(_table(rows, "envhub environments"))
    layers = "; ".join(layer.describe() for layer in registry.layers) or "none"
    console.print(f"[dim]indexes, highest priority first: {layers}[/]", soft_wrap=True)
    for clash in clashes.values():
        console.print(f"[red]disabled:[/] {clash}")


@click.command("search")
@click.argument("text", nargs=-1, required=True)
@registry_option
@json_option
@_friendly
def search_cmd(text: tuple[str, ...], registry_path: str | None, as_json: bool) -> None:
    """Find environments whose id, summary or tags contain every word of TEXT."""
    import difflib

    from envhub.registry.layers import load_index

    query = " ".join(text)
    registry = load_index(registry_path)
    refs, _ = _installed()
    ids = [e.id for e in registry.search(query)]
    ids += [i for i in sorted(refs) if i not in registry.entries and all(w in i.lower() for w in query.lower().split())]
    rows = _rows(registry, ids, refs)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    console = _console()
    if not rows:
        close = difflib.get_close_matches(query, sorted(set(registry.entries) | set(refs)), n=3, cutoff=0.5)
        console.print(f"no environment matches {query!r}." + (f" Did you mean: {', '.join(close)}?" if close else ""))
        return
    console.print(_table(rows, f"matching {query!r}"))


@click.command("info")
@click.argument("env_id")
@registry_option
@json_option
@_friendly
def info_cmd(env_id: str, registry_path: str | None, as_json: bool) -> None:
    """Show an environment: its registry entry, the installed plugin (loads only that one) and its admission."""
    from envhub.plugins import default_hub, unknown_message
    from envhub.registry.layers import load_index

    registry = load_index(registry_path)
    refs, clashes = _installed()
    entry, ref = registry.entries.get(env_id), refs.get(env_id)
    if entry is None and ref is None and env_id not in clashes:
        raise click.ClickException(unknown_message(env_id, sorted(set(registry.entries) | set(refs))))
    out: dict[str, Any] = {"id": env_id, "registry": entry.to_toml() if entry else None, "installed": None}
    if ref is not None:
        out["installed"] = {"distribution": ref.distribution, "version": ref.version, "module": ref.module}
        try:
            spec = default_hub().get(env_id)
            out["installed"].update(_describe_spec(spec))
        except Exception as e:  # a broken plugin is shown, not fatal: the registry entry is still worth reading
            out["installed"]["error"] = f"{type(e).__name__}: {e}"
    if entry and entry.admission.get("report"):
        out["admission_report"] = _report_summary(registry.resolve(entry.admission["report"], entry))
    if entry is not None:
        out["index"] = {"from": entry.origin, "shadows": entry.shadows}
    if env_id in clashes:
        out["collision"] = clashes[env_id]
    if as_json:
        click.echo(json.dumps(out, indent=2, default=str))
        return
    _print_info(out)


def _describe_spec(spec) -> dict[str, Any]:
    env = spec.make()
    try:
        tools = [t.name for t in getattr(env, "tools", [])]
    finally:
        env.close()
    try:
        n_tasks: Any = len(spec.load_tasks())
    except Exception as e:
        n_tasks = f"error: {type(e).__name__}: {e}"
    return {
        "spec_version": spec.version, "gym_id": spec.gym_id, "summary": spec.summary, "tags": list(spec.tags),
        "max_turns": spec.max_turns, "split": spec.default_split, "tasks": n_tasks, "tools": tools,
        "hack_probes": sorted(spec.hack_probes), "sandbox": spec.sandbox is not None,
    }


def _report_summary(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {"path": str(path), "error": "report file not found"}
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        return {"path": str(path), "error": f"unreadable report: {e}"}
    keys = ("fit", "unfit_reasons", "tasks_total", "tasks_admitted", "quarantined", "duration_s")
    return {"path": str(path), **{k: data.get(k) for k in keys}}


def _print_info(out: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"envhub info {out['id']}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in (out["registry"] or {}).items():
        if key != "admission":
            table.add_row(key, ", ".join(value) if isinstance(value, list) else str(value))
    if out["registry"] is None:
        table.add_row("registry", "[yellow]not in the registry[/]")
    adm = (out["registry"] or {}).get("admission")
    if adm:
        table.add_row("admission", f"{adm.get('passed')}/{adm.get('tasks')} tasks admitted ({adm.get('report', '')})")
    rep = out.get("admission_report")
    if rep:
        unfit = f"UNFIT: {', '.join(rep.get('unfit_reasons') or [])}"
        verdict = rep.get("error") or ("fit" if rep.get("fit") else unfit)
        table.add_row("verifier", verdict)
        for task_id, reasons in (rep.get("quarantined") or {}).items():
            table.add_row("quarantined", f"{task_id}: {'; '.join(reasons)}")
    inst = out["installed"]
    if inst is None:
        table.add_row("installed", f"[dim]no[/] (envhub install {out['id']})")
    else:
        table.add_row("installed", f"[green]{inst['distribution']} {inst['version']}[/] ({inst['module']})")
        for key in ("gym_id", "tasks", "split", "max_turns", "tools", "hack_probes", "sandbox", "error"):
            if key in inst:
                value = inst[key]
                table.add_row(key, (", ".join(value) or "-") if isinstance(value, list) else str(value))
    console = _console()
    console.print(table)
    if out.get("collision"):
        console.print(f"[red]disabled:[/] {out['collision']}")


def _pip_options(python: str | None, **kw: Any):
    import sys

    from envhub.registry import PipOptions

    return PipOptions(python=python or sys.executable, **kw)


@click.command("install")
@click.argument("target", metavar="ID[==VERSION]")
@click.option("--no-deps", is_flag=True, help="Do not install the plugin's dependencies (development only).")
@click.option("--no-build-isolation", is_flag=True, help="Build with the target environment's own setuptools.")
@click.option("--find-links", multiple=True, help="Also look for wheels here (passed to pip; repeatable).")
@click.option("--no-index", is_flag=True, help="Do not use the package index (offline installs).")
@python_option
@registry_option
@_friendly
def install_cmd(target: str, no_deps: bool, no_build_isolation: bool, find_links: tuple[str, ...], no_index: bool,
                python: str | None, registry_path: str | None) -> None:
    """Install an environment from the registry: check its sha256, pip-install it, confirm the plugin loads."""
    from envhub.registry import install
    from envhub.registry.layers import load_index

    console = _console()
    registry = load_index(registry_path)
    opts = _pip_options(python, no_deps=no_deps, no_build_isolation=no_build_isolation, find_links=find_links,
                        no_index=no_index)
    res = install(registry, target, opts, log=lambda s: console.print(f"[dim]{s}[/]"))
    for w in res.warnings:
        console.print(f"[yellow]warning:[/] {w}")
    console.print(f"[green]installed[/] {res.env_id} {res.version} ({res.distribution}, sha256 {res.sha256[:16]}...)")


@click.command("uninstall")
@click.argument("env_id")
@click.option("--dist", "distribution", default=None,
              help="Which distribution to remove when two claim ENV_ID (a collision).")
@python_option
@_friendly
def uninstall_cmd(env_id: str, distribution: str | None, python: str | None) -> None:
    """Uninstall the package that provides an environment."""
    from envhub.registry import uninstall

    res = uninstall(env_id, _pip_options(python), distribution=distribution)
    _console().print(f"[green]uninstalled[/] {res.distribution} {res.version} (provided {res.env_id})")


@click.group("registry")
def registry_group() -> None:
    """Maintain an index file (registry.toml): publish entries (wheel + hashes + admission), check them."""


@click.command("add")
@click.argument("path", type=click.Path(exists=True, file_okay=False))
@click.option("--tasks", "n", type=int, default=None, help="Admit only the first N tasks (default: all).")
@click.option("--concurrency", type=int, default=4, show_default=True, help="Admission episodes run at once.")
@click.option("--force", is_flag=True, help="Write the entry even when admission finds the verifier unfit.")
@click.option("--tree", is_flag=True,
              help="Name the source tree instead of building a wheel (local development indexes only: a tree path "
                   "resolves nowhere else).")
@click.option("--reuse-admission", is_flag=True,
              help="Keep the entry's admission (table and report) instead of running it again; refused unless the "
                   "tree's content hash is the one that admission ran on.")
@registry_option
@_friendly
def add_cmd(path: str, n: int | None, concurrency: int, force: bool, tree: bool, reuse_admission: bool,
            registry_path: str | None) -> None:
    """Run admission on the plugin at PATH, build its wheel into wheels/ beside the registry, and write its entry
    (wheel sha256, source tree hash, admission summary). Nothing is written when admission refuses it.

    Which index: --registry PATH, else $ENVHUB_REGISTRY, else the nearest registry.toml upward (a project's), else
    the user's index ($XDG_CONFIG_HOME/envhub/registry.toml, default ~/.config/envhub/registry.toml), which every
    `envhub list` and `install` reads. The index built into envhub is written only when named with --registry."""
    from envhub.registry import Registry, publish
    from envhub.registry.layers import write_target

    console = _console()
    target, why = write_target(registry_path)
    if not registry_path:
        console.print(f"[dim]writing {target}: {why}; --registry PATH writes another[/]", soft_wrap=True)
    registry = Registry.load(target)
    results = publish(path, registry, n=n, force=force, concurrency=concurrency, wheel=not tree,
                      reuse_admission=reuse_admission, log=lambda s: console.print(f"[dim]{s}[/]", soft_wrap=True))
    for r in results:
        for w in r.warnings:
            console.print(f"[yellow]warning:[/] {w}")
        verdict = "[green]fit[/]" if r.fit else f"[red]UNFIT[/] ({', '.join(r.unfit_reasons)})"
        e = r.entry
        console.print(f"wrote [bold]{e.id}[/] {e.version} to {registry.path}: admission {e.admission_summary}"
                      f"{' (reused)' if r.reused else ''}, verifier {verdict}, source {e.source}, "
                      f"sha256 {e.sha256[:16]}..., report {e.admission['report']}", soft_wrap=True)


@click.command("hash")
@click.argument("path", type=click.Path(exists=True))
def hash_cmd(path: str) -> None:
    """Print the registry sha256 of PATH (content hash of a source tree, or sha256 of a wheel/sdist)."""
    from envhub.registry import compute_sha256

    click.echo(compute_sha256(path))


@click.command("verify")
@click.option("--rebuild", is_flag=True,
              help="Also rebuild each wheel from its source tree and compare (bytes, else contents).")
@registry_option
@_friendly
def verify_cmd(rebuild: bool, registry_path: str | None) -> None:
    """Check every entry with a local source against its sha256, and each wheel built by `registry add` against its
    source tree (stale when the tree changed since). Exit 1 on any mismatch. Installs nothing."""
    from envhub.registry import load_registry, verify

    registry = load_registry(registry_path)
    checks = verify(registry, rebuild=rebuild)
    for c in checks:
        click.echo(f"{c.status:<6} {c.env_id}: {c.message}")
    bad = sum(c.bad for c in checks)
    if bad:
        raise click.ClickException(f"{bad} entr{'y' if bad == 1 else 'ies'} of {registry.path} do not match")


registry_group.add_command(add_cmd)
registry_group.add_command(add_cmd, name="publish")
registry_group.add_command(hash_cmd)
registry_group.add_command(verify_cmd)
