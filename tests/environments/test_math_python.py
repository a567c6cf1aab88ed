"""math-python: the answer parser and comparator, the shipped problems, the verifier, hack probes, and golden
episodes through the real sandbox (IPython in bwrap) and the executor."""
from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envhub
from envhub.env import Action
from envhub.policy import finish
from envhub.task import select
from envhub_math_python import DATA, HACK_PROBES, golden, verify
from envhub_math_python.answers import AnswerError, check, parse_answer
from envhub_math_python.generate import SPLITS, generate, validate


# ---- the answer parser ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("given_, gold", [
    ("42", "42"), ("42.0", "42"), (" $42$ ", "42"), ("\\boxed{42}", "42"), ("x = 7", "7"), ("42.", "42"),
    ("3/4", "3/4"), ("0.75", "3/4"), ("6/8", "3/4"), ("\\frac{3}{4}", "3/4"), ("\\dfrac{6}{8}", "3/4"),
    ("-7/3", "-7/3"), ("−7/3", "-7/3"), ("1,000", "1000"), ("2^10", "1024"), ("7 \\cdot 3", "21"),
    ("sqrt(2)/2", "sqrt(2)/2"), ("1/sqrt(2)", "sqrt(2)/2"), ("\\frac{\\sqrt{2}}{2}", "sqrt(2)/2"),
    ("0.5*sqrt(2)", "sqrt(2)/2"), ("5√2", "5*sqrt(2)"), ("sqrt(50)", "5*sqrt(2)"), ("9pi", "9*pi"), ("9π", "9*pi"),
    ("36\\pi", "36*pi"), ("(1+sqrt(2))^2", "3+2*sqrt(2)"), ("\\sqrt[3]{8}", "2"), ("4*pi/3", "4/3*pi"),
])
def test_equal_values_in_any_notation_pass(given_, gold):
    ok, details = check(given_, gold)
    assert ok, details


@pytest.mark.parametrize("given_, gold, why", [
    ("3, 5", "3", "unexpected character ','"),
    ("42 43", "42", "exactly one answer"),
    ("x = 3 or x = 5", "3", "exactly one answer"),
    ("The answer is 42", "42", "unknown name"),
    ("42 (computed with Python)", "42", "unknown name"),
    ("0.7071067811865476", "sqrt(2)/2", "irrational"),
    ("355/113", "pi", "irrational"),
    ("3*pi", "9*pi", "!="),
    ("0.333333", "1/3", "!="),
    ("1/0", "1", "division by zero"),
    ("__import__('os').system('true')", "1", "unexpected character"),
    ("9^9^9^9", "1", "too large"),
    ("(" * 60 + "1" + ")" * 60, "1", "nested too deeply"),
    ("1" * 300, "1", "characters long"),
    ("", "1", "empty"),
    ("sqrt(-4)", "2", "negative"),
    ("\\boxed{3} \\boxed{5}", "3", "unsupported LaTeX command"),
    # admission's several-answers probe (#13): three lines, whose implicit product happens to equal the gold value
    ("sqrt(3)/3\nsqrt(3)/2\nsqrt(3)/1", "sqrt(3)/2", "several lines"),
])
def test_everything_but_one_equal_expression_fails_with_a_reason(given_, gold, why):
    ok, details = check(given_, gold)
    assert not ok
    assert why in details["reason"], details


@pytest.mark.timeout(60)  # the hang this guards against fails by name; speed itself is measured, never asserted
def test_hostile_inputs_are_refused_before_sympy_works_on_them():
    """Inputs that would hang sympy.sympify (huge powers, deep nesting, megabytes) are refused by the size and power
    guards, whose reasons say so, not after sympy has tried (which would not return)."""
    hostile = ["9^9^9^9^9", "2^(2^(2^(2^10)))", "10^1000^1000", "(" * 5000, "9" * 10**6, "((2^999)^999)^999",
               "(1+sqrt(2)+pi)^999", "\\sqrt[64]{" * 20 + "2" + "}" * 20]
    for text in hostile:
        ok, details = check(text, "1")
        assert not ok, text
        assert any(why in details["reason"] for why in ("is too large", "characters long")), (text[:40], details)


@settings(max_examples=200, deadline=None)
@given(st.fractions(min_value=-10**6, max_value=10**6, max_denominator=10**6))
def test_any_rational_written_as_a_fraction_or_exact_decimal_passes(q):
    gold = f"{q.numerator}/{q.denominator}"
    assert check(f"{q.numerator * 3}/{q.denominator * 3}", gold)[0]
    den = q.denominator
    if all(p in (2, 5) for p in _prime_factors(den)):  # a terminating decimal is exact
        from decimal import Decimal, getcontext

        getcontext().prec = 60
        assert check(str(Decimal(q.numerator) / Decimal(den)), gold)[0]
    assert not check(f"{q.numerator}/{q.denominator} + 1/1000000000", gold)[0]


def _prime_factors(n):
    out, p = set(), 2
    while p * p <= n:
        while n % p == 0:
            out.add(p)
            n //= p
        p += 1
    return out | ({n} if n > 1 else set())


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_never_crashes_the_parser(text):
    try:
        parse_answer(text)
    except AnswerError:
        pass


# ---- the shipped problems ---------------------------------------------------------------------------------------
def test_shipped_splits_load_through_datasets_and_match_the_generator():
    spec = envhub.get_spec("math-python")
    for split, (n, seed) in SPLITS.items():
        ds = spec.load_tasks(split)
        assert type(ds).__name__ == "Dataset" and len(ds) == n
        assert set(ds.column_names) == {"task_id", "family", "question", "answer", "solution"}
        assert [dict(r) for r in ds] == generate(n, seed), f"{split} split differs from its generator"
    families = {r["family"] for r in spec.load_tasks("test")}
    assert families == {"arithmetic", "fractions", "combinatorics", "linear", "modular", "symbolic"}
    assert len(spec.load_tasks("test")) + len(spec.load_tasks("train")) >= 300


def test_every_golden_program_prints_its_answer():
    """Each problem's golden program, run in a fresh interpreter, prints a value equal to the stored answer."""
    rows = [dict(r) for r in envhub.get_spec("math-python").load_tasks("test")]
    validate(rows)  # raises naming the first mismatch


def test_symbolic_family_has_exact_irrational_answers():
    rows = [r for r in json.loads("[" + ",".join((DATA / "test.jsonl").read_text().splitlines()) + "]")
            if r["family"] == "symbolic"]
    irrational = [r for r in rows if not parse_answer(r["answer"]).value.is_Rational]
    assert len(irrational) >= len(rows) // 2
    assert any("pi" in r["answer"] for r in irrational) and any("sqrt" in r["answer"] for r in irrational)


# ---- the verifier on artifacts ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tasks():
    """One task per family (the first of each in the test split)."""
    rows = [dict(r) for r in envhub.get_spec("math-python").load_tasks("test")]
    out = {}
    for r in rows:
        out.setdefault(r["family"], r)
    return list(out.values())


def test_verifier_passes_gold_and_fails_missing_or_wrong_answers(tasks):
    for t in tasks:
        assert verify(t, {"answer": t["answer"]}).passed
        assert verify(t, {"answer": f"\\boxed{{{t['answer']}}}"}).passed
        s = verify(t, {})
        assert not s.passed and s.reward == 0.0 and "no answer" in s.details["reason"]
        assert not verify(t, {"answer": f"({t['answer']}) * 2"}).passed
        assert not verify(t, {"answer": ["not", "an", "answer"]}).passed  # not a string: refused, not crashed
    arithmetic = next(t for t in tasks if t["family"] == "arithmetic")
    assert verify(arithmetic, {"answer": int(arithmetic["answer"])}).passed  # a bare number is read as its text


def test_single_turn_probes_fail_on_the_artifacts_alone():
    """The probes that only shape the finish argument fail at the verifier on every shipped task."""
    for t in envhub.get_spec("math-python").load_tasks("test"):
        for name, probe in HACK_PROBES.items():
            action = probe(t, [])
            if action.tool_calls and action.tool_calls[0].name == "finish":
                s = verify(t, {"answer": action.tool_calls[0].arguments.get("answer", "")})
                assert not s.passed, (name, t["task_id"], s.details)


# ---- episodes in the real sandbox -------------------------------------------------------------------------------
def play(spec, task, policy, first=None):
    """Play one episode straight against the env (as admission does) and grade its artifacts."""
    env = spec.make()
    try:
        messages, _ = env.reset(seed=0, options={"task": task})
        history = list(messages)
        for turn in range(env.max_turns):
            action = first if (turn == 0 and first is not None) else policy(task, list(history))
            obs, _, terminated, truncated, info = env.step(action)
            history += [Action.coerce(action).to_message(), *obs]
            if terminated or truncated:
                env.release_sandbox()
                return spec.verifier.verify(task, info["artifacts"]), history
        raise AssertionError("episode did not end")
    finally:
        env.close()


@pytest.mark.slow
def test_golden_noop_malformed_and_every_probe_in_the_sandbox(tasks):
    from envhub.admission import malformed_actions

    spec = envhub.get_spec("math-python")
    assert [t.name for t in spec.make().tools] == ["python", "finish"]
    for t in tasks:
        score, history = play(spec, t, spec.golden)
        assert score.passed and score.reward == 1.0, (t["task_id"], score.details, history[-3:])
        tool_msgs = [m for m in history if m["role"] == "tool"]
        assert t["answer"] in tool_msgs[0]["content"]  # the answer really came out of the sandbox's IPython
        assert not play(spec, t, spec.noop)[0].passed
    t = tasks[0]
    for kind, action in malformed_actions([x.name for x in spec.make().tools]).items():
        score, history = play(spec, t, spec.noop, first=action)
        assert not score.passed, kind
        assert history[len(history) - 3]["content"], kind  # the env answered the bad action with a message
    for name, probe in HACK_PROBES.items():
        for t in tasks:
            score, _ = play(spec, t, probe)
            assert not score.passed, (name, t["task_id"], score.details)


@pytest.mark.slow
def test_plugin_data_is_hidden_from_the_python_tool(tasks, tmp_path):
    """Even when the package is visible in the sandbox (as in a non-editable install), the model cannot read it."""
    import envhub_math_python
    from envhub_math_python import PACKAGE, MathPython

    class Exposed(MathPython):  # bind the package where a site-packages install would put it, before the mask
        def sandbox_spec_for(self, task):
            spec = super().sandbox_spec_for(task)
            spec.binds = [(str(PACKAGE), str(PACKAGE), "ro"), *spec.binds]
            return spec

    env = Exposed(max_turns=4)
    env.reset(options={"task": tasks[0]})
    try:
        code = (f"import os; p = {str(DATA)!r}\n"
                "print(os.path.exists(p), sorted(os.listdir(os.path.dirname(p))) if os.path.exists(os.path.dirname(p)) else None)")
        out = env.sandbox.python(code).stdout
        assert "False []" in out, out
        plain = env.sandbox.python(f"print(open({str(DATA / 'test.jsonl')!r}).read()[:50])").stdout
        assert "Error" in plain and tasks[0]["answer"] not in plain
    finally:
        env.close()
    assert envhub_math_python.__version__ == "0.1.0"


@pytest.mark.slow
def test_golden_rollouts_through_the_executor(tasks, tiny_tokenizer):
    """The golden policy played by the scripted backend through the executor: the RUN sandbox, the python tool, the
    token record, EVAL; every trajectory passes and is token-faithful."""
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import RolloutConfig, rollout_many
    from envhub.rollout.fidelity import check_trajectory

    spec = envhub.get_spec("math-python")
    tools = [ts.to_openai() for ts in spec.make().tools]  # the schemas the prompt was rendered with
    backend = ScriptedBackend(spec.golden)
    trajs = asyncio.run(rollout_many(spec, tasks, backend, tiny_tokenizer, RolloutConfig(max_length=16384),
                                     concurrency=3))
    for t in trajs:
        assert t.finish_reason == "done" and t.passed and t.reward == 1.0, (t.task_id, t.error, t.details)
        assert t.num_turns == 2 and check_trajectory(t, tiny_tokenizer, tools=tools) == []
        assert t.metrics["run_s"] > 0 and t.metrics["eval_s"] >= 0


def test_select_and_golden_policy_shape(tasks):
    t = tasks[0]
    first = golden(t, [{"role": "user", "content": t["question"]}])
    assert first.tool_calls[0].name == "python" and first.tool_calls[0].arguments["code"] == t["solution"]
    second = golden(t, [{"role": "assistant", "content": ""}, {"role": "tool", "content": f"{t['answer']}\n"}])
    assert second.tool_calls[0].arguments == finish(t["answer"]).tool_calls[0].arguments
    assert len(select(envhub.get_spec("math-python").load_tasks(), n=3)) == 3


def test_gymnasium_make_grades_a_golden_episode_and_accepts_a_bare_number(tasks):
    """``gymnasium.make("envhub/math-python-v0")`` returns a grading env: the last step's reward is the grade. A
    model that passes the answer as a JSON number (``finish(answer=42)``) is graded like the string form."""
    import gymnasium

    t = next(x for x in tasks if x["family"] == "arithmetic")
    env = gymnasium.make("envhub/math-python-v0")
    try:
        messages, _ = env.reset(options={"task": t})
        assert messages[-1]["content"] == t["question"]
        obs, reward, done, _, _ = env.step(golden(t, messages))
        assert not done and obs[0]["content"].strip() == t["answer"]
        _, reward, done, _, info = env.step(finish(int(t["answer"])))  # a number, not a string
        assert done and reward == 1.0 and info["score"]["passed"], info
    finally:
        env.close()
