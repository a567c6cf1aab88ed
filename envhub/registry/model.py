"""The hub index's data model: entries, sources, hashes, reading and writing ``registry.toml`` (see
:mod:`envhub.registry`, which re-exports everything here with the install API of :mod:`envhub.registry.install`)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from envhub.plugins import UnknownEnv, unknown_message

REGISTRY_FILE = "registry.toml"
ENV_VAR = "ENVHUB_REGISTRY"

# Never part of a content hash: build outputs, caches and VCS data differ between machines and checkouts.
EXCLUDED_NAMES = frozenset({
    "__pycache__", ".git", ".hg", ".svn", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".tox", ".nox", ".venv",
    ".DS_Store",
})
EXCLUDED_TOP = frozenset({"build", "dist"})  # only at the root: a package may well have a ``build`` subpackage
EXCLUDED_SUFFIXES = (".pyc", ".pyo", ".egg-info")
ARCHIVE_SUFFIXES = (".whl", ".tar.gz", ".zip", ".tgz")
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*\s*==\s*[A-Za-z0-9._+!-]+$")
_KNOWN_KEYS = ("version", "summary", "source", "sha256", "source_tree", "source_sha256", "tags", "admission")


class RegistryError(Exception):
    """The registry file or one of its entries is unusable (the message says which and why)."""


# ---- hashes ---------------------------------------------------------------------------------------------------------
def excluded(rel: str | Path) -> bool:
    """Whether a path (relative to the tree root) is left out of content hashes and installs from a tree."""
    parts = Path(rel).parts
    if parts and parts[0] in EXCLUDED_TOP:
        return True
    return any(p in EXCLUDED_NAMES or p.endswith(EXCLUDED_SUFFIXES) for p in parts)


def source_files(root: str | Path) -> list[str]:
    """The files a content hash covers: sorted POSIX paths relative to ``root``.

    Symlinked directories are not followed (a tree must not reach outside itself); symlinked files count with the
    bytes they point to.
    """
    root = Path(root)
    if not root.is_dir():
        raise RegistryError(f"{root} is not a directory")
    out: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = [d for d in dirnames if not excluded(rel_dir / d) and not (Path(dirpath) / d).is_symlink()]
        out += [(rel_dir / f).as_posix() for f in filenames if not excluded(rel_dir / f)]
    return sorted(out)


def copy_tree(src: str | Path, dest: str | Path) -> Path:
    """Copy exactly the files of :func:`source_files` from ``src`` into ``dest`` (created), each with mode 0644: a
    copy that hashes as ``src`` does and carries no build outputs, caches, or mode bits of the author's checkout."""
    src, dest = Path(src), Path(dest)
    for rel in source_files(src):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, dest / rel)
        os.chmod(dest / rel, 0o644)
    dest.mkdir(parents=True, exist_ok=True)
    return dest


def content_hash(root: str | Path) -> str:
    """sha256 over ``path NUL size NUL bytes`` of every file of :func:`source_files`, in sorted order.

    File modes and timestamps are left out (they change with umask and checkout time); the length prefix makes
    the encoding unambiguous (no two trees give the same byte stream).
    """
    root = Path(root)
    h = hashlib.sha256()
    for rel in source_files(root):
        data = (root / rel).read_bytes()
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0")
        h.update(data)
    return h.hexdigest()


def file_hash(path: str | Path) -> str:
    """The plain sha256 of a file (a wheel or an sdist), as ``pip hash`` prints it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def compute_sha256(path: str | Path) -> str:
    """The registry hash of a local source: :func:`content_hash` for a tree, :func:`file_hash` for a file."""
    path = Path(path)
    if path.is_dir():
        return content_hash(path)
    if path.is_file():
        return file_hash(path)
    raise RegistryError(f"{path} does not exist")


# ---- entries --------------------------------------------------------------------------------------------------------
@dataclass
class Entry:
    """One ``[envs.<id>]`` table. ``extra`` keeps keys this version of envhub does not know, so a rewrite loses
    nothing."""

    id: str
    version: str = ""
    summary: str = ""
    source: str = ""
    sha256: str = ""
    # a wheel built by `registry add`: the tree it was built from (relative, like source) and that tree's content
    # hash, so `registry verify` can tell a wheel gone stale from its tree; empty for other sources
    source_tree: str = ""
    source_sha256: str = ""
    tags: list[str] = field(default_factory=list)
    admission: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # where the entry was read from (not written back): which index, the directory or URL its relative paths
    # resolve against, and the lower-priority indexes whose entry for the same id it shadows
    origin: str = field(default="", compare=False)
    base: str = field(default="", compare=False)
    shadows: list[str] = field(default_factory=list, compare=False)

    @classmethod
    def from_toml(cls, env_id: str, table: dict[str, Any]) -> Entry:
        if not isinstance(table, dict):
            raise RegistryError(f"[envs.{env_id}] must be a table, got {type(table).__name__}")
        tags = table.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise RegistryError(f"[envs.{env_id}] tags must be a list of strings")
        admission = table.get("admission", {})
        if not isinstance(admission, dict):
            raise RegistryError(f"[envs.{env_id}] admission must be a table")
        return cls(
            id=env_id,
            version=str(table.get("version", "")),
            summary=str(table.get("summary", "")),
            source=str(table.get("source", "")),
            sha256=str(table.get("sha256", "")).lower(),
            source_tree=str(table.get("source_tree", "")),
            source_sha256=str(table.get("source_sha256", "")).lower(),
            tags=list(tags),
            admission=dict(admission),
            extra={k: v for k, v in table.items() if k not in _KNOWN_KEYS},
        )

    def to_toml(self) -> dict[str, Any]:
        """The table, keys in a fixed order (tidy, stable diffs); empty optional parts are left out."""
        out: dict[str, Any] = {"version": self.version, "summary": self.summary, "source": self.source,
                               "sha256": self.sha256}
        if self.source_tree:
            out["source_tree"] = self.source_tree
        if self.source_sha256:
            out["source_sha256"] = self.source_sha256
        if self.tags:
            out["tags"] = list(self.tags)
        out.update(self.extra)
        if self.admission:
            out["admission"] = {k: self.admission[k] for k in sorted(self.admission, key=_admission_order)}
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, **self.to_toml()}

    @property
    def admission_summary(self) -> str:
        """``"12/12"`` (admitted / tasks), or ``"-"`` when the entry has no admission record."""
        a = self.admission
        return f"{a.get('passed', '?')}/{a.get('tasks', '?')}" if a else "-"

    @property
    def admitted_tree_hash(self) -> str:
        """The content hash of the source tree this entry's admission ran on: ``source_sha256`` for a wheel built by
        ``registry add``, ``sha256`` itself for a tree or git source (a content hash); "" when unknown (a wheel,
        sdist, URL or requirement published some other way)."""
        if self.source_sha256:
            return self.source_sha256
        s = self.source.strip()
        if s.startswith("git+"):
            return self.sha256
        if "://" in s or s.endswith(ARCHIVE_SUFFIXES) or _REQUIREMENT.match(s):
            return ""
        return self.sha256

    def matches(self, text: str) -> bool:
        """Every word of ``text`` occurs (case-insensitively) in the id, the summary or a tag."""
        hay = " ".join([self.id, self.summary, *self.tags]).lower()
        return all(word in hay for word in text.lower().split())


def _admission_order(key: str) -> tuple[int, str]:
    order = ("tasks", "passed", "report")
    return (order.index(key) if key in order else len(order), key)


# ---- the registry file ----------------------------------------------------------------------------------------------
@dataclass
class Registry:
    """A ``registry.toml`` in memory. ``header`` keeps the file's leading comment block across rewrites (tomli_w
    writes no comments)."""

    path: Path
    entries: dict[str, Entry] = field(default_factory=dict)
    header: str = ""
    layers: list[Any] = field(default_factory=list)  # the indexes merged into this one (envhub.registry.layers)

    @classmethod
    def load(cls, path: str | Path) -> Registry:
        """Read ``path``; a missing file is an empty registry (``registry add`` creates it). A symlinked index is
        followed: its relative paths resolve against the real file's directory, and a save rewrites the real file
        (the checkout's ``registry.toml`` is a symlink to the built-in index)."""
        path = Path(path).resolve()
        if not path.exists():
            return cls(path)
        return cls.loads(path.read_text(), path)

    @classmethod
    def loads(cls, text: str, path: str | Path, where: str | None = None) -> Registry:
        """Parse an index's text; ``where`` names it in errors (a URL), else ``path``."""
        where = where or str(path)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise RegistryError(f"{where} is not valid TOML: {e}") from None
        envs = data.get("envs", {})
        if not isinstance(envs, dict):
            raise RegistryError(f"{where}: [envs] must be a table of env tables")
        header = "".join(_leading_comments(text))
        return cls(Path(path), {k: Entry.from_toml(k, v) for k, v in envs.items()}, header)

    @property
    def root(self) -> Path:
        """The directory relative ``source`` and ``report`` paths resolve against."""
        return self.path.parent

    def ids(self) -> list[str]:
        return sorted(self.entries)

    def get(self, env_id: str) -> Entry:
        """The entry for ``env_id``; :class:`~envhub.plugins.UnknownEnv` with close names when there is none."""
        if env_id not in self.entries:
            where = f"registry: {self.path}" if self.path.exists() else f"registry file {self.path} does not exist"
            raise UnknownEnv(f"{unknown_message(env_id, self.ids())} ({where})")
        return self.entries[env_id]

    def search(self, text: str) -> list[Entry]:
        return [self.entries[i] for i in self.ids() if self.entries[i].matches(text)]

    def put(self, entry: Entry) -> None:
        self.entries[entry.id] = entry

    def remove(self, env_id: str) -> Entry:
        return self.entries.pop(self.get(env_id).id)

    def resolve(self, relpath: str, entry: Entry | None = None) -> Path:
        """A path from an entry, resolved against the directory of the index it came from."""
        base = Path(entry.base) if entry is not None and entry.base and "://" not in entry.base else self.root
        return (base / relpath).resolve()

    def relative(self, path: str | Path) -> str:
        """``path`` as an entry stores it: relative to the registry's directory, POSIX separators."""
        return Path(os.path.relpath(Path(path).resolve(), self.root.resolve())).as_posix()

    def dumps(self) -> str:
        import tomli_w

        body = tomli_w.dumps({"envs": {i: self.entries[i].to_toml() for i in self.ids()}})
        return (self.header + "\n" if self.header else "") + body

    def save(self) -> Path:
        """Write the file atomically (a crash mid-write never leaves half a registry)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(self.dumps())
        os.replace(tmp, self.path)
        return self.path


def _leading_comments(text: str) -> Iterator[str]:
    for line in text.splitlines(keepends=True):
        if not line.lstrip().startswith("#"):
            return
        yield line


def find_registry(explicit: str | Path | None = None, cwd: str | Path | None = None) -> Path:
    """Which ``registry.toml`` to use (see the module docstring). The result may not exist yet: with nothing
    found, it is ``./registry.toml`` unless the envhub checkout has one."""
    if explicit:
        return Path(explicit).absolute()
    env = os.environ.get(ENV_VAR, "")
    if env and "://" not in env and "," not in env:  # a URL or a list is read by load_index, never written
        return Path(env).absolute()
    here = Path(cwd or Path.cwd()).absolute()
    for d in (here, *here.parents):
        if (d / REGISTRY_FILE).is_file():
            return d / REGISTRY_FILE
    import envhub

    checkout = Path(envhub.__file__).resolve().parents[1] / REGISTRY_FILE
    return checkout if checkout.is_file() else here / REGISTRY_FILE


def load_registry(explicit: str | Path | None = None) -> Registry:
    """One index file, the one :func:`find_registry` picks: what ``registry add`` writes and ``verify`` checks.
    Browsing and installing read every index, layered: :func:`envhub.registry.layers.load_index`."""
    return Registry.load(find_registry(explicit))


# ---- sources --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Source:
    """Where an entry's package comes from. ``kind``: ``tree`` (a local source directory), ``file`` (a local
    wheel/sdist), ``url`` (a wheel/sdist to download), ``requirement`` (``name==version`` from the package index)
    or ``git`` (``git+URL@COMMIT#subdirectory=PATH``, see :class:`GitSource`)."""

    kind: str
    location: str

    def describe(self) -> str:
        return f"{self.kind} {self.location}"


def parse_source(source: str, root: str | Path) -> Source:
    """Classify an entry's ``source``; relative paths resolve against ``root`` (its index's directory or URL)."""
    source = source.strip()
    if not source:
        raise RegistryError("the entry has no source")
    if source.startswith("git+"):
        return Source("git", parse_git(source).text)
    if "://" in source:
        return Source("url", source)
    if "://" in str(root) and not _REQUIREMENT.match(source):  # an index served over HTTP: relative to its URL
        import urllib.parse

        return Source("url", urllib.parse.urljoin(str(root).rstrip("/") + "/", source))
    root = Path(root)
    path = (root / source).resolve()
    if path.is_dir():
        return Source("tree", str(path))
    if path.is_file():
        if not source.endswith(ARCHIVE_SUFFIXES):
            raise RegistryError(f"source {source} is a file but not a wheel or sdist ({', '.join(ARCHIVE_SUFFIXES)})")
        return Source("file", str(path))
    if _REQUIREMENT.match(source):
        return Source("requirement", re.sub(r"\s+", "", source))
    raise RegistryError(f"source {source!r} is neither an existing path (under {root}) nor a URL nor name==version")


@dataclass(frozen=True)
class GitSource:
    """``git+URL@COMMIT#subdirectory=PATH``: a pinned commit (40 hex digits: a branch or tag could move) and the
    package's directory in it. The entry's sha256 is the content hash of that directory, checked after fetch."""

    url: str
    commit: str
    subdirectory: str = ""

    @property
    def text(self) -> str:
        return f"git+{self.url}@{self.commit}" + (f"#subdirectory={self.subdirectory}" if self.subdirectory else "")


def parse_git(source: str) -> GitSource:
    rest, _, fragment = source[len("git+"):].partition("#")
    url, at, commit = rest.rpartition("@")
    if not at or "://" not in url or not re.fullmatch(r"[0-9a-f]{40}", commit):
        raise RegistryError(f"git source {source!r} must be git+URL@COMMIT (COMMIT: the full 40-hex sha, so the "
                            "source cannot move)")
    sub = ""
    if fragment:
        key, _, value = fragment.partition("=")
        if key != "subdirectory" or not value or value.startswith("/") or ".." in Path(value).parts:
            raise RegistryError(f"git source {source!r}: the fragment must be #subdirectory=RELATIVE/PATH")
        sub = value
    return GitSource(url, commit, sub)


def split_requirement(text: str) -> tuple[str, str | None]:
    """``"countdown==0.1.0"`` -> ``("countdown", "0.1.0")``; ``"countdown"`` -> ``("countdown", None)``."""
    name, sep, version = text.partition("==")
    name, version = name.strip(), version.strip()
    if not name or (sep and not version) or any(c in name for c in "<>=!~ "):
        raise RegistryError(f"expected ID or ID==VERSION, got {text!r}")
    return name, (version or None)
