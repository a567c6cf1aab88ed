"""Plugin discovery: entry points in the ``envhub`` group, loaded lazily through pluggy.

Listing env ids reads package metadata only (no plugin is imported). Asking for one env imports only the plugin whose
entry point has that name. Failures stay local to the id they concern: a plugin that fails to import, and an id that
two installed distributions both claim, are reported (:attr:`Hub.errors`, :attr:`Hub.collisions`) and disable only
that id; every other env is still listed and usable.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import logging
import sys
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Iterable

import pluggy

from envhub import hookrelay, hookspecs
from envhub.spec import EnvSpec

GROUP = "envhub"
log = logging.getLogger(__name__)


class PluginError(Exception):
    """A plugin could not be loaded or registered something invalid."""


class PluginCollision(PluginError):
    """Two plugins claim the same env id."""


@dataclass(frozen=True)
class Collision:
    """One env id claimed by more than one installed distribution. The id is disabled until all but one go."""

    id: str
    claimants: tuple["PluginRef", ...]

    def __str__(self) -> str:
        names = " and ".join(f"{r.distribution} {r.version} ({r.module})" for r in self.claimants)
        fixes = " or ".join(f"`envhub uninstall {self.id} --dist {r.distribution}` / `pip uninstall {r.distribution}`"
                            for r in self.claimants)
        return (f"env id {self.id!r} is claimed by {len(self.claimants)} installed distributions: {names}; "
                f"it is disabled until one is removed: {fixes}")


class UnknownEnv(KeyError):
    """No installed plugin provides this id."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class PluginRef:
    """An installed plugin, known from metadata alone: env id, module, and the distribution that ships it."""

    id: str
    module: str
    distribution: str
    version: str


class SpecRegistry:
    """What a plugin's ``envhub_register`` hook receives: ``registry.register(EnvSpec(...))``."""

    def __init__(self, source: str = ""):
        self.source = source
        self.specs: dict[str, EnvSpec] = {}

    def register(self, spec: EnvSpec) -> EnvSpec:
        if not isinstance(spec, EnvSpec):
            raise PluginError(f"{self.source or 'a plugin'} registered {type(spec).__name__}, expected EnvSpec")
        if spec.id in self.specs:
            raise PluginCollision(f"env id {spec.id!r} is registered twice by {self.source or 'one plugin'}")
        spec.distribution = spec.distribution or self.source
        self.specs[spec.id] = spec
        return spec


def _plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager("envhub")
    pm.add_hookspecs(hookspecs)
    return pm


class Hub:
    """The set of environments available in this Python environment (installed plugins + in-process ones)."""

    def __init__(self, entry_points: Iterable[md.EntryPoint] | None = None):
        self._eps = list(entry_points) if entry_points is not None else None
        self.pm = _plugin_manager()
        self.specs: dict[str, EnvSpec] = {}
        self.errors: dict[str, str] = {}  # plugin id -> why it failed to load
        self.collisions: dict[str, Collision] = {}  # id -> the distributions claiming it (filled by refs())
        self._loaded: set[str] = set()

    # ---- metadata only ----------------------------------------------------------------------------------------
    def refs(self) -> dict[str, PluginRef]:
        """Installed plugins by id, without importing any.

        An id claimed by two distributions is left out and recorded in :attr:`collisions` (and :attr:`errors`):
        a clash disables that id only, never the whole hub.
        """
        eps = self._eps if self._eps is not None else list(md.entry_points(group=GROUP))
        claims: dict[str, list[PluginRef]] = {}
        for ep in eps:
            dist = getattr(ep, "dist", None)
            ref = PluginRef(ep.name, ep.value, dist.name if dist else "?", dist.version if dist else "?")
            same = claims.setdefault(ep.name, [])
            if all(other.distribution != ref.distribution for other in same):  # one dist seen twice is one claim
                same.append(ref)
        refs: dict[str, PluginRef] = {}
        for env_id, claimants in claims.items():
            if len(claimants) == 1:
                refs[env_id] = claimants[0]
                continue
            clash = Collision(env_id, tuple(claimants))
            self.collisions[env_id] = clash
            self.errors[env_id] = str(clash)
        return refs

    def ids(self) -> list[str]:
        """Every known env id: installed plugins (by metadata, colliding ids included) and in-process specs."""
        return sorted(set(self.refs()) | set(self.collisions) | set(self.specs))

    # ---- loading ----------------------------------------------------------------------------------------------
    def register(self, spec: EnvSpec, source: str = "<in-process>") -> EnvSpec:
        """Register a spec directly (tests, notebooks, ``envhub validate PATH``)."""
        other = self.specs.get(spec.id)
        if other is not None and other is not spec:
            raise PluginCollision(
                f"env id {spec.id!r} is claimed by two plugins: {other.distribution or '?'} and {source}"
            )
        spec.distribution = spec.distribution or source
        self.specs[spec.id] = spec
        _register_with_gymnasium(spec)
        return spec

    def load_module(self, module: ModuleType, source: str) -> list[EnvSpec]:
        """Run one plugin module's ``envhub_register`` hook and register what it gives."""
        if not hasattr(module, "envhub_register"):
            raise PluginError(f"plugin {source} ({module.__name__}) defines no envhub_register hook")
        if self.pm.is_registered(module):
            self.pm.unregister(module)
        self.pm.register(module, name=f"{source}:{module.__name__}")
        others = [p for p in self.pm.get_plugins() if p is not module]
        registry = SpecRegistry(source)
        self.pm.subset_hook_caller("envhub_register", remove_plugins=others)(registry=registry)
        if not registry.specs:
            raise PluginError(f"plugin {source} ({module.__name__}) registered no environment")
        return [self.register(s, source) for s in registry.specs.values()]

    def _load_ref(self, ref: PluginRef) -> None:
        if ref.id in self._loaded:
            return
        self._loaded.add(ref.id)
        try:
            module = importlib.import_module(ref.module)
            self.load_module(module, ref.distribution)
        except BaseException as e:  # a broken plugin is reported, never fatal (SystemExit from bad code included)
            if isinstance(e, KeyboardInterrupt):
                raise
            self.errors[ref.id] = f"{ref.distribution} ({ref.module}): {type(e).__name__}: {e}"
            error = f"{type(e).__name__}: {e}"
            log.warning("plugin %s from distribution %s (module %s) failed to load: %s", ref.id, ref.distribution,
                        ref.module, error, exc_info=(type(e), e, e.__traceback__),
                        extra={"plugin": ref.id, "distribution": ref.distribution, "plugin_module": ref.module,
                               "error": error})

    def get(self, env_id: str) -> EnvSpec:
        """The spec for ``env_id``, importing only the plugin that provides it."""
        if env_id in self.specs:
            return self.specs[env_id]
        refs = self.refs()
        if env_id in self.collisions:
            raise PluginCollision(str(self.collisions[env_id]))
        if env_id in refs:
            self._load_ref(refs[env_id])
        else:  # a plugin may register extra ids under its main one: load the rest, then look again
            for ref in refs.values():
                self._load_ref(ref)
        if env_id in self.specs:
            return self.specs[env_id]
        if env_id in self.errors:
            raise PluginError(f"plugin for {env_id!r} failed to load: {self.errors[env_id]}")
        raise UnknownEnv(unknown_message(env_id, self.ids()))

    def load_all(self) -> dict[str, EnvSpec]:
        """Import every plugin; failures land in :attr:`errors`."""
        for ref in self.refs().values():
            self._load_ref(ref)
        return dict(self.specs)


def unknown_message(name: str, known: Iterable[str]) -> str:
    import difflib

    known = list(known)
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f" Did you mean: {', '.join(close)}?" if close else ""
    return f"unknown env {name!r}.{hint} Known: {', '.join(known) or 'none'}."


def load_path(path: str | Path, hub: Hub | None = None) -> list[EnvSpec]:
    """Load a plugin from a source directory that is not installed (``envhub validate ./my-env``).

    Reads the ``envhub`` entry points from its ``pyproject.toml``, puts the directory on ``sys.path`` and imports.
    """
    hub = hub or default_hub()
    root = Path(path).resolve()
    pyproject = root / "pyproject.toml"
    if not pyproject.exists():
        raise PluginError(f"{root} has no pyproject.toml: not a plugin package (create one with `envhub init`)")
    meta = tomllib.loads(pyproject.read_text())
    eps = meta.get("project", {}).get("entry-points", {}).get(GROUP, {})
    if not eps:
        raise PluginError(f"{pyproject} declares no [project.entry-points.envhub] entry point")
    name = meta.get("project", {}).get("name", root.name)
    for src in (root / "src", root):
        if src.is_dir() and str(src) not in sys.path:
            sys.path.insert(0, str(src))
    specs: list[EnvSpec] = []
    for ep_name, module_name in eps.items():
        if any(s.id == ep_name for s in hub.specs.values()) and module_name in sys.modules:
            specs.append(hub.specs[ep_name])
            continue
        module = importlib.import_module(module_name)
        specs.extend(hub.load_module(module, name))
    return specs


def _register_with_gymnasium(spec: EnvSpec) -> None:
    import gymnasium

    if spec.gym_id in gymnasium.registry:
        return
    gymnasium.register(id=spec.gym_id, entry_point=_GymEntry(spec.id), disable_env_checker=False)


def register_gym_ids(hub: Hub | None = None) -> None:
    """Make every installed plugin reachable as ``gymnasium.make("envhub/<id>-v<major>")`` without importing it.

    The major version comes from the plugin distribution's version (metadata only); the plugin is imported when
    ``gymnasium.make`` is called.
    """
    import gymnasium

    hub = hub or default_hub()
    for ref in hub.refs().values():  # a colliding id is left out here and reported when it is asked for
        major = ref.version.split(".")[0] if ref.version[:1].isdigit() else "0"
        gym_id = f"envhub/{ref.id}-v{major}"
        if gym_id not in gymnasium.registry:
            gymnasium.register(id=gym_id, entry_point=_GymEntry(ref.id), disable_env_checker=False)


class _GymEntry:
    """A picklable Gymnasium entry point: loads the plugin on first ``make`` and returns a grading env."""

    def __init__(self, env_id: str):
        self.env_id = env_id

    def __call__(self, **kwargs):
        return default_hub().get(self.env_id).make(grade=True, **kwargs)


_HUB: Hub | None = None


def default_hub() -> Hub:
    """The process-wide hub."""
    global _HUB
    if _HUB is None:
        _HUB = Hub()
        hookrelay.use(_HUB.pm)  # the sandbox layer (below the hub) asks plugins for runtimes through it
    return _HUB
