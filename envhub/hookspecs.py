"""Every extension point of envhub, in one place (pluggy hook specifications, project name ``"envhub"``).

A plugin is a module named by an entry point in the ``envhub`` group::

    [project.entry-points.envhub]
    countdown = "envhub_countdown"

and implements one or more of the hooks below with ``@envhub.hookimpl``. The entry point's name is the id of the
env the plugin provides (a plugin registering several envs names its main one), which is what lets
``envhub.make("countdown")`` import only that plugin.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from envhub.plugins import SpecRegistry

hookspec = pluggy.HookspecMarker("envhub")
hookimpl = pluggy.HookimplMarker("envhub")

_ACTIVE: pluggy.PluginManager | None = None  # the process-wide hub's, once envhub.plugins.default_hub() made it


def active_plugin_manager() -> pluggy.PluginManager | None:
    """The plugin manager of the process-wide hub, or ``None`` before one exists (then no plugin is loaded).

    For the layers below the hub (the sandbox's runtime lookup), which call hooks but must not import
    :mod:`envhub.plugins` (that would close an import cycle: plugins -> spec -> env -> sandbox -> plugins): the hub
    registers its manager here when it is made.
    """
    return _ACTIVE


def set_active_plugin_manager(pm: pluggy.PluginManager | None) -> None:
    global _ACTIVE
    _ACTIVE = pm


@hookspec
def envhub_register(registry: SpecRegistry) -> None:
    """Register environments: call ``registry.register(EnvSpec(...))`` once per env the plugin provides."""


@hookspec
def envhub_tool_parsers() -> dict[str, Any]:
    """Return extra tool-call parsers, ``{name: parser}``; a parser turns decoded model text into an ``Action``.

    Used by the executor to pick a parser per model family (see ``envhub.codec.toolcall``).
    """


@hookspec
def envhub_sandbox_runtimes() -> dict[str, Any]:
    """Return extra sandbox runtimes, ``{name: Runtime class}`` (see ``envhub.sandbox.base.Runtime``)."""
