"""Which runtime runs a sandbox: the built-in ones, those plugins add (``envhub_sandbox_runtimes``), and
:func:`start`, ``ToolEnv``'s default sandbox factory. Plugins are reached through the manager the hub hands to
:mod:`envhub.hookrelay` (this layer sits below the hub and never imports it)."""
from __future__ import annotations

import logging

from envhub import hookrelay
from envhub.sandbox.base import Runtime, RuntimeUnavailable, Sandbox, SandboxError, SandboxSpec


def _builtin() -> dict[str, type[Runtime]]:
    from envhub.sandbox.bwrap import BwrapRuntime
    from envhub.sandbox.local import LocalRuntime
    from envhub.sandbox.singularity import ApptainerRuntime, SingularityRuntime

    return {"bwrap": BwrapRuntime, "singularity": SingularityRuntime, "apptainer": ApptainerRuntime,
            "local": LocalRuntime}


def _plugin_runtimes() -> dict[str, type[Runtime]]:
    """Runtimes registered by plugins (``envhub_sandbox_runtimes`` hook). Only already-loaded plugins are asked; one
    whose hook raises is left out and named in the log, the others' runtimes still count."""
    pm = hookrelay.current()
    found: dict[str, type[Runtime]] = {}
    for impl in reversed(pm.hook.envhub_sandbox_runtimes.get_hookimpls() if pm is not None else []):  # pluggy's call order
        try:
            found.update(impl.function() or {})
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
            logging.getLogger(__name__).warning(
                "plugin %s: its envhub_sandbox_runtimes hook raised %s", impl.plugin_name, error, exc_info=True,
                extra={"plugin": impl.plugin_name, "hook": "envhub_sandbox_runtimes", "error": error})
    return found


def available_runtimes() -> dict[str, bool]:
    """``{name: usable on this host}`` for every known runtime."""
    return {name: bool(cls.available()) for name, cls in {**_plugin_runtimes(), **_builtin()}.items()}


def get_runtime(name: str = "auto") -> Runtime:
    """The runtime called ``name``. ``"auto"``: bwrap if installed, else an installed Apptainer/Singularity; never
    ``local`` (no isolation must be asked for by name). Raises :class:`RuntimeUnavailable` saying what to install."""
    builtin = _builtin()
    if name == "auto":
        for candidate in ("bwrap", "apptainer", "singularity"):
            if builtin[candidate].available():
                return builtin[candidate]()
        raise RuntimeUnavailable("no sandbox runtime is installed: apt-get install bubblewrap (or install "
                                 "Apptainer); runtime='local' runs without isolation if you really mean it")
    cls = builtin.get(name) or _plugin_runtimes().get(name)
    if cls is None:
        known = sorted(set(builtin) | set(_plugin_runtimes()))
        raise RuntimeUnavailable(f"unknown sandbox runtime {name!r}; known: {', '.join(known)}")
    return cls()


def start(spec: SandboxSpec | None = None, **overrides) -> Sandbox:
    """Start a sandbox for ``spec`` with the runtime ``spec.runtime`` names (this is ``ToolEnv``'s default factory)."""
    spec = spec or SandboxSpec()
    if overrides:
        from dataclasses import replace

        spec = replace(spec, **overrides)
    runtime = get_runtime(spec.runtime)
    try:
        return runtime.start(spec)
    except OSError as e:
        from envhub.fdlimit import is_out_of_descriptors, out_of_descriptors

        if is_out_of_descriptors(e):  # name the limit instead of a bare "[Errno 24] Too many open files"
            raise SandboxError(out_of_descriptors(f"starting a {spec.runtime} sandbox", e)) from None
        raise


def live_sandboxes() -> list[Sandbox]:
    """Sandboxes started by this interpreter and not yet stopped."""
    from envhub.sandbox import lifecycle

    return lifecycle.live()
