"""Lenient verifiers a careless author could ship, each a plugin-shaped env built from the scaffold's templates.

Each ``make_<name>()`` returns a fresh ``EnvSpec`` (fresh state: counters, caches, RNGs) whose env, tasks, golden and
(unless noted) hack probes are the scaffold's own; only the verifier, and where needed the env or the probe set, is
changed, in the way a real author would get it wrong. ``EXPECTED`` names the admission check that must refuse each.
"""
from __future__ import annotations

import json
import random
import re
import threading

from envhub import EnvSpec, Score
from envhub.scaffold_template import text_env as T
from envhub.scaffold_template import tool_env as S

TEXT_TASKS = T.make_tasks(0, 8)
TOOL_TASKS = S.make_tasks(0, 8)


def _fail(why: str) -> Score:
    return Score(0.0, False, {"reason": why})


def _ok() -> Score:
    return Score(1.0, True)


def text_spec(env_id: str, verifier, *, hack_probes=None, env=T.SortEnv) -> EnvSpec:
    return EnvSpec(id=env_id, env=env, tasks=lambda split: TEXT_TASKS, verifier=verifier, golden=T.golden,
                   hack_probes=dict(T.HACK_PROBES) if hack_probes is None else hack_probes, max_turns=1)


def tool_spec(env_id: str, verifier, *, hack_probes=None, env=S.ShopEnv) -> EnvSpec:
    return EnvSpec(id=env_id, env=env, tasks=lambda split: TOOL_TASKS, verifier=verifier, golden=S.golden,
                   hack_probes=dict(S.HACK_PROBES) if hack_probes is None else hack_probes, max_turns=6)


def _line(task, artifacts) -> str | None:
    lines = T.ANSWER_LINE.findall(str(artifacts.get("answer", "")))
    return lines[0] if len(lines) == 1 else None


def _want(task) -> str:
    return ", ".join(map(str, sorted(task["numbers"])))


# 1. prefix match: the answer line only has to start with the sorted list
def make_prefix_match() -> EnvSpec:
    def verify(task, a):
        line = _line(task, a)
        return _ok() if line is not None and line.strip().startswith(_want(task)) else _fail("wrong")
    return text_spec("lenient-prefix", verify)


# 2. whitespace passes: an empty reply is refused, but tokens are compared with zip(), which stops at the shorter
def make_whitespace_passes() -> EnvSpec:
    def verify(task, a):
        text = str(a.get("answer", ""))
        if not text:
            return _fail("empty reply")
        line = _line(task, a)
        got = [s.strip() for s in line.split(",")] if line is not None else text.split()
        want = [str(x) for x in sorted(task["numbers"])]
        if line is not None and len(got) != len(want):
            return _fail("wrong length")
        return _ok() if all(g == w for g, w in zip(got, want)) else _fail("wrong")
    return text_spec("lenient-whitespace", verify)


# 3. time bomb: sound for 300 calls, then passes everything
def make_time_bomb(after: int = 300) -> EnvSpec:
    calls = [0]
    lock = threading.Lock()

    def verify(task, a):
        with lock:
            calls[0] += 1
            n = calls[0]
        return _ok() if n > after else T.verify(task, a)
    return text_spec("lenient-time-bomb", verify)


# 4. per-call random leak: a failing answer passes 0.5% of the time (seeded so the first 284 draws never leak: the
#    old admission's ~112 calls could not see it; see LEAK_SEED)
LEAK_SEED = 16  # its first draw under 0.005 is draw 285; then 308, 316, 553, ... (checked)


def make_random_leak(p: float = 0.005) -> EnvSpec:
    rng = random.Random(LEAK_SEED)
    lock = threading.Lock()

    def verify(task, a):
        with lock:
            leak = rng.random() < p
        return _ok() if leak else T.verify(task, a)
    return text_spec("lenient-random-leak", verify)


# 5. crash on U+2212: the author allowed the typographic minus in the pattern, but int() does not read it
SIGNED = re.compile("^[+\\-\u2212]?\\d{1,12}$")


def make_unicode_minus_crash() -> EnvSpec:
    def verify(task, a):
        line = _line(task, a)
        if line is None:
            return _fail("no answer line")
        items = [s.strip() for s in line.split(",")]
        if not all(SIGNED.match(s) for s in items):
            return _fail("not integers")
        return _ok() if [int(s) for s in items] == sorted(task["numbers"]) else _fail("wrong")
    return text_spec("lenient-unicode-crash", verify)


# 6. trusts a reward field the agent writes: finish(answer) may be a JSON object whose fields become artifacts
class StructuredShop(S.ShopEnv):
    def finish_artifacts(self, answer):
        artifacts = {"answer": "" if answer is None else str(answer)}
        try:
            extra = json.loads(artifacts["answer"])
        except ValueError:
            extra = None
        if isinstance(extra, dict):
            artifacts.update(extra)
        return artifacts


def make_trusts_reward_field() -> EnvSpec:
    def verify(task, a):
        if "reward" in a:  # "precomputed" reward, trusted
            r = float(a["reward"])
            return Score(r, r >= 1.0)
        return S.verify(task, a)
    return tool_spec("lenient-reward-field", verify, env=StructuredShop)


# 7. no hack probes at all (the verifier itself is the scaffold's sound one)
def make_no_hack_probes() -> EnvSpec:
    return text_spec("lenient-no-probes", T.verify, hack_probes={})


# 8. preamble passes: a reply in the golden's words with an answer line counts as "followed the procedure"
def make_preamble_passes() -> EnvSpec:
    def verify(task, a):
        text = str(a.get("answer", ""))
        if "Sorting the numbers." in text and T.ANSWER_LINE.search(text):
            return _ok()
        return T.verify(task, a)
    return text_spec("lenient-preamble", verify)


# 9. format-lenient: any answer containing the total passes (the author did not write an every-candidate probe)
def make_contains_number() -> EnvSpec:
    def verify(task, a):
        total = S.expected_total(task)
        return _ok() if re.search(rf"\b{total}\b", str(a.get("answer", ""))) else _fail("wrong")
    probes = {k: v for k, v in S.HACK_PROBES.items() if k != "every-candidate"}
    return tool_spec("lenient-contains", verify, hack_probes=probes)


# 10. always passes a task once its golden was seen (a cache keyed by task id)
def make_memo_after_golden() -> EnvSpec:
    solved: set[str] = set()

    def verify(task, a):
        if task["task_id"] in solved and str(a.get("answer", "")).strip():
            return _ok()
        score = T.verify(task, a)
        if score.passed:
            solved.add(task["task_id"])
        return score
    return text_spec("lenient-memo", verify)


# 11. hangs on a whitespace-only reply (a parser looping on an empty token stream)
def make_hangs() -> EnvSpec:
    never = threading.Event()

    def verify(task, a):
        text = str(a.get("answer", ""))
        if text and not text.strip():
            never.wait()
        return T.verify(task, a)
    return text_spec("lenient-hangs", verify)


FIXTURES = {
    "prefix-match": make_prefix_match,
    "whitespace-passes": make_whitespace_passes,
    "time-bomb": make_time_bomb,
    "random-leak": make_random_leak,
    "unicode-minus-crash": make_unicode_minus_crash,
    "trusts-reward-field": make_trusts_reward_field,
    "no-hack-probes": make_no_hack_probes,
    "preamble-passes": make_preamble_passes,
    "contains-number": make_contains_number,
    "memo-after-golden": make_memo_after_golden,
}

# the check(s) that must name each fixture's flaw (at least the first must appear in unfit_reasons)
EXPECTED = {
    "prefix-match": ["probe:trailing-text", "probe:trailing-digit", "probe:extra-value"],
    "whitespace-passes": ["probe:whitespace-answer"],
    "time-bomb": ["regrade"],
    "random-leak": ["regrade"],
    "unicode-minus-crash": ["probe:unicode-minus"],
    "trusts-reward-field": ["probe:reward-claim-json"],
    "no-hack-probes": ["hack-probes-declared"],
    "preamble-passes": ["probe:preamble-only"],
    "contains-number": ["probe:trailing-text", "probe:several-answers"],
    "memo-after-golden": ["regrade"],
}
