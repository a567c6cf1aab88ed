"""What ProRL's per-message fields cost a ``/process`` reply: bytes and encode time, baseline vs ours, one run.

ProRL's clients need ``token_ids``/``logprobs`` on each message and ``input_ids`` (the context each model call was
sampled from) on the assistant's; ``input_ids`` makes a reply grow with turns x context, as ProRL's own does.
This builds synthetic trajectories (``--turns`` model calls of ``--gen`` tokens, env replies of ``--env`` tokens,
a ``--prompt``-token prompt), and times ``encode_result`` of:

* ``baseline``: envhub's flat reply (the Trajectory fields, no per-message tokens), the reply before #15;
* ``ours``: the same plus :func:`envhub.rollout.prorl.prorl_fields` (what ``/process`` sends now), encoded by
  ``encode_result`` (each ``input_ids`` sliced from one encoding of the context);
* ``ours, plain``: the same reply through a plain ``json.dumps`` (every ``input_ids`` encoded again).

    python benchmarks/prorl_reply.py                       # a few profiles: single-turn, multi-turn, SWE-like
"""
from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import fields


def trajectory(prompt: int, turns: int, gen: int, env: int, seed: int = 0):
    from envhub.rollout.trajectory import Trajectory

    rng = random.Random(seed)
    t = Trajectory(env_id="bench", task_id="t")
    t.prompt_ids = [rng.randrange(50_000) for _ in range(prompt)]
    msgs = [{"role": "system", "content": "s" * 200}, {"role": "user", "content": "u" * 2000}]
    spans = []
    for k in range(turns):
        start = len(t.response_ids)
        t.response_ids += [rng.randrange(50_000) for _ in range(gen)]
        t.response_mask += [1] * gen
        t.response_logprobs += [-rng.random() for _ in range(gen)]
        spans.append((len(msgs), start, len(t.response_ids)))
        msgs.append({"role": "assistant", "content": "a" * (gen * 3)})
        msgs.append({"role": "tool", "content": "o" * (env * 3)})
        if k < turns - 1:
            t.response_ids += [rng.randrange(50_000) for _ in range(env)]
            t.response_mask += [0] * env
            t.response_logprobs += [0.0] * env
    t.messages = msgs
    return t, spans


def timed(fn, repeat: int) -> tuple[float, int]:
    times, size = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        size = len(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times), size


def main() -> None:
    from envhub.service.jobs import _dumps, encode_result
    from envhub.rollout.prorl import prorl_fields

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    profiles = [("single-turn", 300, 1, 400, 0), ("multi-turn 12", 400, 12, 60, 40),
                ("SWE-like 40 x 8k ctx", 3000, 40, 150, 120)]
    print(f"{'profile':24} {'baseline':>20} {'ours':>20} {'size x':>7} {'time x':>7} {'plain':>9} {'plain x':>8}")
    for name, prompt, turns, gen, env in profiles:
        traj, spans = trajectory(prompt, turns, gen, env)
        flat = {f.name: getattr(traj, f.name) for f in fields(traj)}
        (tb, sb) = timed(lambda: encode_result(flat), args.repeat)
        (to, so) = timed(lambda: encode_result({**flat, **prorl_fields(traj, spans)}), args.repeat)
        (tp, _) = timed(lambda: _dumps({**flat, **prorl_fields(traj, spans)}).encode(), args.repeat)
        print(f"{name:24} {sb / 1e6:8.2f} MB {tb * 1e3:7.1f} ms {so / 1e6:8.2f} MB {to * 1e3:7.1f} ms "
              f"{so / sb:7.2f} {to / tb:7.2f} {tp * 1e3:6.1f} ms {tp / to:8.2f}")


if __name__ == "__main__":
    main()
