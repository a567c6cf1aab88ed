"""The hub index as envhub reads it: several indexes, layered, each entry saying which index it comes from.

Layers, highest priority first (an id found in two layers is taken from the higher one, and the entry records
the lower ones it shadows: ``envhub list`` shows both, nothing is replaced silently):

1. ``--registry PATH`` (when given on the command line)
2. the user's index: ``$XDG_CONFIG_HOME/envhub/registry.toml`` (default ``~/.config/envhub/registry.toml``)
3. the project's index: the nearest ``registry.toml`` upward from the working directory
4. ``$ENVHUB_REGISTRY``: a path or an ``http(s)://`` URL, or several separated by commas (in priority order)
5. the built-in index, shipped inside the package (``envhub/registry/index.toml``)

Layers that do not exist are skipped; one file reached twice (in a checkout, ``registry.toml`` is a symlink to the
built-in index, so it is both the project file and the built-in index of an editable install) is read once, and a
symlinked index resolves its relative paths against the real file's directory. A layer that exists but
cannot be read is an error naming it: a hub that silently lost an index would install from the wrong one.
"""
from __future__ import annotations

import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from envhub.registry import ENV_VAR, REGISTRY_FILE, Registry, RegistryError

BUILTIN = Path(__file__).with_name("index.toml")
URL_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Layer:
    name: str  # "--registry", "user", "project", "ENVHUB_REGISTRY", "built-in"
    location: str  # a file path or a URL

    @property
    def is_url(self) -> bool:
        return "://" in self.location

    def describe(self) -> str:
        return f"{self.name} ({self.location})"


def user_index() -> Path:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(config) / "envhub" / REGISTRY_FILE


def write_target(explicit: str | Path | None = None, cwd: str | Path | None = None) -> tuple[Path, str]:
    """The one index ``envhub registry add`` writes, and why that one: ``--registry PATH``; else
    ``$ENVHUB_REGISTRY`` (when it is one path); else the project's index (the nearest ``registry.toml`` upward from
    the working directory) unless that is the built-in index; else the user's index (:func:`user_index`).

    The built-in index is never written by default: in a checkout, ``registry.toml`` is a symlink to it, so an
    author who runs ``envhub registry add my-env`` inside the checkout (or from an editable install anywhere) would
    otherwise put their env into the index envhub ships. Maintainers update it by naming it: ``--registry
    envhub/registry/index.toml``. The user's index is the default because every ``envhub list`` / ``install`` reads
    it, above the project and built-in ones, wherever they run."""
    if explicit:
        return Path(explicit).absolute(), "--registry"
    env = os.environ.get(ENV_VAR, "")
    if env and "://" not in env and "," not in env:  # a URL or a list is read by load_index, never written
        return Path(env).absolute(), f"${ENV_VAR}"
    here = Path(cwd or Path.cwd()).absolute()
    builtin = BUILTIN.resolve()
    for d in (here, *here.parents):
        found = d / REGISTRY_FILE
        if found.is_file():
            if found.resolve() == builtin:
                break  # the checkout's link to the built-in index: not a project index of the user's
            return found, "the project's index (the nearest registry.toml upward)"
    return user_index(), "the user's index (no --registry, no project registry.toml)"


def layers(explicit: str | Path | None = None, cwd: str | Path | None = None) -> list[Layer]:
    """The layers that exist, highest priority first (see the module docstring)."""
    out: list[Layer] = []
    if explicit:
        out.append(Layer("--registry", str(Path(explicit).absolute())))
    out.append(Layer("user", str(user_index())))
    here = Path(cwd or Path.cwd()).absolute()
    project = next((d / REGISTRY_FILE for d in (here, *here.parents) if (d / REGISTRY_FILE).is_file()), None)
    if project is not None:
        out.append(Layer("project", str(project)))
    for item in filter(None, (x.strip() for x in os.environ.get(ENV_VAR, "").split(","))):
        out.append(Layer(ENV_VAR, item if "://" in item else str(Path(item).absolute())))
    out.append(Layer("built-in", str(BUILTIN)))
    seen: set[str] = set()
    kept = []
    for layer in out:
        if not layer.is_url:
            if not Path(layer.location).is_file():
                if layer.name in ("--registry", ENV_VAR):
                    raise RegistryError(f"index {layer.describe()} does not exist")
                continue
            key = str(Path(layer.location).resolve())
        else:
            key = layer.location
        if key not in seen:
            seen.add(key)
            kept.append(layer)
    return kept


def read_layer(layer: Layer) -> Registry:
    """One layer's index; its entries know their origin and the base their relative paths resolve against."""
    if layer.is_url:
        try:
            with urllib.request.urlopen(layer.location, timeout=URL_TIMEOUT_S) as r:
                text = r.read().decode()
        except (OSError, urllib.error.URLError, UnicodeDecodeError) as e:
            raise RegistryError(f"cannot read index {layer.describe()}: {e}") from None
        reg = Registry.loads(text, Path(REGISTRY_FILE), where=layer.location)
        base = layer.location.rsplit("/", 1)[0] + "/"
    else:
        reg = Registry.load(layer.location)  # a symlink is followed: relative paths resolve against the real file
        base = str(reg.root)
    for entry in reg.entries.values():
        entry.origin, entry.base = layer.name, base
    return reg


def load_index(explicit: str | Path | None = None, cwd: str | Path | None = None) -> Registry:
    """Every layer merged into one :class:`Registry` (its ``path`` is the highest layer's, for messages)."""
    found = layers(explicit, cwd)
    merged = Registry(Path(found[0].location) if found and not found[0].is_url else Path(REGISTRY_FILE))
    merged.layers = found
    for layer in found:
        for env_id, entry in read_layer(layer).entries.items():
            top = merged.entries.get(env_id)
            if top is None:
                merged.entries[env_id] = entry
            else:
                top.shadows.append(f"{layer.name} {entry.version}")
    return merged
