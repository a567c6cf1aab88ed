"""Install, uninstall and publish registry entries.

``install`` is careful in this order: resolve the entry, fetch its source into a private temporary directory (a copy
of a source tree, a copy of a local wheel/sdist, a download of a URL, or ``pip download --no-deps`` of
``name==version``), hash *that copy*, refuse on a mismatch before pip runs at all, install the very bytes that were
hashed (nothing can change between the check and the install), then ask a fresh Python process whether the plugin is
discoverable and loads. A plugin that does not show up is uninstalled again, so a failed install leaves nothing.

Every pip call and every check runs against ``PipOptions.python`` (default: this interpreter), so one can install into
another environment, as ``pip --python`` does. Publishing (``envhub registry add``) is :mod:`envhub.registry.publish`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from envhub.plugins import UnknownEnv, unknown_message
from envhub.registry.model import (  # tomllib: the stdlib module, or tomli on Python 3.10
    ARCHIVE_SUFFIXES, tomllib, Registry, RegistryError, Source, compute_sha256, copy_tree, parse_source,
    split_requirement,
)

Log = Callable[[str], None]


class InstallError(RegistryError):
    """pip failed, or the installed package does not provide the plugin it should."""


class HashMismatch(InstallError):
    """The fetched source does not have the registry's sha256. Nothing was installed."""


@dataclass
class PipOptions:
    """How to run pip. ``no_deps`` skips dependencies (for development; real users want them).
    ``no_build_isolation`` builds with the target's own setuptools (offline, faster). ``find_links`` / ``no_index``
    point pip at local wheels (air-gapped machines)."""

    python: str = sys.executable
    no_deps: bool = False
    no_build_isolation: bool = False
    find_links: tuple[str, ...] = ()
    no_index: bool = False

    def __post_init__(self):
        # absolute (probes run in a temporary cwd), but not resolved: a venv's python is a symlink to the base one
        self.python = os.path.abspath(self.python)
        if not os.access(self.python, os.X_OK):
            raise InstallError(f"python interpreter {self.python} does not exist or is not executable")

    def pip(self, *args: str) -> list[str]:
        """The command line for one pip call. A foreign interpreter is driven with ``pip --python`` (pip >= 22.3),
        so it needs no pip of its own."""
        base = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
        if self.python != os.path.abspath(sys.executable):
            base += ["--python", self.python]
        return [*base, *args]

    def index_args(self) -> list[str]:
        out = ["--no-index"] if self.no_index else []
        for link in self.find_links:
            out += ["--find-links", str(link)]
        return out


@dataclass
class InstallResult:
    env_id: str
    version: str
    distribution: str
    sha256: str
    source: str
    python: str
    warnings: list[str] = field(default_factory=list)


@dataclass
class UninstallResult:
    env_id: str
    distribution: str
    version: str


def _run_pip(opts: PipOptions, *args: str) -> subprocess.CompletedProcess:
    cmd = opts.pip(*args)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise InstallError(f"pip failed (exit {proc.returncode}): {' '.join(cmd[3:])}\n{tail}")
    return proc


# ---- discovery in a fresh process -----------------------------------------------------------------------------------
_PROBE = r"""
import json, sys
out = {"ids": [], "found": False, "loaded": False}
try:
    from envhub.plugins import Hub
    hub = Hub()
    refs = hub.refs()
    out["ids"] = sorted(refs)
    clash = hub.collisions.get(sys.argv[1])
    if clash is not None:
        out["claimants"] = [{"distribution": r.distribution, "version": r.version} for r in clash.claimants]
        out["collision"] = str(clash)
    ref = refs.get(sys.argv[1])
    if ref is not None:
        out.update(found=True, distribution=ref.distribution, dist_version=ref.version, module=ref.module)
        if sys.argv[2] == "1":
            spec = hub.get(sys.argv[1])
            out.update(loaded=True, spec_version=spec.version, gym_id=spec.gym_id)
except BaseException as e:
    out["error"] = f"{type(e).__name__}: {e}"
print("ENVHUB-PROBE " + json.dumps(out))
"""


def probe(env_id: str, python: str = sys.executable, load: bool = True) -> dict[str, Any]:
    """Ask a fresh ``python`` process what provides ``env_id`` (and, with ``load``, whether the plugin imports).

    A new process is the only honest answer right after pip ran: this process has stale metadata caches and may
    import the plugin from a source directory on ``sys.path`` instead of the installed copy. The probe runs in an
    empty temporary directory for the same reason. Returns ``{"found", "loaded", "distribution", "dist_version",
    "spec_version", "ids", "error"}`` (the keys that apply).
    """
    with tempfile.TemporaryDirectory(prefix="envhub-probe-") as cwd:
        proc = subprocess.run([python, "-c", _PROBE, env_id, "1" if load else "0"], capture_output=True, text=True,
                              cwd=cwd)
    for line in proc.stdout.splitlines():
        if line.startswith("ENVHUB-PROBE "):
            return json.loads(line[len("ENVHUB-PROBE "):])
    detail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"found": False, "loaded": False, "ids": [], "error": f"{python} could not run envhub: {' / '.join(detail)}"}


# ---- fetching and hashing -------------------------------------------------------------------------------------------
def fetch(source: Source, workdir: Path, opts: PipOptions) -> Path:
    """Put the source into ``workdir`` (a private temporary directory) and return what pip should install.

    A tree is copied file by file (exactly the files :func:`~envhub.registry.content_hash` covers), so the install
    also leaves no ``build/`` or ``*.egg-info`` in the author's tree.
    """
    if source.kind == "tree":
        src = Path(source.location)
        return copy_tree(src, workdir / "src" / src.name)
    if source.kind == "file":
        dest = workdir / Path(source.location).name
        shutil.copyfile(source.location, dest)
        return dest
    if source.kind == "url":
        parsed = urllib.parse.urlparse(source.location)
        name = Path(urllib.parse.unquote(parsed.path)).name
        if parsed.scheme not in ("http", "https", "file") or not name.endswith(ARCHIVE_SUFFIXES):
            raise RegistryError(f"source URL {source.location} must be http(s) or file and name a wheel or sdist")
        dest = workdir / name
        try:
            with urllib.request.urlopen(source.location, timeout=120) as r, open(dest, "wb") as f:
                shutil.copyfileobj(r, f)
        except OSError as e:
            raise InstallError(f"could not download {source.location}: {e}") from None
        return dest
    if source.kind == "git":
        return _fetch_git(source.location, workdir)
    if source.kind == "requirement":
        dl = workdir / "download"
        _run_pip(opts, "download", "--no-deps", "--dest", str(dl), *opts.index_args(), source.location)
        files = sorted(dl.iterdir())
        if len(files) != 1:
            raise InstallError(f"pip download {source.location} gave {len(files)} files, expected one")
        return files[0]
    raise RegistryError(f"unknown source kind {source.kind!r}")


def _fetch_git(text: str, workdir: Path) -> Path:
    """Clone the repository, check out the pinned commit, and return the package's directory in it."""
    from envhub.registry.model import parse_git

    git = parse_git(text)
    dest = workdir / "git"
    for cmd in (["git", "clone", "--quiet", "--no-checkout", git.url, str(dest)],
                ["git", "-C", str(dest), "checkout", "--quiet", git.commit]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "GIT_TERMINAL_PROMPT": "0"})
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise InstallError(f"could not fetch {text}: {' / '.join(tail)}")
    package = dest / git.subdirectory if git.subdirectory else dest
    if not (package / "pyproject.toml").is_file() and not (package / "setup.py").is_file():
        raise InstallError(f"{text}: {git.subdirectory or 'the repository root'} is not a Python project at "
                           f"{git.commit[:12]}")
    return package


def distribution_name(artifact: Path) -> str | None:
    """The distribution an artifact installs: ``[project].name`` of a tree, the name part of a wheel/sdist."""
    if artifact.is_dir():
        try:
            return tomllib.loads((artifact / "pyproject.toml").read_text())["project"]["name"]
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return None
    if artifact.name.endswith(".whl"):
        return artifact.name.split("-")[0]
    m = re.match(r"^(.+)-[^-]+\.(tar\.gz|tgz|zip)$", artifact.name)
    return m.group(1) if m else None


def normalize(name: str) -> str:
    """PEP 503 name normalization (``Envhub_Foo`` == ``envhub-foo``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


# ---- install / uninstall --------------------------------------------------------------------------------------------
def install(registry: Registry, target: str, opts: PipOptions | None = None,
            log: Log = lambda s: None) -> InstallResult:
    """Install ``target`` (``ID`` or ``ID==VERSION``) from ``registry`` into ``opts.python``'s environment.

    Raises :class:`~envhub.plugins.UnknownEnv` (with close names), :class:`RegistryError` (version not in the
    registry, entry without a hash, bad source), :class:`HashMismatch` (nothing installed) or :class:`InstallError`.
    """
    opts = opts or PipOptions()
    env_id, version = split_requirement(target)
    entry = registry.get(env_id)
    if version is not None and version != entry.version:
        raise RegistryError(f"{registry.path} has {env_id} {entry.version or '(no version)'}, not {version}")
    if not entry.sha256:
        raise RegistryError(f"[envs.{env_id}] has no sha256: refusing to install an unpinned source "
                            f"(publish it with `envhub registry add PATH`)")
    try:
        source = parse_source(entry.source, entry.base or registry.root)
    except RegistryError as e:
        where = f" (from the {entry.origin} index)" if entry.origin else ""
        raise RegistryError(f"{env_id}{where}: {e}. Point $ENVHUB_REGISTRY (or --registry) at an index whose "
                            "source for it resolves here: a wheel/sdist URL, name==version, or git+URL@COMMIT") from None
    warnings: list[str] = []
    with tempfile.TemporaryDirectory(prefix="envhub-install-") as tmp:
        log(f"fetching {source.describe()}")
        artifact = fetch(source, Path(tmp), opts)
        digest = compute_sha256(artifact)
        if digest != entry.sha256:
            raise HashMismatch(
                f"sha256 mismatch for {env_id} ({entry.source}): the registry says {entry.sha256}, the source "
                f"hashes to {digest}. Nothing was installed."
            )
        log(f"sha256 ok ({digest[:16]}...); installing with pip into {opts.python}")
        dist = distribution_name(artifact)
        flags = ["--no-build-isolation"] if opts.no_build_isolation else []
        flags += opts.index_args()
        if artifact.name.endswith(".whl"):
            # pip skips a local wheel whose version is already installed: force exactly the hashed wheel in, then
            # (unless --no-deps) let a second call resolve its dependencies around it.
            _run_pip(opts, "install", "--no-deps", "--force-reinstall", *flags, str(artifact))
            if not opts.no_deps:
                _run_pip(opts, "install", *flags, str(artifact))
        else:  # pip always reinstalls a local tree or sdist
            _run_pip(opts, "install", *(["--no-deps"] if opts.no_deps else []), *flags, str(artifact))
    found = probe(env_id, opts.python, load=True)
    problem = None
    if not found.get("found"):
        problem = f"the installed package does not provide env {env_id!r}"
    elif not found.get("loaded"):
        problem = f"plugin {env_id!r} is installed but does not load"
    elif found.get("spec_version") != entry.version:
        problem = f"the installed plugin says version {found.get('spec_version')}, the registry {entry.version}"
    if problem:
        detail = f" ({found['error']})" if found.get("error") else ""
        rolled = ""
        if dist:
            subprocess.run(opts.pip("uninstall", "-y", dist), capture_output=True)
            rolled = f"; {dist} was uninstalled again"
        raise InstallError(f"{problem}{detail}{rolled}")
    if dist and normalize(found["distribution"]) != normalize(dist):
        warnings.append(f"{env_id} is provided by {found['distribution']}, not by the installed {dist}")
    return InstallResult(env_id, entry.version, found["distribution"], digest, entry.source, opts.python, warnings)


def uninstall(env_id: str, opts: PipOptions | None = None, distribution: str | None = None) -> UninstallResult:
    """pip-uninstall the distribution that provides ``env_id`` in ``opts.python``'s environment, and check that the
    id is gone. An id nobody provides raises :class:`~envhub.plugins.UnknownEnv` with close names.

    When two distributions claim ``env_id`` (a collision), ``distribution`` says which one to remove; the id is
    then provided by the other one alone.
    """
    opts = opts or PipOptions()
    found = probe(env_id, opts.python, load=False)
    claimants = {normalize(c["distribution"]): c for c in found.get("claimants", [])}
    if claimants:
        if distribution is None or normalize(distribution) not in claimants:
            names = ", ".join(c["distribution"] for c in claimants.values())
            raise InstallError(f"{found['collision']}" if distribution is None else
                               f"{distribution!r} does not claim {env_id!r}; its claimants are {names}")
        chosen = claimants[normalize(distribution)]
        if normalize(chosen["distribution"]) == "envhub":
            raise InstallError(f"{env_id!r} is provided by envhub itself; refusing to uninstall envhub")
        _run_pip(opts, "uninstall", "-y", chosen["distribution"])
        after = probe(env_id, opts.python, load=False)
        if any(normalize(c["distribution"]) == normalize(distribution) for c in after.get("claimants", [])) or \
                normalize(after.get("distribution") or "") == normalize(distribution):
            raise InstallError(f"uninstalled {distribution}, but it still claims {env_id!r}")
        return UninstallResult(env_id, chosen["distribution"], chosen.get("version", "?"))
    if distribution is not None and found.get("found") and \
            normalize(found["distribution"]) != normalize(distribution):
        raise InstallError(f"{env_id!r} is provided by {found['distribution']}, not {distribution}")
    if not found.get("found"):
        if found.get("error"):
            raise InstallError(f"cannot tell what provides {env_id!r}: {found['error']}")
        raise UnknownEnv(unknown_message(env_id, found.get("ids", [])) + " (installed plugins)")
    dist = found["distribution"]
    if normalize(dist) == "envhub":
        raise InstallError(f"{env_id!r} is provided by envhub itself; refusing to uninstall envhub")
    _run_pip(opts, "uninstall", "-y", dist)
    after = probe(env_id, opts.python, load=False)
    if after.get("found"):
        raise InstallError(f"uninstalled {dist}, but {env_id!r} is still provided by {after.get('distribution')}")
    return UninstallResult(env_id, dist, found.get("dist_version", "?"))
