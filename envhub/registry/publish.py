"""``envhub registry add`` (alias ``publish``): admit a plugin source tree and write its index entry.

By default the entry names a **wheel** built from the tree (:func:`envhub.registry.wheel.build_wheel`) into
``wheels/`` beside the index: ``source`` is the wheel (relative to the index), ``sha256`` its file hash,
``source_tree`` / ``source_sha256`` the tree and its content hash (``registry verify`` tells a stale wheel by them).
An index whose entries name wheels beside it resolves wherever it is copied, installed or served. ``wheel=False``
writes a tree source instead (``source`` = the tree, ``sha256`` = its content hash), for local development indexes.

``reuse_admission`` rewrites an entry without running admission again, keeping its admission table and report:
refused unless the tree's content hash is the one that admission ran on (:attr:`Entry.admitted_tree_hash`), the
version is the same and the report is there and agrees. That is what rebuilds a wheel, or turns a tree entry into a
wheel entry, when nothing admission looked at has changed.

Nothing is written (no wheel, no report, no entry) unless every env is fit or ``force`` is given.
"""
from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from envhub.registry.model import Entry, Registry, RegistryError, content_hash, tomllib
from envhub.registry.wheel import WHEEL_DIR, build_wheel, check_build_requirements

Log = Callable[[str], None]


class PublishRefused(RegistryError):
    """Admission found the verifier unfit, or an admission cannot be reused; nothing was written."""


@dataclass
class PublishResult:
    entry: Entry
    report_path: Path
    fit: bool
    unfit_reasons: list[str]
    warnings: list[str] = field(default_factory=list)
    reused: bool = False  # the admission table was kept from the previous entry (reuse_admission)


def publish(path: str | Path, registry: Registry, *, n: int | None = None, force: bool = False,
            concurrency: int = 4, wheel: bool = True, reuse_admission: bool = False,
            log: Log = lambda s: None) -> list[PublishResult]:
    """Admit every env the plugin at ``path`` registers and write its entry (see the module docstring).

    The report of each env goes to ``reports/<id>-<version>.json`` next to the registry. When admission finds a
    verifier unfit, :class:`PublishRefused` is raised (its message says why) and *nothing* is written, unless
    ``force``: neither the wheel, the entry nor the report, which could overwrite the report a valid entry points
    to. The plugin is loaded from ``path`` in a private hub, so an installed copy of it cannot collide with it.
    """
    from envhub.plugins import Hub, load_path

    root = Path(path).resolve()
    if registry.root.resolve().is_relative_to(root):
        # the entry and its report would land in the tree they hash, making the hash stale at once
        raise RegistryError(f"the registry {registry.path} is inside the plugin tree {root}: pass --registry with a "
                            "registry.toml outside it")
    if reuse_admission and n is not None:
        raise RegistryError("--tasks does not apply with --reuse-admission (no admission runs)")
    if wheel:  # a build that cannot succeed is said before admission runs (minutes), not after
        check_build_requirements(root)
    digest = content_hash(root)  # before anything imports from the tree (caches are excluded anyway)
    meta = tomllib.loads((root / "pyproject.toml").read_text()) if (root / "pyproject.toml").is_file() else {}
    project = meta.get("project", {})
    specs = load_path(root, hub=Hub())
    results: list[PublishResult] = []
    reports: dict[Path, str] = {}  # written only once every env is fit (or --force)
    for spec in specs:
        old = registry.entries.get(spec.id)
        if reuse_admission:
            admission, report_path, fit, reasons = _reused(registry, old, spec.id, spec.version, digest, root)
            log(f"{spec.id} {spec.version}: reusing its admission ({admission['passed']}/{admission['tasks']}, "
                f"run on this tree's content hash {digest[:16]}...)")
        else:
            from envhub.admission import admit

            log(f"admission of {spec.id} {spec.version} ({root})")
            report = admit(spec, n=n, concurrency=concurrency)
            report_path = registry.root / "reports" / f"{spec.id}-{spec.version}.json"
            reports[report_path] = report.to_json() + "\n"
            admission = {"tasks": len(report.tasks), "passed": report.passed,
                         "report": registry.relative(report_path)}
            fit, reasons = report.fit, list(report.unfit_reasons)
        entry = Entry(
            id=spec.id, version=spec.version, summary=spec.summary or project.get("description", ""),
            source=registry.relative(root), sha256=digest, tags=list(spec.tags), admission=admission,
            extra=dict(old.extra) if old else {},
        )
        warnings = []
        if project.get("version") and project["version"] != spec.version:
            warnings.append(f"{spec.id}: pyproject version {project['version']} differs from the spec's {spec.version}")
        results.append(PublishResult(entry, report_path, fit, reasons, warnings, reused=reuse_admission))
    unfit = [r for r in results if not r.fit]
    if unfit and not force:
        why = "; ".join(f"{r.entry.id}: {', '.join(r.unfit_reasons)}" for r in unfit)
        raise PublishRefused(f"the verifier is unfit; nothing written (no entry, no report, no wheel): {why}. Fix "
                             "the plugin (`envhub validate PATH` shows the full report) or pass --force.")
    if content_hash(root) != digest:  # the entry would claim an admission of a tree that is no longer there
        raise PublishRefused(f"{root} changed while it was being admitted; nothing written. Publish again.")
    with tempfile.TemporaryDirectory(prefix="envhub-publish-") as tmp:
        built = build_wheel(root, tmp) if wheel else None  # before anything is written: a failed build writes nothing
        if built is not None and built.source_sha256 != digest:
            raise PublishRefused(f"{root} changed while it was being published; nothing written. Publish again.")
        for report_path, text in reports.items():
            report_path.parent.mkdir(parents=True, exist_ok=True)
            report_path.write_text(text)
        if built is not None:
            wheel_path = registry.root / WHEEL_DIR / built.path.name
            wheel_path.parent.mkdir(parents=True, exist_ok=True)
            part = wheel_path.with_name(f".{wheel_path.name}.{os.getpid()}.tmp")
            part.write_bytes(built.path.read_bytes())
            os.replace(part, wheel_path)
            for r in results:
                r.entry.source_tree, r.entry.source_sha256 = r.entry.source, digest
                r.entry.source, r.entry.sha256 = registry.relative(wheel_path), built.sha256
    replaced = {registry.entries[r.entry.id].source for r in results if r.entry.id in registry.entries}
    for r in results:
        registry.put(r.entry)
    registry.save()
    _remove_unreferenced_wheels(registry, replaced)
    return results


def _reused(registry: Registry, old: Entry | None, env_id: str, version: str, digest: str,
            root: Path) -> tuple[dict[str, Any], Path, bool, list[str]]:
    """The admission table, report path, fitness and reasons of ``old``, if it can honestly be kept for the tree at
    ``root`` (content hash ``digest``); :class:`PublishRefused` saying why not otherwise."""
    def refuse(why: str) -> PublishRefused:
        return PublishRefused(f"{env_id}: cannot reuse its admission: {why}; nothing written. Run admission (drop "
                              "--reuse-admission).")

    if old is None or not old.admission:
        raise refuse(f"{registry.path} has no admitted entry for it")
    if old.version != version:
        raise refuse(f"the entry's admission is of version {old.version}, the plugin is {version}")
    admitted = old.admitted_tree_hash
    if not admitted:
        raise refuse(f"the entry ({old.source}) does not say which source tree its admission ran on")
    if admitted != digest:
        raise refuse(f"its admission ran on a source tree with content hash {admitted}, {root} hashes to {digest}")
    if not old.admission.get("report"):
        raise refuse("the entry names no admission report")
    report_path = registry.resolve(str(old.admission["report"]))
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as e:
        raise refuse(f"its report {report_path} cannot be read ({e})") from None
    if (report.get("env_id"), report.get("version")) != (env_id, version):
        raise refuse(f"its report {report_path} is of {report.get('env_id')} {report.get('version')}")
    if (report.get("tasks_total"), report.get("tasks_admitted")) != (old.admission.get("tasks"),
                                                                   old.admission.get("passed")):
        raise refuse(f"its report {report_path} says {report.get('tasks_admitted')}/{report.get('tasks_total')}, "
                     f"the entry {old.admission_summary}")
    return dict(old.admission), report_path, bool(report.get("fit")), list(report.get("unfit_reasons") or [])


def _remove_unreferenced_wheels(registry: Registry, candidates: set[str]) -> None:
    """Delete the wheels in ``wheels/`` that the entries just replaced named and no entry names any more (an older
    version's wheel), so the directory holds exactly what the index uses."""
    wheel_dir = (registry.root / WHEEL_DIR).resolve()
    used = {registry.resolve(e.source) for e in registry.entries.values() if e.source.endswith(".whl")}
    for source in candidates:
        if not source.endswith(".whl") or "://" in source:
            continue
        path = registry.resolve(source)
        if path.parent == wheel_dir and path not in used and path.is_file():
            path.unlink()
