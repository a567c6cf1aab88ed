"""The hub index, ``registry.toml``: what can be installed, from where, pinned by which hash.

One entry per env id::

    [envs.countdown]
    version = "0.1.0"
    summary = "Reach a target number with + - * / over given numbers."
    source = "wheels/envhub_countdown-0.1.0-py3-none-any.whl"   # a wheel/sdist file, a source tree, a URL,
    sha256 = "…"                        # "envhub-countdown==0.1.0" or git+URL@COMMIT; the sha256 of the wheel/sdist
                                        # file, or the content hash of the tree
    source_tree = "../../environments/countdown"   # a wheel built by `registry add`: the tree it was built from
    source_sha256 = "…"                 # and that tree's content hash (`registry verify` tells a stale wheel)
    tags = ["math", "single-turn"]

    [envs.countdown.admission]          # what admission said when the entry was published
    tasks = 16
    passed = 16
    report = "reports/countdown-0.1.0.json"

Which indexes are read: see :mod:`envhub.registry.layers` (user config, project file, ``$ENVHUB_REGISTRY``, the
index built into the package, in that order of priority). Which one file ``registry add`` writes
(:func:`envhub.registry.layers.write_target`): ``--registry PATH``, else ``$ENVHUB_REGISTRY`` (a path), else the
nearest ``registry.toml`` upward from the working directory unless that is the built-in index, else the user's index
(``~/.config/envhub/registry.toml``): an author's env never lands in the index envhub ships unless named with
``--registry``. Which one ``verify`` checks (:func:`find_registry`): the same, except that the nearest
``registry.toml`` may be the built-in one, and with none found, the one at the root of the envhub checkout. Relative
``source`` and ``report`` paths resolve against their index's directory (or URL), so a checkout can move. The
built-in index (``envhub/registry/index.toml``; the checkout's ``registry.toml`` is a symlink to it) names wheels
shipped beside it in the package (``envhub/registry/wheels/``), so it resolves wherever envhub is installed.

The hash of a source tree is a *content hash* (:func:`content_hash`): sorted relative paths and file bytes, leaving
out what builds and tools leave behind (``__pycache__``, ``*.pyc``, ``*.egg-info``, ``build/``, ``dist/``,
``.git``...), so one tree hashes the same on every machine and in every checkout. Installing, uninstalling and
publishing (they drive pip and admission) live in :mod:`envhub.registry.install`, :mod:`envhub.registry.publish`
and :mod:`envhub.registry.wheel` (building wheels, ``verify``) and are re-exported here.
"""
from __future__ import annotations

from envhub.registry.install import (
    HashMismatch, InstallError, InstallResult, PipOptions, UninstallResult, install, probe, uninstall,
)
from envhub.registry.model import (  # the data model
    ARCHIVE_SUFFIXES, ENV_VAR, EXCLUDED_NAMES, EXCLUDED_SUFFIXES, EXCLUDED_TOP, REGISTRY_FILE, Entry, GitSource,
    Registry, RegistryError, Source, compute_sha256, content_hash, copy_tree, excluded, file_hash, find_registry,
    load_registry, parse_git, parse_source, source_files, split_requirement, tomllib,
)
from envhub.registry.publish import PublishRefused, PublishResult, publish
from envhub.registry.wheel import BuiltWheel, WheelBuildError, build_wheel, compare_wheels, verify

__all__ = [
    "ARCHIVE_SUFFIXES", "ENV_VAR", "REGISTRY_FILE", "Entry", "HashMismatch", "InstallError", "InstallResult",
    "PipOptions", "PublishRefused", "PublishResult", "Registry", "RegistryError", "Source", "UninstallResult",
    "compute_sha256", "content_hash", "excluded", "file_hash", "find_registry", "install", "load_registry",
    "parse_source", "probe", "publish", "source_files", "split_requirement", "uninstall", "parse_git", "tomllib",
    "EXCLUDED_NAMES", "EXCLUDED_SUFFIXES", "EXCLUDED_TOP", "GitSource", "copy_tree", "BuiltWheel", "WheelBuildError",
    "build_wheel", "compare_wheels", "verify",
]
