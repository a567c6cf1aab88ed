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
