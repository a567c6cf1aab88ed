"""What envhub adds to a harness episode: the same unmodified agent CLI solving the same swe-gym task (the golden
patch applied with one shell call, then its ending), once through envhub and once bare, in one run, per harness.

* **bare**: the harness on the host, in a plain copy of the repository, against a stub model server on loopback
  (canned replies written with envhub's dialect code: no tokenizer, no sessions, no recording, no sandbox).
* **envhub**: ``HarnessRunner`` -- the task's bwrap sandbox, the gateway on a Unix socket with the forwarder, the
  scripted golden played through SmolLM2's real tokenizer and chat template, every token recorded. Timed: the RUN
  stage (sandbox start to the diff taken); grading is reported separately (the bare run has none).

Target (#18): envhub / bare <= 1.2x.

    python benchmarks/harness.py [--reps 3] [--harness codex ...]      (make harness-tools first)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def stub_server(preset, command: str):
    """A bare model server for ``preset``'s API: turn 1 runs ``command`` with the harness's shell tool, turn 2 ends."""
    from envhub.gateway.core import ChatResult
    from envhub.gateway.dialects import anthropic, chat, responses
    from envhub.gateway.records import CallRecord, new_id
    from envhub.harness.presets import scripted

    module = {"chat": chat, "responses": responses, "anthropic": anthropic}[preset.dialect]
    policy = scripted(preset, lambda task: [command])

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self._send(200, {"object": "list", "data": [{"id": "envhub", "object": "model"}]}, None)

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            if self.path.endswith("count_tokens"):
                return self._send(200, {"input_tokens": 100}, None)
            req = module.parse(body)
            action = policy(None, req.messages)
            calls = [dict(c.to_openai(), id=new_id("call_")) for c in action.tool_calls]
            call = CallRecord(new_id("resp_"), preset.dialect, [0] * 100, [], [], "", sampled_ids=[0] * 20,
                              logprobs=[0.0] * 20)
            result = ChatResult(call, action.text, calls, "tool_calls" if calls else "stop")
            if req.stream:
                return self._send(200, None, b"".join(module.stream(result, req, body)))
            self._send(200, module.reply(result, req, body), None)

        def _send(self, status, payload, raw):
            data = raw if raw is not None else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "text/event-stream" if raw is not None else "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def bare_episode(preset, task, repo_dir: str) -> float:
    from envhub.harness.presets import HARNESS_DIR, HOME

    work = tempfile.mkdtemp(prefix="bench-bare-")
    try:
        repo, home = os.path.join(work, "repo"), os.path.join(work, "home")
        shutil.copytree(repo_dir, repo, symlinks=True)
        command = (f"git apply --whitespace=nowarn - <<'ENVHUB_GOLDEN_PATCH'\n{task['patch']}ENVHUB_GOLDEN_PATCH\n"
                   "git status --short")
        server, url = stub_server(preset, command)
        for path, text in preset.files(url, "bench-key").items():
            real = path.replace(HOME, home, 1)
            os.makedirs(os.path.dirname(real), exist_ok=True)
            with open(real, "w") as f:
                f.write(text)
        env = {"HOME": home, "PATH": f"{HARNESS_DIR}/npm/node_modules/.bin:{HARNESS_DIR}/venv/bin:/usr/bin:/bin",
               "NO_COLOR": "1", "TERM": "dumb", **{k: v.replace(HOME, home) for k, v in preset.env(url, "bench-key").items()}}
        t0 = time.perf_counter()
        r = subprocess.run([str(preset.path()), *preset.argv("Fix the issue.")], cwd=repo, env=env,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        wall = time.perf_counter() - t0
        server.shutdown()
        changed = subprocess.run(["git", "status", "--short"], cwd=repo, capture_output=True, text=True).stdout
        if "M " not in changed:
            raise SystemExit(f"{preset.name} bare run did not apply the patch (exit {r.returncode}):\n"
                             f"{(r.stdout + r.stderr)[-1500:]}")
        return wall
    finally:
        shutil.rmtree(work, ignore_errors=True)


def envhub_episode(runner, spec, preset, task) -> tuple[float, float]:
    (t,) = runner.run(spec, preset, task, timeout_s=300)
    if t.reward != 1.0:
        raise SystemExit(f"{preset.name} through envhub did not solve the task: {t.error} {t.details['harness_exit']}")
    return t.metrics["run_s"], t.metrics["eval_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--harness", nargs="*", default=None)
    args = ap.parse_args()

    import envhub
    from envhub.backends.scripted import ScriptedBackend
    from envhub.cli.common import default_tokenizer
    from envhub.gateway import Gateway
    from envhub.harness.episode import HarnessRunner
    from envhub.harness.presets import PRESETS, golden_commands, scripted
    from envhub.testing.models import load_tokenizer, resolve_model
    from envhub_swe_gym.repos import checkout

    spec = envhub.get_spec("swe-gym")
    task = [dict(t) for t in spec.load_tasks()][0]
    repo_dir = str(checkout(task["repo"], task["base_commit"]))
    tok = load_tokenizer(resolve_model(default_tokenizer()))
    print(f"swe-gym task {task['task_id']}, {args.reps} runs each, median wall of the agent's run:")
    for name in args.harness or list(PRESETS):
        preset = PRESETS[name]
        if not preset.installed():
            print(f"  {name:15s} not installed (make harness-tools)")
            continue
        bare, ours = [], []
        with HarnessRunner(Gateway(ScriptedBackend(scripted(preset, golden_commands)), tok)) as runner:
            # one untimed warm-up each: the page cache for the CLI, the gateway's codec for this harness's tools
            bare_episode(preset, task, repo_dir)
            envhub_episode(runner, spec, preset, task)
            for _ in range(args.reps):  # interleaved, so a change in the machine's load hits both sides alike
                bare.append(bare_episode(preset, task, repo_dir))
                ours.append(envhub_episode(runner, spec, preset, task))
        b, o = statistics.median(bare), statistics.median(r for r, _ in ours)
        print(f"  {name:15s} bare {b:6.2f} s   envhub {o:6.2f} s   ratio {o / b:4.2f}x (target <= 1.2x)   "
              f"+ grading {statistics.median(e for _, e in ours):.2f} s   (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
