"""Throughput at the limit (#28 item 10): 32 concurrent 64 KB Codex-shaped agent loops through AReaL's own routes,
each session closed and exported, against the gateway of another revision and against AReaL's proxy, in one run.

Every server runs in its own process on loopback; this process is the client (32 loops, one keep-alive
connection each, see "The client" below). A loop is one
AReaL-style episode after another: ``/grant_capacity``, ``/rl/start_session``, ``--calls`` chat-completions calls
on a 64 KB context (a system prompt, 10 tools, 31 earlier tool calls with their outputs; each call echoes the
reply it got and adds a 1 KB tool result), ``/rl/set_reward``, ``/rl/end_session``, ``/export_trajectories``
(``style="individual"``, the whole body read). By default every session opens with the same messages, as the
sessions of a GRPO group do (envhub renders that opening once: ``envhub.gateway.calls.OpeningCache``);
``--distinct`` gives each session its own task text, so every opening is rendered. The same client code drives
every server: it speaks only the routes AReaL's proxy serves.

Per server, over the whole window (every session started in it is finished and exported):

* **calls/s**: model calls / wall seconds;
* **CPU ms/call**: the server process's own CPU time (user + system, from psutil on its pid and any children) over
  the window / model calls: the client's CPU is not in it, the export's is (its share per call);
* **floor** (envhub only): the server CPU of the last call's body POSTed to a route that only reads and parses it:
  what any HTTP JSON server pays per call here, before the gateway does anything;
* **export ms**: close + export of one 8-call session alone after the load (client wall time, median of 20) and the
  export's size; the server CPU it took (mean of the 20).

Servers: ``ours`` (this checkout), ``before`` (``--before REV``: the gateway at another git revision, extracted
with ``git archive`` into a temporary directory and run the same way) and ``areal`` (AReaL 1.0.4's
``proxy_rollout_server`` in ``.venv-areal``, ``make areal-venv``; skipped with the reason when that venv is
missing). Each envhub gateway runs ``envhub gateway --model golden`` with the scripted Codex-shaped policy of
``benchmarks/gateway.py``; AReaL's runs its own ``main()`` with a stand-in engine (``benchmarks/areal_proxy.py``)
that returns one fixed tool call rendered by the same tokenizer.

The client shares the 2 cores with the server, so calls/s is bounded by what the client leaves the server. It is a
lean HTTP/1.1 load generator (:class:`Conn`: asyncio streams on uvloop when installed, one keep-alive connection per
loop, the request head and body written as pre-built bytes, the reply read by ``Content-Length`` or chunks), not a
general HTTP client: aiohttp's per-request work took more of the cores than the gateway did (#28 item 10). The same
client drives every server, ours, ``before`` and AReaL's, so the figures stay comparable; ``--client aiohttp`` runs
the earlier aiohttp client instead.

Targets (#28 item 10): <= 3 ms server CPU per call including the export's share, >= 300 calls/s on 2 cores.

    python benchmarks/gateway_throughput.py [--seconds 10] [--before HEAD~3] [--no-areal]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
TOOL_NAMES = ["exec_command", "write_stdin", "apply_patch", "view_image", "read_file", "list_dir", "grep",
              "update_plan", "web_fetch", "request_user_input"]
AREAL_PY = ROOT / ".venv-areal" / "bin" / "python"
EXPORTS = 20
FLOOR_CALLS = 300


def chat_tools() -> list[dict]:
    props = {f"p{i}": {"type": "string", "description": "A parameter of this tool, described at some length. " * 3}
             for i in range(4)}
    return [{"type": "function", "function": {"name": n, "description": f"{n}: " + "Runs an operation. " * 12,
                                              "parameters": {"type": "object", "properties": props,
                                                             "required": ["p0"]}}} for n in TOOL_NAMES]


def context(turns: int = 31, task: str = "") -> list[dict]:
    """The 64 KB Codex-shaped opening: instructions, the task, ``turns`` earlier tool calls with their outputs."""
    msgs: list[dict] = [{"role": "system", "content": "You are Codex, a coding agent. " * 200},
                        {"role": "user", "content": f"Task {task}. " + "Fix the failing test in tests/test_parser.py. " * 20}]
    for i in range(turns):
        msgs.append({"role": "assistant", "content": f"Reading file {i}.",
                     "tool_calls": [{"id": f"call_h{i}", "type": "function", "function": {
                         "name": "exec_command", "arguments": json.dumps({"cmd": f"cat src/file_{i}.py"})}}]})
        msgs.append({"role": "tool", "tool_call_id": f"call_h{i}",
                     "content": "".join(f"    line {j} of file {i}: x = compute(x, {j})\n" for j in range(24))})
    return msgs


# ---- servers --------------------------------------------------------------------------------------------------
def start_envhub(tokenizer: str, src: Path | None = None) -> tuple[subprocess.Popen, str]:
    """``envhub gateway --model golden`` in its own process; ``src``: a directory whose ``envhub`` package is run
    instead of this checkout's (the ``before`` revision)."""
    path = [str(BENCH)] + ([str(src)] if src else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), OMP_NUM_THREADS="1")
    code = ("import sys, envhub; sys.stderr.write('envhub from ' + envhub.__file__ + '\\n'); "
            "from envhub.cli import main; main()")
    proc = subprocess.Popen([sys.executable, "-c", code, "gateway", "--model", "golden", "--policy", "gateway:policy",
                             "--tokenizer", tokenizer, "--port", "0", "--max-model-len", "200000"],
                            stdout=subprocess.PIPE, stderr=(log := _log()), text=True, env=env, cwd=src or ROOT)
    line = proc.stdout.readline()
    try:
        return proc, json.loads(line)["gateway"]
    except (ValueError, KeyError):
        proc.kill()
        log.seek(0)
        raise SystemExit(f"the gateway did not start ({line!r}):\n{log.read()[-4000:]}") from None


def start_areal(tokenizer: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(BENCH))
    proc = subprocess.Popen([str(AREAL_PY), str(BENCH / "areal_proxy.py"), "--tokenizer", tokenizer],
                            stdout=subprocess.PIPE, stderr=(log := _log()), text=True, env=env, cwd=ROOT)
    seen = []
    for line in proc.stdout:  # AReaL logs to stdout too: the ready line is the one that parses
        seen.append(line)
        if line.startswith('{"areal"'):
            threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep draining its log
            return proc, json.loads(line)["areal"]
    proc.kill()
    log.seek(0)
    raise SystemExit(f"AReaL's proxy did not start:\n{''.join(seen)[-3000:]}\n{log.read()[-3000:]}")


def _log():
    """A server's stderr goes to a file: a pipe nobody reads would block a server that logs per call."""
    return tempfile.TemporaryFile("w+")


def before_tree(rev: str) -> Path:
    out = Path(tempfile.mkdtemp(prefix="envhub-before-"))
    tar = subprocess.run(["git", "archive", rev, "envhub"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(out)], input=tar, check=True)
    return out


def cpu_s(pid: int) -> float:
    import psutil

    p = psutil.Process(pid)
    total = 0.0
    for q in [p, *p.children(recursive=True)]:
        try:
            t = q.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


# ---- the client -----------------------------------------------------------------------------------------------
class Conn:
    """One keep-alive HTTP/1.1 connection: ``await conn.post(path, body, headers) -> (status, reply bytes)``.

    Lean on purpose (see the module docstring): the head is a few bytes formatted per request, the body is written
    as given, the reply's head is parsed for its status, ``Content-Length`` / chunked encoding and ``Connection:
    close`` (then the next request opens a new connection)."""

    def __init__(self, url: str):
        from urllib.parse import urlsplit

        u = urlsplit(url)
        self.host, self.port = u.hostname, u.port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        if self.writer is None:
            import socket

            self.reader, self.writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
            self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        extra = b"".join(b"%s: %s\r\n" % (k.encode(), v.encode()) for k, v in headers.items())
        # head and body in one write: two would let Nagle hold the body's tail for the server's delayed ACK (40 ms)
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n%s\r\n%s" % (path.encode(), self.host.encode(), self.port,
                                                                   len(body), extra, body))
        assert self.reader is not None
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        fields = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in lines[1:] if ln)}
        if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
            parts = []
            while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
                parts.append(await self.reader.readexactly(size))
                await self.reader.readexactly(2)
            await self.reader.readuntil(b"\r\n")  # the empty trailer
            raw = b"".join(parts)
        else:
            raw = await self.reader.readexactly(int(fields.get(b"content-length", b"0")))
        if fields.get(b"connection", b"").lower() == b"close":
            self.close()
        return status, raw

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


class AiohttpConn:
    """The earlier client (``--client aiohttp``): the same calls through an aiohttp session."""

    def __init__(self, url: str, session):
        self.url, self.session = url, session

    async def post(self, path: str, body: bytes, headers: dict) -> tuple[int, bytes]:
        async with self.session.post(self.url + path, data=body,
                                     headers={**headers, "Content-Type": "application/json"}) as r:
            return r.status, await r.read()

    def close(self) -> None:
        pass


class Loop:
    def __init__(self, url: str, admin: str | None, calls: int, distinct: bool = False):
        self.url, self.calls, self.distinct = url, calls, distinct
        self.admin = {"Authorization": f"Bearer {admin}"} if admin else {}
        self.tools_json = json.dumps(chat_tools()).encode()
        self.opening_json = b",".join(json.dumps(m).encode() for m in context())
        self.done_calls = self.sessions = 0
        self.export_bytes: list[int] = []
        self.last_body = b""

    async def post(self, http, path: str, body: dict | bytes, headers: dict) -> bytes:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, raw = await http.post(path, data, headers)
        if status != 200:
            raise RuntimeError(f"{path}: {status} {raw[:300]!r}")
        return raw

    async def session(self, http, n: int) -> tuple[str, dict]:
        """One episode up to its end; returns its id and the session key's headers (export is separate). The body
        is assembled from the messages' JSON, the 64 KB opening serialised once: the client's CPU is not measured,
        but it shares the 2 cores with the server."""
        await self.post(http, "/grant_capacity", {}, self.admin)
        s = json.loads(await self.post(http, "/rl/start_session", {"task_id": f"t{n}"}, self.admin))
        h = {"Authorization": f"Bearer {s['api_key']}"}
        parts = [b",".join(json.dumps(m).encode() for m in context(task=f"{n}-{time.perf_counter()}"))
                 if self.distinct else self.opening_json]
        for turn in range(self.calls):
            body = self.last_body = b'{"model":"m","tools":%s,"messages":[%s]}' % (self.tools_json, b",".join(parts))
            reply = json.loads(await self.post(http, "/chat/completions", body, h))
            m = reply["choices"][0]["message"]
            echo = {"role": "assistant", "content": m.get("content")}
            if m.get("tool_calls"):
                echo["tool_calls"] = m["tool_calls"]
            out = f"output of step {turn}\n" + "x = 1\n" * 170
            new = [echo] + ([{"role": "tool", "tool_call_id": c["id"], "content": out} for c in m["tool_calls"]]
                            if m.get("tool_calls") else [{"role": "user", "content": out}])
            parts += [json.dumps(x).encode() for x in new]
            self.done_calls += 1
        await self.post(http, "/rl/set_reward", {"reward": 1.0}, h)
        return s["session_id"], h

    async def finish(self, http, sid: str, h: dict) -> int:
        await self.post(http, "/rl/end_session", {}, h)
        raw = await self.post(http, "/export_trajectories", {"session_id": sid, "style": "individual"}, self.admin)
        n = raw.count(b'"interaction_id"')  # read whole, not parsed: the client's CPU is not what is measured
        if n != self.calls:
            raise RuntimeError(f"export of {sid}: {n} interactions, {self.calls} calls made")
        self.sessions += 1
        return len(raw)


async def measure(url: str, pid: int, admin: str | None, seconds: float, sessions: int, calls: int,
                  distinct: bool = False, client: str = "lean") -> dict:
    import contextlib

    loop = Loop(url, admin, calls, distinct)
    async with contextlib.AsyncExitStack() as stack:
        if client == "aiohttp":
            import aiohttp

            shared = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=sessions * 2), timeout=aiohttp.ClientTimeout(total=600)))

            def conn():
                return AiohttpConn(url, shared)
        else:
            def conn():
                return Conn(url)
        http = conn()
        sid, h = await loop.session(http, -1)  # warm-up: first-call imports and caches, not measured
        await loop.finish(http, sid, h)
        loop.done_calls = loop.sessions = 0

        async def agent(n: int) -> None:
            http = conn()  # each loop its own keep-alive connection, as an agent has
            while time.perf_counter() < deadline:
                sid, h = await loop.session(http, n)
                loop.export_bytes.append(await loop.finish(http, sid, h))

        cpu0, t0, own0 = cpu_s(pid), time.perf_counter(), time.process_time()
        deadline = t0 + seconds
        await asyncio.gather(*(agent(n) for n in range(sessions)))
        wall, cpu, n = time.perf_counter() - t0, cpu_s(pid) - cpu0, loop.done_calls
        client_cpu = time.process_time() - own0
        exports, export_cpu = [], 0.0
        for _ in range(EXPORTS):  # close + export of one session alone, nothing else running
            sid, h = await loop.session(http, 1000)
            c0, e0 = cpu_s(pid), time.perf_counter()
            size = await loop.finish(http, sid, h)
            exports.append((time.perf_counter() - e0) * 1e3)
            export_cpu += cpu_s(pid) - c0  # psutil's CPU times tick in 10 ms: the mean of many, not a median
        floor = None
        if admin is None:  # envhub: the last call's body POSTed to a route that only reads and parses it (then 404s)
            c0 = cpu_s(pid)
            for _ in range(FLOOR_CALLS):
                await http.post("/v1/none", loop.last_body, {})
            floor = (cpu_s(pid) - c0) * 1e3 / FLOOR_CALLS
    return {"calls": n, "wall_s": wall, "calls_per_s": n / wall, "cpu_ms_per_call": cpu * 1e3 / n,
            "cpu_busy": cpu / wall, "client_cpu_ms_per_call": client_cpu * 1e3 / n, "export_ms": statistics.median(exports),
            "export_cpu_ms": export_cpu * 1e3 / EXPORTS, "export_mb": size / 1e6, "floor_cpu_ms": floor}


def run_one(name: str, start, seconds: float, sessions: int, calls: int, profile: str | None = None,
            distinct: bool = False, client: str = "lean") -> dict:
    proc, url = start()
    spy = None
    if profile:  # py-spy's collapsed stacks of the server over the whole run (its samples, not its CPU, are read)
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(proc.pid), "-r", "200",
                                "-f", "raw", "-o", f"{profile}-{name}.txt", "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        admin = "areal-admin" if name == "areal" else None
        return client_run(measure(url, proc.pid, admin, seconds, sessions, calls, distinct, client))
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()


def client_run(coro):
    """The client's event loop: uvloop's when installed (the lean client's C transports leave more of the 2 cores
    to the server), whichever server it drives."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="load window per server")
    ap.add_argument("--sessions", type=int, default=32)
    ap.add_argument("--calls", type=int, default=8, help="model calls per session")
    ap.add_argument("--before", default=None, help="a git revision whose gateway runs as the baseline")
    ap.add_argument("--no-areal", action="store_true")
    ap.add_argument("--only", choices=["ours", "before", "areal"], default=None)
    ap.add_argument("--tokenizer", default=None, help="default: smollm2 when installed, else tiny")
    ap.add_argument("--distinct", action="store_true",
                    help="every session opens with its own task text (by default all open alike, as a GRPO group)")
    ap.add_argument("--profile", default=None, help="py-spy the servers: PREFIX-<name>.txt (collapsed stacks)")
    ap.add_argument("--reverse", action="store_true",
                    help="run the servers in reverse order (areal, before, ours): on a host whose load drifts, "
                         "alternating the order between runs shows how much of a ratio the drift made")
    ap.add_argument("--client", choices=["lean", "aiohttp"], default="lean",
                    help="the load generator, the same for every server (see the module docstring)")
    args = ap.parse_args()
    from envhub.cli.common import default_tokenizer

    tok = args.tokenizer or default_tokenizer()
    servers = {"ours": lambda: start_envhub(tok)}
    if args.before:
        tree = before_tree(args.before)
        servers["before"] = lambda: start_envhub(tok, tree)
    if not args.no_areal:
        if AREAL_PY.exists():
            servers["areal"] = lambda: start_areal(tok)
        else:
            print("areal: skipped (.venv-areal missing: make areal-venv)")
    if args.only:
        servers = {args.only: servers[args.only]}
    if args.reverse:
        servers = dict(reversed(list(servers.items())))
    print(f"{args.sessions} sessions x {args.calls} calls on a 64 KB Codex-shaped context, close + individual "
          f"export each; {'each session its own task' if args.distinct else 'one task (a group): same opening'}; "
          f"tokenizer {tok}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}; client {args.client}")
    res = {}
    for name, start in servers.items():
        res[name] = r = run_one(name, start, args.seconds, args.sessions, args.calls, args.profile,
                                args.distinct, args.client)
        print(f"  {name:7s} {r['calls_per_s']:7.1f} calls/s   server CPU {r['cpu_ms_per_call']:6.2f} ms/call "
              f"({r['cpu_busy']:.2f} cores busy, {r['calls']} calls; client {r['client_cpu_ms_per_call']:.2f} ms/call)"
              f"   close+export of one session "
              f"{r['export_ms']:6.1f} ms wall / {r['export_cpu_ms']:6.1f} ms CPU, {r['export_mb']:.2f} MB"
              + (f"   HTTP + JSON parse floor {r['floor_cpu_ms']:.2f} ms CPU/call" if r["floor_cpu_ms"] else ""),
              flush=True)
    ours = res.get("ours")
    for name in ("before", "areal"):
        if ours and name in res:
            o = res[name]
            print(f"  ours vs {name}: {ours['calls_per_s'] / o['calls_per_s']:.2f}x calls/s, "
                  f"{o['cpu_ms_per_call'] / ours['cpu_ms_per_call']:.2f}x less CPU per call, "
                  f"close+export {o['export_ms'] / ours['export_ms']:.2f}x faster "
                  f"({o['export_cpu_ms'] / max(ours['export_cpu_ms'], 1e-9):.1f}x less CPU)")
    if ours:
        print(f"  targets: <= 3 ms CPU/call ({'met' if ours['cpu_ms_per_call'] <= 3 else 'NOT met'}), "
              f">= 300 calls/s ({'met' if ours['calls_per_s'] >= 300 else 'NOT met'})")
    print("JSON " + json.dumps(res))


if __name__ == "__main__":
    main()
