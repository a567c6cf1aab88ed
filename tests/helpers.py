"""Test helpers: real distributions on disk (dist-info + module), run in subprocesses; whether bwrap works here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_dist(site: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str], version: str = "0.1.0") -> None:
    """Write an installed distribution into ``site`` as pip would: ``<dist>.dist-info`` plus its modules."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    eps = "[envhub]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points.items())
    (info / "entry_points.txt").write_text(eps)
    for name, src in modules.items():
        (site / f"{name}.py").write_text(textwrap.dedent(src))


def run_py(code: str, site: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if site is not None:
        env["PYTHONPATH"] = f"{site}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


def run_cli(*args: str, site: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_py(f"import sys; sys.argv = ['envhub', *{list(args)!r}]; from envhub.cli import main; main()",
                  site=site, timeout=timeout)


def bwrap_why_not() -> str | None:
    """Why real bwrap sandboxes cannot run on this machine (``None``: they can)."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed (apt-get install bubblewrap)"
    r = subprocess.run(["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr", "--symlink",
                        "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
                        "true"], capture_output=True, text=True)
    return None if r.returncode == 0 else f"bwrap cannot create namespaces here: {r.stderr.strip()}"


def load_trajectories(path: str | Path) -> list:
    """Trajectories from a run directory (``rollout --out``) or anything ``iter_trajectories`` reads (a
    ``save_to_disk`` directory, JSON lines)."""
    from envhub.cli.runs import TRAJECTORIES, is_run
    from envhub.rollout.fidelity import iter_trajectories

    path = Path(path)
    return list(iter_trajectories(path / TRAJECTORIES if is_run(path) else path))
