"""The process-wide plugin manager, for the layers below the hub that call hooks without importing it.

The sandbox layer asks plugins for extra runtimes (``envhub_sandbox_runtimes``), but it sits beneath the env
contract that the plugin hub imports: importing :mod:`envhub.plugins` from there would close a loop
(plugins -> spec -> env -> sandbox -> plugins). So the hub, when it is made, hands its manager to :func:`use`, and
the lower layer reads it back with :func:`current`. Before a hub exists no plugin is loaded, and ``current()`` is
``None``: the lower layer then knows only its built-ins, which is what "no plugin loaded" means.
:mod:`envhub.hookspecs` stays declarations only.
"""
from __future__ import annotations

from typing import Any

_manager: Any = None


def use(pm: Any) -> None:
    """Make ``pm`` (a ``pluggy.PluginManager``, or ``None`` to forget it) the one lower layers call hooks through."""
    global _manager
    _manager = pm


def current() -> Any:
    """The manager handed to :func:`use`, or ``None`` before the hub is made."""
    return _manager
