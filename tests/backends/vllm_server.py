"""Start and stop a real vLLM OpenAI server (the CPU build in ``.venv-vllm``) on loopback, for the ``vllm`` tier.

``python -m vllm.entrypoints.openai.api_server`` from the vLLM virtualenv, on ``127.0.0.1`` and a free port, with
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache: the default takes a large share of memory), ``--enforce-eager``
(no graph capture on CPU) and fp32 so its logprobs can be compared with the ``hf`` backend's. The server runs in its
own process group (vLLM spawns an engine-core and a worker process), so stopping it kills the whole group.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("ENVHUB_VLLM_VENV", REPO / ".venv-vllm"))


def vllm_python() -> Path:
    return VENV / "bin" / "python"


def require_vllm_tier(request) -> None:
    """Skip unless the vLLM tier was asked for (``ENVHUB_REQUIRE_VLLM=1`` or ``-m vllm``): it takes minutes, and the
    default suite stays lean even where ``.venv-vllm`` exists. Asked for and no virtualenv: a failure, not a skip."""
    import pytest

    required = os.environ.get("ENVHUB_REQUIRE_VLLM") == "1"
    markexpr = request.config.getoption("markexpr", "") or ""
    if not required and not ("vllm" in markexpr and "not vllm" not in markexpr):
        pytest.skip("the vllm tier runs with `make test-vllm` (ENVHUB_REQUIRE_VLLM=1) or `pytest -m vllm`")
    if not vllm_python().exists():
        msg = f"no vLLM virtualenv at {vllm_python().parent.parent}: run scripts/setup-vllm.sh"
        if required:
            pytest.fail(msg)
        pytest.skip(msg)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def paced(step_s: float = 0.01) -> dict:
    """``VLLMServer(..., **paced())``: the server sleeps ``step_s`` in every sampling step, logits untouched
    (``paced_sampler.py``: why), so a test that must act while generations run is not racing the tiny model."""
    return {"extra_argv": ("--logits-processors", "paced_sampler:Paced"),
            "extra_env": {"PYTHONPATH": str(Path(__file__).resolve().parent), "ENVHUB_VLLM_STEP_S": str(step_s)}}


class VLLMServer:
    """``with VLLMServer(model_dir) as server: server.url`` — a running vLLM server, stopped on exit."""

    def __init__(self, model_dir: str | Path, *, served_name: str = "tiny", log_path: str | Path | None = None,
                 startup_timeout: float = 300.0, max_model_len: int = 2048, rl_routes: bool = False,
                 extra_argv: tuple[str, ...] = (), extra_env: dict[str, str] | None = None):
        self.model_dir = str(model_dir)
        self.served_name = served_name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path or f"/tmp/envhub-vllm-{self.port}.log")
        self.startup_timeout = startup_timeout
        self.max_model_len = max_model_len
        # vLLM's RL routes: VLLM_SERVER_DEV_MODE=1 registers /pause, /resume, /update_weight_version,
        # /collective_rpc...; --enable-scale-out opens /inference/v1/generate (token ids in, per-token versions out)
        self.rl_routes = rl_routes
        self.extra_argv, self.extra_env = list(extra_argv), dict(extra_env or {})
        self.proc: subprocess.Popen | None = None
        self.startup_s = 0.0

    def argv(self) -> list[str]:
        return [str(vllm_python()), "-m", "vllm.entrypoints.openai.api_server", "--model", self.model_dir,
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--dtype", "float32", "--enforce-eager", "--max-model-len", str(self.max_model_len),
                "--seed", "0"] + (["--enable-scale-out"] if self.rl_routes else []) + self.extra_argv

    def start(self) -> VLLMServer:
        return self.launch().wait_ready()

    def launch(self) -> VLLMServer:
        """Start the process and return at once (:meth:`wait_ready` waits): a caller with its own set-up to do
        overlaps it with the server's minute of start-up."""
        argv = self.argv()
        self._t0 = time.monotonic()
        self._log = open(self.log_path, "wb")
        self._cwd = tempfile.TemporaryDirectory(prefix="envhub-vllm-cwd-")
        # a new session: the server and its engine/worker children form one process group to kill at the end
        env = cpu_env()
        if self.rl_routes:
            env["VLLM_SERVER_DEV_MODE"] = "1"
        env.update(self.extra_env)
        # an empty private working directory: `python -m` (the server, and vLLM's own helper subprocesses) puts the
        # cwd first on sys.path, and a shared /tmp holding some `attr.py` once shadowed aiohttp's `attr` and
        # failed every server of the tier
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True, cwd=self._cwd.name)
        return self

    def wait_ready(self) -> VLLMServer:
        assert self.proc is not None, "launch() first"
        t0 = self._t0
        deadline = t0 + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode} during startup:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        self.startup_s = time.monotonic() - t0
                        return self
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise TimeoutError(f"vLLM server not ready after {self.startup_timeout:g}s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None:
            return
        self._cwd.cleanup()  # empty (vLLM writes nothing there); a live process keeps its cwd's inode anyway
        for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
                # the group may outlive its leader for a moment: make sure every member is gone
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
            time.sleep(0.5)
        self.proc = None
        self._log.close()

    def log_tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return "(no log)"

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
