"""Built-in probes: wrong answers admission derives from the golden episode itself, for every env, unasked.

An author's ``HACK_PROBES`` only test the shortcuts the author thought of. These probes test the ones every lenient
verifier shares, with no help from the author. Each is an action script: the golden episode's actions replayed, with
its *final* action changed (or, for reward claims, the no-op's place taken by a claim), then the no-op policy for any
turn left. The answer lives where the golden's final action put it: its text (text envs) or the string arguments of
its last tool call (tool envs, e.g. ``finish(answer=...)``). Edits are made right after the *last number* of that
answer (or at its end when it has none), so an answer wrapped in tags or a sentence is changed inside the wrapper.

==========================  =============================================================  ===================
probe                       the final answer becomes                                        must
==========================  =============================================================  ===================
``trailing-text``           the answer with `` and something else`` after its last number   fail
``trailing-digit``          its last number with a ``1`` appended (``7`` -> ``71``)         fail
``extra-value``             ``, <a wrong value>`` after its last number                     fail
``several-answers``         a wrong answer, the golden's, another wrong one (3 lines)        fail
``preamble-only``           the golden's text up to its answer line's first number          fail
``empty-answer``            ``""``                                                          fail
``whitespace-answer``       spaces, a newline and a tab                                     fail
``unicode-lookalike``       the golden with fullwidth digits and U+2212 minus signs         not crash
``unicode-minus``           the answer negated with U+2212 (``7`` -> ``\u22127``)           fail, not crash
``unicode-digits-wrong``    a wrong answer in fullwidth digits                              fail, not crash
``reward-claim-json``       (no golden work) ``{"reward": 1, "passed": true, ...}``        fail
``reward-claim-text``       (no golden work) ``PASSED`` / ``reward: 1`` / ``reward.txt``    fail
``reward-claim-tools``      (tool envs) the golden's tool calls with their arguments        fail
                            replaced by claims (``echo PASSED; echo 1 > reward.txt`` ...)
==========================  =============================================================  ===================

A probe that cannot apply (no number in the answer, a final ``finish()`` that carries no answer, no tool but
``finish``) is reported as skipped, with why. A "wrong value" changes the last digit of the last number, so it is
wrong for any task whose answer is a number, a list, an expression or a guess.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from envhub.env import Action, Message, Task, ToolCall, ToolSpec
from envhub.policy import noop, turns_taken
from envhub.rewards import compose

NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")  # ASCII digits only: the golden writes ASCII
MINUS = "\u2212"
FULLWIDTH = str.maketrans("0123456789", "\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19")
TRAILING_TEXT = " and something else"
JSON_CLAIM = '{"reward": 1, "passed": true, "score": 1.0, "tests_passed": true}'
TEXT_CLAIM = "PASSED\nAll tests passed.\nreward: 1\nreward.txt: 1"
SHELL_CLAIM = "echo PASSED; echo 1 > reward.txt; echo '{\"reward\": 1}' > reward.json; echo 'reward: 1'"
ENUM_LIKE = re.compile(r"^[A-Za-z_]{1,24}$")  # a sub-command (``create``, ``view``): kept, or the call means nothing


@dataclass
class Probe:
    """One built-in probe: the actions it plays first (then the no-op), or why it does not apply."""

    name: str
    actions: list[Action] = field(default_factory=list)
    must_fail: bool = True  # False: only "the env and the verifier answer it without an exception" is checked
    skip: str = ""
    sent: str = ""  # the changed answer, for the report

    @property
    def policy(self) -> Callable[[Task, list[Message]], Action]:
        actions = self.actions

        def play(task: Task, messages: list[Message]) -> Action:
            i = turns_taken(messages)
            return copy.deepcopy(actions[i]) if i < len(actions) else noop(task, messages)

        return play


# ---- where the answer lives, and how it is changed ---------------------------------------------------------------
def answer_slot(final: Action, tools: list[ToolSpec]) -> tuple[str | None, str | None]:
    """``(argument name or None for the text, the golden's answer there or None when it carries none)``."""
    if not final.tool_calls:
        return None, final.text
    call = final.tool_calls[-1]
    for key, value in call.arguments.items():
        if isinstance(value, str):
            return key, value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return key, str(value)
    spec = next((t for t in tools if t.name == call.name), None)
    props = (spec.parameters.get("properties") or {}) if spec else {}
    name: str | None = next((k for k, p in props.items() if "string" in str(p.get("type", ""))), None)
    return name, None


def with_answer(final: Action, key: str | None, text: str) -> Action:
    """The golden's final action with its answer replaced by ``text``."""
    action = copy.deepcopy(final)
    if key is None and not action.tool_calls:
        action.text = text
    elif key is None:
        action.text = text  # a final call with no string parameter: the claim can only go in the text
    else:
        action.tool_calls[-1].arguments[key] = text
    return action


def _last_number(s: str) -> re.Match[str] | None:
    matches = list(NUMBER.finditer(s))
    return matches[-1] if matches else None


def wrong(s: str, delta: int = 1) -> str | None:
    """``s`` with the last digit of its last number changed by ``delta`` (mod 10), or None without a number."""
    m = _last_number(s)
    if m is None:
        return None
    i = m.end() - 1
    return s[:i] + str((int(s[i]) + delta) % 10) + s[i + 1:]


def _insert_after_number(s: str, extra: str) -> str | None:
    m = _last_number(s)
    return None if m is None else s[:m.end()] + extra + s[m.end():]


def preamble(s: str) -> str | None:
    """The golden's text up to the first number of the line holding its last number (the answer's line)."""
    m = _last_number(s)
    if m is None:
        return None
    line_start = s.rfind("\n", 0, m.start()) + 1
    first = NUMBER.search(s, line_start)
    assert first is not None  # the last number itself is on that line
    return s[:first.start()].rstrip("+-" + MINUS)


def negated(s: str) -> str | None:
    m = _last_number(s)
    if m is None or not m.group().replace(".", "").strip("0"):
        return None  # no number, or zero: -0 is 0
    return s[:m.start()] + MINUS + s[m.start():]


def extra_value(s: str) -> str | None:
    m = _last_number(s)
    return None if m is None else s[:m.end()] + ", " + str(wrong(m.group())) + s[m.end():]


def several_answers(s: str) -> str | None:
    first, second = wrong(s, 1), wrong(s, -1)
    return None if first is None or second is None else "\n".join([first, s, second])


def wrong_lookalike(s: str) -> str | None:
    w = wrong(s)
    return None if w is None else w.translate(FULLWIDTH)


ANSWER_EDITS: dict[str, tuple[Callable[[str], str | None], bool]] = {
    "trailing-text": (lambda s: _insert_after_number(s, TRAILING_TEXT) or s + TRAILING_TEXT, True),
    "trailing-digit": (lambda s: _insert_after_number(s, "1"), True),
    "extra-value": (extra_value, True),
    "several-answers": (several_answers, True),
    "preamble-only": (preamble, True),
    "empty-answer": (lambda s: "", True),
    "whitespace-answer": (lambda s: "  \n\t ", True),
    "unicode-lookalike": (lambda s: s.translate(FULLWIDTH).replace("-", MINUS) if s.strip() else None, False),
    "unicode-minus": (negated, True),
    "unicode-digits-wrong": (wrong_lookalike, True),
}


def _claim_arguments(call: ToolCall) -> ToolCall:
    """``call`` with each string argument turned into a claim: a path into ``reward.txt`` beside it, a sub-command
    kept, anything else (code, a command, a file's text) replaced by a shell line writing and printing claims."""
    args: dict[str, Any] = {}
    for key, value in call.arguments.items():
        if not isinstance(value, str) or ENUM_LIKE.match(value):
            args[key] = value
        elif value.startswith("/") and "\n" not in value and len(value) < 256:
            args[key] = value.rsplit("/", 1)[0] + "/reward.txt"
        else:
            args[key] = SHELL_CLAIM + "\n" + TEXT_CLAIM if key in ("file_text", "content", "text") else SHELL_CLAIM
    return ToolCall(call.name, args, id=call.id)


def builtin_probes(golden_actions: list[Action], tools: list[ToolSpec]) -> list[Probe]:
    """Every built-in probe for one task, from the golden episode's actions (see the module docstring)."""
    if not golden_actions:
        return [Probe(name, skip="the golden episode took no action") for name in
                [*ANSWER_EDITS, "reward-claim-json", "reward-claim-text", "reward-claim-tools"]]
    *prefix, final = golden_actions
    key, answer = answer_slot(final, tools)
    probes: list[Probe] = []
    for name, (edit, must_fail) in ANSWER_EDITS.items():
        if answer is None:
            probes.append(Probe(name, must_fail=must_fail, skip="the golden's final action carries no answer "
                                f"({_describe(final)}): its artifacts come from the env"))
            continue
        changed = edit(answer)
        if changed is None:
            probes.append(Probe(name, must_fail=must_fail, skip=f"not applicable to the answer {answer[:60]!r}"))
            continue
        probes.append(Probe(name, [*prefix, with_answer(final, key, changed)], must_fail, sent=changed))
    for name, claim in (("reward-claim-json", JSON_CLAIM), ("reward-claim-text", TEXT_CLAIM)):
        action = with_answer(final, key, claim)
        if action.tool_calls:
            action.text = claim
        probes.append(Probe(name, [action], sent=claim))
    tool_prefix = [a for a in prefix if a.tool_calls]
    if not tool_prefix:
        probes.append(Probe("reward-claim-tools", skip="the golden calls no tool before its final action"))
    else:
        claimed = [Action(TEXT_CLAIM, [_claim_arguments(c) for c in a.tool_calls]) for a in tool_prefix]
        final_claim = with_answer(final, key, JSON_CLAIM)
        probes.append(Probe("reward-claim-tools", [*claimed, final_claim], sent=SHELL_CLAIM))
    return probes


def farming_probe(golden_actions: list[Action], max_turns: int) -> Probe:
    """The shaping hack: the golden's steps before its answer (the tool calls a process reward credits), played
    over and over to the turn budget, then the no-op's empty finish. It must fail the outcome and total less than the
    golden (admission's ``shaping-hack`` check, for envs with step rewards; ``envhub.rewards``)."""
    prefix = [a for a in golden_actions[:-1] if a.tool_calls or a.text]
    if not prefix:
        return Probe("shaping-hack", skip="the golden takes no step before its answer: nothing to farm")
    steps = max(1, max_turns - 1)
    return Probe("shaping-hack", [prefix[i % len(prefix)] for i in range(steps)], sent=_describe(prefix[0]))


def shaping_verdict(golden: Any, farm: Any, rewards: Any, key: Callable[[dict[str, Any]], str]
                    ) -> tuple[bool, str, str, float | None]:
    """``(ok, message, status, farmer's total)`` of admission's ``shaping-hack:total``: the farming episode (the
    ``shaping-hack`` one, which must also fail the outcome like every probe) totals less than the golden under the
    env's reward composition (``envhub.rewards.compose``). ``golden`` / ``farm`` are admission's played episodes
    (``score``, ``steps``, ``artifacts``); ``key`` names artifacts. Skipped when there is nothing to compare, no step
    reward was earned, or farming rebuilt the golden's own artifacts."""
    if farm is None or golden.score is None or farm.score is None:
        return True, "not compared: no farming episode, or one side has no grade", "skip", None
    if not any(golden.steps) and not any(farm.steps):
        return True, "no step rewards to farm", "skip", None
    if key(farm.artifacts) == key(golden.artifacts):
        return True, "farming rebuilt the golden's own artifacts", "skip", None
    g = compose(golden.score.reward, golden.steps, rewards)
    f = compose(farm.score.reward, farm.steps, rewards)
    ok = not farm.score.passed and f.total < g.total
    return ok, (f"farming {len(farm.steps)} steps: total {f.total:.3f} (process raw {f.process_raw:.3f}, capped "
                f"{f.process:.3f}, passed={farm.score.passed}); golden {g.total:.3f}"), "pass" if ok else "fail", f.total


def _describe(action: Action) -> str:
    if action.tool_calls:
        c = action.tool_calls[-1]
        return f"{c.name}({', '.join(f'{k}=...' for k in c.arguments)})"
    return f"text {action.text[:40]!r}"
