"""How a harness runs in its sandbox: the preset's config files, the forwarder from ``127.0.0.1:PORT`` to the gateway's
socket, the agent CLI in its own process group, and the stop file that ends it when its call budget is spent. The
episode around it (the env, the session, the grade) is :mod:`envhub.harness.episode`.
"""
from __future__ import annotations

import os
import secrets
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from envhub.harness.presets import HARNESS_DIR, HOME, Preset

GATEWAY_DIR = "/run/envhub-gateway"
PORT = 18080
FORWARDER = Path(__file__).with_name("forwarder.py")


def run_harness(sb: Any, gateway_dir: str, preset: Preset, session: Any, instructions: str, timeout_s: float, *,
                harness_dir: Path = HARNESS_DIR) -> dict:
    """Run ``preset``'s agent CLI in sandbox ``sb`` with ``instructions`` until it exits, its ``timeout_s`` passes
    (the sandbox's command is killed) or ``session``'s call budget is spent (stopped through a file the host makes in
    ``gateway_dir``, bound at :data:`GATEWAY_DIR`); the forwarder inside serves ``127.0.0.1:PORT`` from the
    gateway's socket.

    Returns:
        ``{"exit_code", "timed_out", "duration_s", "output_tail"}``, with ``"stopped"`` (the call budget) and
        ``"error"`` (the time budget) when they apply.
    """
    key = session.api_key
    url = f"http://127.0.0.1:{PORT}"
    for path, text in preset.files(url, key).items():
        sb.write_file(path, text)
    sb.write_file("/tmp/envhub-forwarder.py", FORWARDER.read_text())
    python = os.path.realpath(sys.executable)
    argv = [str(preset.path())] + preset.argv(instructions)
    workdir = sb.spec.workdir
    stop_name = f"stop-{secrets.token_hex(8)}"  # the host creates it (in the bound gateway dir) to stop the harness
    # the forwarder returns once its port listens (it serves from a fork, still in this script's process
    # group: the action server kills that group when the script ends), so the harness starts right after it
    script = (f"mkdir -p {shlex.quote(HOME)}\n"
              f"{shlex.quote(python)} -I -S /tmp/envhub-forwarder.py {PORT} {GATEWAY_DIR}/gw.sock "
              f">/tmp/fwd.log 2>&1 || {{ echo 'envhub: the forwarder could not listen'; cat /tmp/fwd.log; "
              f"exit 96; }}\n"
              f"cd {shlex.quote(workdir)} || exit 97\n"
              f"setsid {shlex.join(argv)} </dev/null & H=$!\n"
              # a watcher stops the harness's whole process group when the host asks; the shell itself waits
              # on the harness, so its exit is seen at once. Its sleeps do not hold the command's output open
              # (the action server reads that to its end): the watcher is killed, a sleep may outlive it
              f"(while [ ! -e {GATEWAY_DIR}/{stop_name} ]; do sleep 0.2 >/dev/null 2>&1; done; "
              f"echo 'envhub: harness stopped by the host'; kill -TERM -- -$H; sleep 1 >/dev/null 2>&1; "
              f"kill -KILL -- -$H) & W=$!\n"
              f"wait $H; S=$?; kill $W 2>/dev/null; exit $S")
    environ = {"HOME": HOME, "PATH": f"{harness_dir}/npm/node_modules/.bin:{harness_dir}/venv/bin:/usr/bin:/bin",
               "NO_COLOR": "1", "TERM": "dumb", **preset.env(url, key)}
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(sb.exec, ["bash", "-c", script], timeout=timeout_s, env=environ,
                              output_limit=1 << 16)
        stopped = None
        while not running.done():  # past the call budget the harness is stopped here, whatever it does with
            try:                    # the gateway's refusal (litellm retries even a 403 for minutes)
                running.result(timeout=0.25)
            except FutureTimeout:
                if stopped is None and "call_budget_exhausted" in session.flags:
                    stopped = f"stopped: its budget of {session.max_calls} model calls was spent"
                    Path(gateway_dir, stop_name).touch()
        r = running.result()
    info = {"exit_code": r.exit_code, "timed_out": r.timed_out, "duration_s": round(r.duration_s, 2),
            "output_tail": (r.stdout + r.stderr)[-2000:]}
    if stopped:
        info["stopped"] = stopped
        Path(gateway_dir, stop_name).unlink(missing_ok=True)
    if r.timed_out:
        info["error"] = f"the {preset.name} harness ran past its {timeout_s:g} s budget and was killed"
    return info
