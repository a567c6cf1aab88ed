"""What the gateway adds per model call, and how many calls per second it sustains, against calling the backend
directly, in one run.

The gateway runs as ``envhub gateway --model golden`` in its own process (as in production: the harness, the
gateway and the trainer are separate processes); this process is the client. The scripted backend plays a
Codex-shaped agent (an ``exec_command`` call per turn), so the backend itself costs next to nothing and what is
measured is the gateway: HTTP, JSON, dialect translation, echo matching, the exact-token splice, recording.

1. **Latency, 64 KB Codex-shaped request** (Responses API, 10 tools, ~54 input items): per iteration a fresh session,
   an untimed parent call, then the timed call that extends it (the steady state of an agent loop: the harness
   echoes the parent's output and adds a 1 KB tool result). Baseline: ``backend.generate`` in-process on the same
   prompt ids (the floor any serving path pays). Also shown: one full re-render + tokenization of that context,
   which a re-rendering proxy (AReaL's ``hf`` mode) pays on every call and the splice does not.
2. **Sustained calls/s, 32 sessions**: 32 concurrent agent loops (small chat-completions tool calls, 6 turns per
   session, then a new session) for ``--seconds``; baseline: the same 32 loops calling the backend in-process
   with envhub's executor-style token assembly (``ChatCodec`` prompt / delta ids).

Targets (#17): <= 2 ms p50 added per call, >= 300 calls/s on 2 cores. AReaL's proxy was not run side by side here
(its offline install needs a dozen pinned extras; ``../shared/research/blackbox_gateway.md`` §7 has its figures
from the same kind of machine: +14.7-19.5 ms p50 added on the 64 KB call, 7.5 calls/s sustained).

    python benchmarks/gateway.py [--iters 60] [--seconds 10] [--tokenizer smollm2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOL_NAMES = ["exec_command", "write_stdin", "apply_patch", "view_image", "read_file", "list_dir", "grep",
              "update_plan", "web_fetch", "request_user_input"]


def tools() -> list[dict]:
    props = {f"p{i}": {"type": "string", "description": "A parameter of this tool, described at some length. " * 3}
             for i in range(4)}
    return [{"type": "function", "name": n, "description": f"{n}: " + "Runs an operation in the workspace. " * 12,
             "parameters": {"type": "object", "properties": props, "required": ["p0"]}} for n in TOOL_NAMES]


def policy(task, messages):
    """The Codex-shaped scripted agent: one exec_command per turn (module-level: ``--policy gateway:policy``)."""
    from envhub.env import Action, ToolCall

    n = sum(m.get("role") == "assistant" for m in messages)
    return Action(f"Running step {n}.", [ToolCall("exec_command", {"cmd": f"sed -n {n},+40p src/module_{n}.py"})])


def codex_input(turns: int = 31) -> list[dict]:
    items: list[dict] = [{"role": "user", "content": "Fix the failing test in tests/test_parser.py. " * 20}]
    for i in range(turns):
        items.append({"type": "function_call", "call_id": f"call_h{i}", "name": "exec_command",
                      "arguments": json.dumps({"cmd": f"cat src/file_{i}.py"})})
        items.append({"type": "function_call_output", "call_id": f"call_h{i}",
                      "output": "".join(f"    line {j} of file {i}: x = compute(x, {j})\n" for j in range(24))})
    return items


def start_gateway(tokenizer: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent))
    proc = subprocess.Popen([sys.executable, "-m", "envhub.cli", "gateway", "--model", "golden", "--policy",
                             "gateway:policy", "--tokenizer", tokenizer, "--port", "0", "--max-model-len", "200000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    line = proc.stdout.readline()
    try:
        return proc, json.loads(line)["gateway"]
    except (ValueError, KeyError):
        proc.kill()
        raise SystemExit(f"the gateway did not start ({line!r}):\n{proc.stderr.read()}") from None


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def latency(url: str, tokenizer_name: str, iters: int) -> dict:
    import httpx

    from envhub.backends.base import SamplingParams
    from envhub.backends.scripted import ScriptedBackend
    from envhub.gateway.core import tools_key  # noqa: F401 (same tool dicts as the server)
    from envhub.testing.models import load_tokenizer, resolve_model
    from envhub.codec.chat import ChatCodec

    client = httpx.Client(timeout=60)
    base = {"model": "m", "instructions": "You are Codex, a coding agent. " * 200, "tools": tools(), "store": False}
    items = codex_input()
    via, sizes, floor = [], [], []
    parent_ms = []
    for _ in range(iters + 3):
        started = client.post(url + "/sessions", json={"task_id": "bench"}).json()
        key = started["api_key"]
        h = {"Authorization": f"Bearer {key}"}
        t0 = time.perf_counter()
        r = client.post(url + "/v1/responses", json={**base, "input": items}, headers=h).json()
        parent_ms.append((time.perf_counter() - t0) * 1e3)
        out = r["output"]
        call = next(o for o in out if o["type"] == "function_call")
        child = {**base, "input": items + out + [{"type": "function_call_output", "call_id": call["call_id"],
                                                  "output": "x = 1\n" * 180}]}
        body = json.dumps(child).encode()
        sizes.append(len(body))
        t0 = time.perf_counter()
        r2 = client.post(url + "/v1/responses", content=body, headers={**h, "Content-Type": "application/json"})
        via.append((time.perf_counter() - t0) * 1e3)
        assert r2.status_code == 200, r2.text
        t0 = time.perf_counter()  # the same body to a route that only reads and parses it: the transport floor
        client.post(url + "/v1/none", content=body, headers={**h, "Content-Type": "application/json"})
        floor.append((time.perf_counter() - t0) * 1e3)
        client.delete(url + f"/sessions/{started['session_id']}", headers=h)
    via, parent_ms, floor = via[3:], parent_ms[3:], floor[3:]

    # the direct baseline: the same backend in-process, on prompt ids of the same size
    tok = load_tokenizer(resolve_model(tokenizer_name))
    chat_tools = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}} for t in tools()]
    codec = ChatCodec(tok, tools=chat_tools)
    from envhub.gateway.dialects.responses import parse

    req = parse(child)
    from envhub.gateway.messages import prepare

    context = prepare(req.messages)
    t0 = time.perf_counter()
    prompt = codec.prompt_ids(context)
    rerender_ms = (time.perf_counter() - t0) * 1e3
    backend = ScriptedBackend(policy)
    direct = []

    async def run() -> None:
        for i in range(iters):
            backend.open_session(f"d{i}", messages=context, codec=codec)
            t0 = time.perf_counter()
            await backend.generate(prompt, SamplingParams(max_tokens=256), session_id=f"d{i}")
            direct.append((time.perf_counter() - t0) * 1e3)
            backend.close_session(f"d{i}")

    asyncio.run(run())
    return {"body_kb": statistics.mean(sizes) / 1024, "prompt_tokens": len(prompt), "via_p50": pct(via, 0.5),
            "via_p99": pct(via, 0.99), "direct_p50": pct(direct, 0.5), "direct_p99": pct(direct, 0.99),
            "root_p50": pct(parent_ms, 0.5), "rerender_ms": rerender_ms, "floor_p50": pct(floor, 0.5)}


async def sustained(url: str | None, tokenizer_name: str, seconds: float, sessions: int = 32) -> float:
    """Calls/s of ``sessions`` concurrent 6-turn agent loops, over HTTP (``url``) or in-process (``None``)."""
    from envhub.backends.base import SamplingParams
    from envhub.backends.scripted import ScriptedBackend
    from envhub.testing.models import load_tokenizer, resolve_model
    from envhub.codec.chat import ChatCodec

    chat_tools = [{"type": "function", "function": {"name": "exec_command", "description": "run",
                                                    "parameters": {"type": "object",
                                                                   "properties": {"cmd": {"type": "string"}}}}}]
    deadline = time.perf_counter() + seconds
    done = 0
    if url is None:
        tok = load_tokenizer(resolve_model(tokenizer_name))
        codec = ChatCodec(tok, tools=chat_tools)
        backend = ScriptedBackend(policy)

        async def loop_direct(n: int) -> None:
            nonlocal done
            k = 0
            while time.perf_counter() < deadline:
                k += 1
                sid = f"{n}-{k}"
                msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Fix the bug."}]
                backend.open_session(sid, messages=msgs, codec=codec)
                ids = codec.prompt_ids(msgs)
                for _turn in range(6):
                    gen = await backend.generate(ids, SamplingParams(max_tokens=256), session_id=sid)
                    msg, action = codec.assistant_message(gen.token_ids)
                    msgs.append(msg)
                    new = [{"role": "tool", "tool_call_id": c.id, "content": "ok\n"} for c in action.tool_calls]
                    ids = ids + gen.token_ids + codec.delta_ids(msgs, new, sampled_eos=codec.ends_turn(gen.token_ids))
                    msgs.extend(new)
                    done += 1
                    await asyncio.sleep(0)
                backend.close_session(sid)

        await asyncio.gather(*(loop_direct(n) for n in range(sessions)))
        return done / seconds

    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=sessions * 2)) as http:
        async def loop_http(n: int) -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                async with http.post(url + "/sessions", json={"task_id": f"s{n}"}) as r:
                    s = await r.json()
                h = {"Authorization": f"Bearer {s['api_key']}"}
                msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "Fix the bug."}]
                for _turn in range(6):
                    async with http.post(url + "/v1/chat/completions", json={"model": "m", "messages": msgs,
                                                                            "tools": chat_tools}, headers=h) as r:
                        reply = await r.json()
                    msg = reply["choices"][0]["message"]
                    msgs.append(msg)
                    msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "ok\n"} for c in msg["tool_calls"]]
                    done += 1
                async with http.delete(url + f"/sessions/{s['session_id']}"):
                    pass

        await asyncio.gather(*(loop_http(n) for n in range(sessions)))
    return done / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--tokenizer", default=None, help="default: smollm2 when installed, else tiny")
    args = ap.parse_args()
    from envhub.cli.common import default_tokenizer

    tok = args.tokenizer or default_tokenizer()
    proc, url = start_gateway(tok)
    try:
        lat = latency(url, tok, args.iters)
        print(f"64 KB Codex-shaped call ({lat['body_kb']:.0f} KB body, {lat['prompt_tokens']} prompt tokens, "
              f"tokenizer {tok}, {args.iters} calls):")
        print(f"  direct backend.generate      p50 {lat['direct_p50']:7.2f} ms   p99 {lat['direct_p99']:7.2f} ms")
        print(f"  via the gateway (extends)    p50 {lat['via_p50']:7.2f} ms   p99 {lat['via_p99']:7.2f} ms")
        print(f"  added per call               p50 {lat['via_p50'] - lat['direct_p50']:7.2f} ms   "
              f"(target <= 2 ms)   ratio {lat['via_p50'] / max(lat['direct_p50'], 1e-6):.1f}x")
        print(f"  of which HTTP + JSON parse   p50 {lat['floor_p50']:7.2f} ms   (the same body POSTed to a route that "
              "only reads and parses it: what any HTTP proxy pays)")
        print(f"  a new chain (full render)    p50 {lat['root_p50']:7.2f} ms;  one full re-render + tokenize of "
              f"this context: {lat['rerender_ms']:.1f} ms (what a re-rendering proxy pays per call)")
        via = asyncio.run(sustained(url, tok, args.seconds))
    finally:
        proc.terminate()
        proc.wait(10)
    direct = asyncio.run(sustained(None, tok, args.seconds))
    print(f"sustained, 32 sessions x 6-turn loops, {args.seconds:g} s each:")
    print(f"  direct (in-process executor-style)  {direct:8.1f} calls/s")
    print(f"  via the gateway (HTTP, own process)  {via:8.1f} calls/s   (target >= 300)   "
          f"ratio {via / max(direct, 1e-9):.2f}x of direct")


if __name__ == "__main__":
    main()
