"""The ``envhub`` command line.

Each command lives in a small module of this package and is imported only when it runs (``envhub --help`` stays
fast and never imports torch). The table below is the whole command surface.
"""
from __future__ import annotations

import importlib

import click

COMMANDS: dict[str, str] = {
    # hub: browse and install (envhub.cli.hub)
    "list": "envhub.cli.hub:list_cmd",
    "search": "envhub.cli.hub:search_cmd",
    "info": "envhub.cli.hub:info_cmd",
    "install": "envhub.cli.hub:install_cmd",
    "uninstall": "envhub.cli.hub:uninstall_cmd",
    "registry": "envhub.cli.hub:registry_group",
    # authoring
    "init": "envhub.cli.authoring:init_cmd",
    "validate": "envhub.cli.validate:validate_cmd",
    # running
    "rollout": "envhub.cli.rollout:rollout_cmd",
    "check-trajectory": "envhub.cli.rollout:check_trajectory_cmd",
    "show": "envhub.cli.runs:show_cmd",
    "demo": "envhub.cli.demo:demo_cmd",
    # serving
    "serve": "envhub.cli.serve:serve_cmd",
    "status": "envhub.cli.serve:status_cmd",
    "top": "envhub.cli.top:top_cmd",
    "gateway": "envhub.cli.gateway:gateway_cmd",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(module), attr)

    def invoke(self, ctx: click.Context):
        # Ctrl-C that reaches here ends the command with 130 (128 + SIGINT, as the help promises), not click's
        # "Aborted!" and 1 (see envhub.cli.interrupt)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(130)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="envhub")
def main() -> None:
    """envhub: verified environments for reinforcement learning of LLM agents."""
