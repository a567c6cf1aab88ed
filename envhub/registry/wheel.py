"""Env wheels for a hub index: built reproducibly from a source tree, checked by ``envhub registry verify``.

:func:`build_wheel` builds from a private copy of exactly the files the tree's content hash covers
(:func:`~envhub.registry.model.copy_tree`: every file mode 0644, so build droppings, caches and mode bits of the
author's checkout never reach the wheel) with ``pip wheel --no-deps --no-build-isolation --no-index`` (offline: the
build backend is this environment's), ``SOURCE_DATE_EPOCH`` fixed at 1980-01-01 (every zip timestamp) and umask 022.
The same tree built with the same pip and build backend gives the same bytes. Another setuptools version writes
another ``Generator:`` line into ``WHEEL`` (hence another ``RECORD``), so :func:`compare_wheels` compares contents
with those two left out, and names what differs.

:func:`verify` checks every local entry of one index: a tree's content hash or a file's sha256 against ``sha256``
(as before wheels); for a wheel built by ``registry add``, also its ``source_tree`` against ``source_sha256`` (the
wheel is *stale* when the tree changed since), and with ``rebuild`` the wheel against one rebuilt from that tree.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from envhub.registry.model import (
    Entry, Registry, RegistryError, compute_sha256, content_hash, copy_tree, file_hash, parse_source,
)

SOURCE_DATE_EPOCH = 315532800  # 1980-01-01 00:00 UTC, the earliest time a zip entry can carry
WHEEL_DIR = "wheels"  # beside the index file: where `registry add` puts the wheels its entries name
_TOOL_MEMBERS = ("WHEEL", "RECORD")  # dist-info files that name the build tool (RECORD: hashes of WHEEL too)


class WheelBuildError(RegistryError):
    """The build backend failed, or gave other than one wheel."""


@dataclass(frozen=True)
class BuiltWheel:
    path: Path
    sha256: str  # of the wheel file
    source_sha256: str  # content hash of the tree it was built from


def unmet_build_requirements(tree: str | Path) -> list[str]:
    """What the tree's ``[build-system] requires`` asks for that this environment lacks, one phrase each (``[]``:
    nothing). The build runs without isolation (offline, reproducible: this environment's backend), where pip never
    checks those requirements: an old setuptools then fails deep in the backend, or builds a wrong wheel. Compared
    with :mod:`packaging` (what pip itself uses); without it, nothing is checked."""
    import importlib.metadata as md

    from envhub.registry.model import tomllib

    try:
        from packaging.requirements import InvalidRequirement, Requirement
    except ImportError:  # pragma: no cover - packaging comes with pip, datasets and huggingface-hub
        return []
    pyproject = Path(tree) / "pyproject.toml"
    if not pyproject.is_file():
        return []
    try:
        requires = tomllib.loads(pyproject.read_text()).get("build-system", {}).get("requires", [])
    except (OSError, ValueError) as e:
        return [f"{pyproject} cannot be read ({e})"]
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as e:
            out.append(f"{text!r} is not a valid requirement ({e})")
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = md.version(req.name)
        except md.PackageNotFoundError:
            out.append(f"{text} (not installed)")
            continue
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            out.append(f"{text} (this environment has {req.name} {have})")
    return out


def check_build_requirements(tree: str | Path) -> None:
    """:class:`WheelBuildError` naming what to install when :func:`unmet_build_requirements` finds anything."""
    unmet = unmet_build_requirements(tree)
    if unmet:
        raise WheelBuildError(
            f"cannot build the wheel of {tree}: its pyproject.toml needs {'; '.join(unmet)}. The build uses this "
            f"environment's build backend (offline, no isolation): {sys.executable} -m pip install -U "
            + " ".join(f"'{u.split(' (')[0]}'" for u in unmet) + ", or publish the source tree with --tree")


def build_wheel(tree: str | Path, outdir: str | Path) -> BuiltWheel:
    """Build the wheel of the plugin at ``tree`` into ``outdir`` (see the module docstring); returns its path and
    hashes. The tree's content hash is taken before the copy and checked on the copy, so the wheel is known to be
    built from exactly the tree that ``source_sha256`` names."""
    tree = Path(tree).resolve()
    check_build_requirements(tree)
    digest = content_hash(tree)
    with tempfile.TemporaryDirectory(prefix="envhub-wheel-") as tmp:
        src = copy_tree(tree, Path(tmp) / "src" / tree.name)
        if content_hash(src) != digest:
            raise WheelBuildError(f"{tree} changed while it was being copied; build again")
        out = Path(tmp) / "out"
        cmd = [sys.executable, "-m", "pip", "wheel", "--disable-pip-version-check", "-q", "--no-deps",
               "--no-build-isolation", "--no-index", "-w", str(out), str(src)]
        env = {**os.environ, "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH), "PYTHONHASHSEED": "0"}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp, umask=0o022)
        if proc.returncode != 0:
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
            raise WheelBuildError(f"building the wheel of {tree} failed (pip wheel exit {proc.returncode}):\n{tail}")
        wheels = sorted(out.glob("*.whl"))
        if len(wheels) != 1:
            raise WheelBuildError(f"building {tree} gave {len(wheels)} wheels, expected one")
        outdir = Path(outdir)
        outdir.mkdir(parents=True, exist_ok=True)
        dest = outdir / wheels[0].name
        tmp_dest = outdir / f".{dest.name}.{os.getpid()}.tmp"
        tmp_dest.write_bytes(wheels[0].read_bytes())
        os.replace(tmp_dest, dest)
    return BuiltWheel(dest, file_hash(dest), digest)


def wheel_contents(path: str | Path) -> dict[str, bytes]:
    """Member name -> bytes of a wheel, leaving out the dist-info files that name the build tool."""
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()
                if not (i.filename.split("/")[0].endswith(".dist-info") and i.filename.rsplit("/", 1)[-1]
                        in _TOOL_MEMBERS)}


def compare_wheels(a: str | Path, b: str | Path) -> list[str]:
    """What differs between two wheels' contents (see :func:`wheel_contents`); empty when nothing does."""
    ca, cb = wheel_contents(a), wheel_contents(b)
    out = [f"only in {Path(a).name}: {n}" for n in sorted(set(ca) - set(cb))]
    out += [f"only in the rebuilt wheel: {n}" for n in sorted(set(cb) - set(ca))]
    out += [f"differs: {n}" for n in sorted(set(ca) & set(cb)) if ca[n] != cb[n]]
    return out


@dataclass(frozen=True)
class Check:
    status: str  # "ok", "skip", "DIFFER" (hash mismatch), "STALE" (tree changed since the wheel), "ERROR"
    env_id: str
    message: str

    @property
    def bad(self) -> bool:
        return self.status not in ("ok", "skip")


def verify(registry: Registry, rebuild: bool = False) -> list[Check]:
    """Check every entry of ``registry`` with a local source (see the module docstring). Installs nothing."""
    return [_check(registry, registry.entries[i], rebuild) for i in registry.ids()]


def _check(registry: Registry, entry: Entry, rebuild: bool) -> Check:
    try:
        source = parse_source(entry.source, registry.root)
    except RegistryError as e:
        return Check("ERROR", entry.id, str(e))
    if source.kind not in ("tree", "file"):
        return Check("skip", entry.id, f"{source.kind} source (checked at install time)")
    digest = compute_sha256(source.location)
    if digest != entry.sha256:
        return Check("DIFFER", entry.id, f"{digest} != {entry.sha256}")
    if source.kind == "tree" or not entry.source_tree:
        return Check("ok", entry.id, digest)
    tree = registry.resolve(entry.source_tree)
    if not tree.is_dir():
        return Check("ok", entry.id, f"{digest} (source tree {entry.source_tree} not here: not compared)")
    now = content_hash(tree)
    if now != entry.source_sha256:
        return Check("STALE", entry.id, f"{entry.source} was built from {entry.source_tree} with content hash "
                     f"{entry.source_sha256 or '(none recorded)'}, which now hashes to {now}: the wheel no longer "
                     f"matches its source. Rebuild it: envhub registry add {entry.source_tree} --registry "
                     f"{registry.path} (with --reuse-admission only if admission already ran on this tree)")
    if not rebuild:
        return Check("ok", entry.id, f"{digest} (source tree {entry.source_tree} unchanged)")
    with tempfile.TemporaryDirectory(prefix="envhub-verify-") as tmp:
        built = build_wheel(tree, tmp)
        if built.sha256 == digest:
            return Check("ok", entry.id, f"{digest} (rebuilt from {entry.source_tree}: the same bytes)")
        diff = compare_wheels(source.location, built.path)
    if diff:
        return Check("DIFFER", entry.id, f"{entry.source} is not what {entry.source_tree} builds to: "
                     + "; ".join(diff[:10]) + (f" (and {len(diff) - 10} more)" if len(diff) > 10 else ""))
    return Check("ok", entry.id, f"{digest} (rebuilt from {entry.source_tree}: the same contents; WHEEL/RECORD "
                 "differ, another build tool version)")
