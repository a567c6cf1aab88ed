"""Round-trip latency of one shell command: our bash tool in a bwrap sandbox vs the usual alternatives, one run.

    .venv/bin/python benchmarks/tools_latency.py [--n 4000] [--rounds 4]

Measured, for a builtin (``:``), a builtin with a quoted argument (``: 'a b'``, which envhub types under ``eval``)
and an external command (``/bin/true``):

* ``envhub bash tool``   BashTool.run -> the host's copy of the pty of the bash in a bwrap sandbox (handed over by
                         the sandbox's action server on first use) -> back
* ``raw ptyprocess``     an in-process ptyprocess bash: write the command plus a sentinel, read until the sentinel
                         (the floor for a persistent shell; no sandbox, no socket); also typing envhub's command
                         line (``<cmd> <&99``, or ``eval '<cmd>' <&99`` when quoted), which separates the shell's
                         extra work from the transport
* ``subprocess.run``     a fresh ``bash -c`` per command (no persistent state)
* ``tmux``               send-keys + capture-pane polled every 10 ms (how tmux-based agent runtimes work)

Targets from the issue: envhub ≤ 1.2x raw ptyprocess; tmux (10 ms poll) ≥ 100x slower than envhub.
"""
from __future__ import annotations

import argparse
import os
import random
import select
import shutil
import statistics
import subprocess
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from envhub.sandbox.agent.bash import inline_line  # noqa: E402  (imported here, not per call: it would be timed)

# ``:`` and ``/bin/true`` are plain words, typed as they are; the quoted one is typed under ``eval`` (see
# envhub.sandbox.agent.bash.inline_line), the path every command with quotes, $, pipes or && takes
COMMANDS = {"builtin": ":", "quoted": ": 'a b'", "external": "/bin/true"}


def stats(samples: list[float]) -> tuple[float, float]:
    s = sorted(samples)
    return statistics.median(s), s[min(len(s) - 1, int(0.9 * len(s)))]


class RawPty:
    """The floor for a persistent shell: an in-process ptyprocess bash, the command plus a sentinel on one line."""

    def __init__(self):
        from ptyprocess import PtyProcess

        self.p = PtyProcess.spawn(["bash", "--norc", "--noprofile", "--noediting", "-i"], echo=False,
                                  env={"PATH": "/usr/bin:/bin", "PS1": "", "TERM": "dumb"})
        self.p.write(b"PS1=''; PS2=''; stty -echo -onlcr; exec 99</dev/null\n")
        while select.select([self.p.fd], [], [], 0.3)[0]:
            os.read(self.p.fd, 65536)

    def run_wrapped(self, cmd: str) -> None:
        """The command as envhub types it (under ``eval`` unless it is plain words, stdin from /dev/null): what is
        left between this and envhub is the transport, not the shell's work."""
        self.run(inline_line(cmd))

    def run(self, cmd: str) -> None:
        token = uuid.uuid4().hex[:12]
        marker = f"__{token}_".encode()
        os.write(self.p.fd, f"{cmd}; printf '__%s_%d__\\n' {token} $?\n".encode())
        buf = b""
        while marker not in buf:
            select.select([self.p.fd], [], [])
            buf += os.read(self.p.fd, 65536)

    def close(self) -> None:
        self.p.terminate(force=True)


def bench_interleaved(n: int, rounds: int) -> tuple[dict[str, dict[str, list[float]]], dict[str, list[float]]]:
    """envhub and raw ptyprocess (the bare command, and envhub's command line) interleaved command by command, so they
    share the machine's noise (other work on a 2-core box moves all alike instead of skewing whichever ran during a
    busy second), in an order shuffled at every step (a command runs faster right after another one in the same
    process or shell: a fixed order would hand that warm-up to the same method each time). ``rounds`` repeats the
    whole measurement; the envhub / raw ratio of each round is returned too, so a reader sees its spread.

    ``subprocess.run`` is timed in its own block afterwards: each run forks this process, which marks all its memory
    copy-on-write, so whatever runs next pays page faults in proportion to the memory it touches -- a cost of the
    fork baseline that interleaving would bill to its neighbours."""
    from envhub.sandbox import SandboxSpec, start
    from envhub.tools import bash_tool

    class Env:  # what a ToolEnv gives a tool: an object with a .sandbox
        sandbox = start(SandboxSpec(runtime="bwrap"))

    # each method has a shell of its own: a shell that just ran a command answers the next one faster (its pages
    # and the CPU's caches are warm), so two methods sharing one bash would each run after a warm-up the others lack
    tool, raw, raw_wrapped = bash_tool(), RawPty(), RawPty()
    methods = [("envhub bash tool (bwrap)", lambda cmd: tool.run(Env, {"command": cmd})),
               ("raw ptyprocess (in-process)", raw.run),
               ("raw ptyprocess, envhub's command line", raw_wrapped.run_wrapped)]
    fork = "subprocess.run per command"
    out: dict[str, dict[str, list[float]]] = {m: {k: [] for k in COMMANDS} for m, _ in methods + [(fork, None)]}
    ratios: dict[str, list[float]] = {k: [] for k in COMMANDS}
    shuffle = random.Random(0).shuffle
    try:
        for kind, cmd in COMMANDS.items():
            assert tool.run(Env, {"command": cmd}).content == "[exit code: 0]"
            for _ in range(rounds):
                this: dict[str, list[float]] = {m: [] for m, _ in methods}
                for i in range(n // rounds + 20):
                    shuffle(methods)
                    for method, fn in methods:
                        t = time.perf_counter()
                        fn(cmd)
                        if i >= 20:  # warm-up
                            this[method].append(time.perf_counter() - t)
                for method, samples in this.items():
                    out[method][kind] += samples
                ratios[kind].append(statistics.median(this["envhub bash tool (bwrap)"])
                                    / statistics.median(this["raw ptyprocess (in-process)"]))
            for _ in range(min(n, 300)):
                t = time.perf_counter()
                subprocess.run(["bash", "-c", cmd], capture_output=True)
                out[fork][kind].append(time.perf_counter() - t)
    finally:
        Env.sandbox.stop()
        raw.close()
        raw_wrapped.close()
    return out, ratios


def bench_tmux(n: int, poll_s: float = 0.01) -> dict[str, list[float]] | None:
    if shutil.which("tmux") is None:
        return None
    sock = f"envhub-bench-{os.getpid()}"
    tmux = ["tmux", "-L", sock]
    subprocess.run(tmux + ["new-session", "-d", "-s", "b", "-x", "200", "-y", "50", "bash --norc --noprofile"],
                   check=True)
    out = {}
    try:
        subprocess.run(tmux + ["send-keys", "-t", "b", "PS1=''; clear", "Enter"], check=True)
        time.sleep(0.3)
        for name, cmd in COMMANDS.items():
            samples = []
            for _ in range(n):
                token = uuid.uuid4().hex[:12]
                t = time.perf_counter()
                subprocess.run(tmux + ["send-keys", "-t", "b", f"clear; {cmd}; echo __{token}_$?", "Enter"],
                               check=True)
                while True:  # the classic loop: sleep, capture the pane, look for the sentinel
                    time.sleep(poll_s)
                    pane = subprocess.run(tmux + ["capture-pane", "-p", "-t", "b"], capture_output=True,
                                          text=True).stdout
                    if f"__{token}_0" in pane:
                        break
                samples.append(time.perf_counter() - t)
            out[name] = samples
    finally:
        subprocess.run(tmux + ["kill-server"], capture_output=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4000, help="commands per method and kind")
    ap.add_argument("--rounds", type=int, default=4, help="envhub / raw measured this many times, spread printed")
    ap.add_argument("--tmux-n", type=int, default=30, help="commands for tmux (each takes >= 10 ms)")
    args = ap.parse_args()
    results, ratios = bench_interleaved(args.n, args.rounds)
    tmux = bench_tmux(args.tmux_n)
    if tmux:
        results["tmux send-keys/capture-pane, 10 ms poll"] = tmux
    print(f"{'method':42s} {'kind':9s} {'median':>10s} {'p90':>10s}")
    med: dict[tuple[str, str], float] = {}
    for method, by_kind in results.items():
        for kind, samples in by_kind.items():
            m, p90 = stats(samples)
            med[(method, kind)] = m
            print(f"{method:42s} {kind:9s} {m * 1e3:8.3f}ms {p90 * 1e3:8.3f}ms")
    ours, raw = "envhub bash tool (bwrap)", "raw ptyprocess (in-process)"
    print()
    for kind in COMMANDS:
        r = med[(ours, kind)] / med[(raw, kind)]
        spread = ", ".join(f"{x:.2f}" for x in sorted(ratios[kind]))
        print(f"{kind:9s} envhub / raw ptyprocess = {r:5.2f}x (target <= 1.2x; by round: {spread})")
        w = med[(ours, kind)] / med[("raw ptyprocess, envhub's command line", kind)]
        print(f"{kind:9s} envhub / raw ptyprocess typing envhub's command line = {w:5.2f}x (the transport alone)")
        s = med[("subprocess.run per command", kind)] / med[(ours, kind)]
        print(f"{kind:9s} subprocess.run / envhub = {s:5.1f}x")
        if tmux:
            t = med[("tmux send-keys/capture-pane, 10 ms poll", kind)] / med[(ours, kind)]
            print(f"{kind:9s} tmux(10 ms poll) / envhub = {t:6.1f}x (target >= 100x)")


if __name__ == "__main__":
    main()
