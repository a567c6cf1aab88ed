"""code-contests: the checker, the shipped problems (CodeContests schema, reproducible), the grader on golden /
empty / broken / wrong / slow / memory-hungry / hacked solutions in real sandboxes, the RUN env, and golden
rollouts through the executor."""
from __future__ import annotations

import asyncio
import shlex
import sys
from pathlib import Path

import pytest

import envhub
from envhub.env import Action
from envhub_code_contests import HACK_PROBES, SOLUTION_PATH, normalize, verify
from envhub_code_contests.checker import check
from envhub_code_contests.generate import all_problems, build
from envhub_code_contests.grader import grade, limits_of
from envhub_code_contests.grader import tests_of as all_tests_of


@pytest.fixture(scope="module")
def spec():
    return envhub.get_spec("code-contests")


@pytest.fixture(scope="module")
def rows(spec):
    return {r["task_id"]: dict(r) for r in spec.load_tasks("test")}


def solution(task) -> str:
    return task["solutions"]["solution"][0]


# ---- the checker ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("got, expected, ok", [
    ("1 2\n3\n", "1 2 3", True), ("1  2\r\n3", "1 2\n3\n", True), ("", "", True),
    ("1 2", "1 2 3", False), ("1 2 3 4", "1 2 3", False), ("YES\nNO\n", "YES\n", False), ("", "0\n", False),
    ("3", "3.0", False),
])
def test_token_checker(got, expected, ok):
    assert check("tokens", got, expected)[0] is ok


@pytest.mark.parametrize("got, ok", [("6.0000001", True), ("6", True), ("6.1", False), ("nan", False),
                                     ("inf", False), ("6.0 6.0", False), ("six", False), ("", False)])
def test_float_checker(got, ok):
    assert check("float:1e-6", got, "6.0\n")[0] is ok


def test_unknown_checker_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown checker"):
        check("regex", "a", "a")


# ---- the shipped problems ---------------------------------------------------------------------------------------
CODECONTESTS_FIELDS = {"name", "description", "public_tests", "private_tests", "generated_tests", "source",
                       "difficulty", "solutions", "incorrect_solutions", "cf_tags", "time_limit",
                       "memory_limit_bytes", "input_file", "output_file"}


def test_split_is_codecontests_schema_through_datasets(spec, rows):
    ds = spec.load_tasks("test")
    assert type(ds).__name__ == "Dataset" and 24 <= len(ds) <= 60
    assert set(ds.column_names) >= CODECONTESTS_FIELDS | {"task_id", "checker"}
    for r in rows.values():
        assert r["public_tests"]["input"] and r["private_tests"]["input"] and r["generated_tests"]["input"]
        assert r["solutions"]["language"] == [3] and r["description"].count("Input") >= 2
        assert limits_of(r) == (2.0, 256)
        hidden = {o.split().__repr__() for g in ("private_tests", "generated_tests") for o in r[g]["output"]}
        assert len(hidden) >= 2, r["task_id"]  # no constant answer passes the hidden tests
    with_incorrect = [r for r in rows.values() if r["incorrect_solutions"]["solution"]]
    assert len(with_incorrect) >= len(rows) // 2


@pytest.mark.parametrize("slug", ["sum-of-pairs", "grid-shortest-path",
                                  pytest.param("knapsack", marks=pytest.mark.slow)])  # knapsack: brute force runs
def test_generation_is_deterministic_and_reproduces_the_shipped_rows(slug, rows):
    problem = next(p for p in all_problems() if p.slug == slug)
    assert build(problem) == rows[f"cc-{slug}"]


def test_normalize_accepts_real_codecontests_rows(rows):
    real = {k: v for k, v in rows["cc-sum-of-pairs"].items() if k not in ("task_id", "checker")}
    real["name"] = "1548_A. Web of Lies"
    n = normalize(real)
    assert n["task_id"] == "cc-1548-a--web-of-lies" and n["checker"] == "tokens"
    assert len(all_tests_of(n)) == len(all_tests_of(rows["cc-sum-of-pairs"]))


# ---- the grader, in real sandboxes ------------------------------------------------------------------------------
def verdict(task, src):
    g = grade(task, src)
    return g["passed"], g["results"][-1]["verdict"] if g["results"] else g["reason"], g


# serial (run last, alone, by make test): a golden must pass, and the grader's wall-clock backstop (3 x the time limit
# + 2 s, grader.wall_limit) is not starvation-proof — beside the tiers (CI load ~16 on 2 cores) the golden below
# failed once; the verdict is on CPU time, the backstop only stops sleeping runs
@pytest.mark.serial
def test_grader_passes_golden_and_fails_empty_broken_and_wrong(rows):
    task = rows["cc-sum-of-pairs"]
    ok, v, g = verdict(task, solution(task))
    assert ok and v == "OK" and g["run"] == g["tests"] == len(all_tests_of(task)), (v, g.get("reason"), g["results"][-3:])
    assert {r["group"] for r in g["results"]} == {"public_tests", "private_tests", "generated_tests"}
    assert verdict(task, "")[0] is False and "no solution" in verdict(task, "")[1]
    assert verdict(task, "def oops(:\n")[1] == "RE"
    assert verdict(task, task["incorrect_solutions"]["solution"][0])[1] == "WA"
    assert verdict(task, "import sys\nsys.exit(3)\n")[1] == "RE"


@pytest.mark.slow
def test_grader_enforces_time_and_memory_limits(rows):
    task = rows["cc-max-subarray"]
    t = verdict(task, "while True:\n    pass\n")
    assert t[1] == "TLE", t  # on CPU time (or, on a very busy machine, the wall clock)
    assert verdict(task, "import time\ntime.sleep(30)\n")[1] == "TLE"  # sleeping does not dodge the wall clock
    assert verdict(task, "x = bytearray(1 << 30)\nprint(len(x))\n")[1] == "MLE"
    slow = [s for s in task["incorrect_solutions"]["solution"] if "range(i + 1, n + 1)" in s]
    assert slow, "the brute force is listed as an incorrect (too slow) solution"
    ok, v, g = verdict(task, slow[0])
    assert not ok and v == "TLE" and g["results"][-1]["group"] == "generated_tests"


def test_every_listed_incorrect_solution_fails(rows):
    for task in list(rows.values())[:8]:
        for src in task["incorrect_solutions"]["solution"]:
            assert not grade(task, src)["passed"], task["task_id"]


@pytest.mark.slow
@pytest.mark.serial  # the wall-clock backstop, as above
def test_grader_passes_every_golden_solution(rows):
    for task in rows.values():
        g = grade(task, solution(task))
        assert g["passed"], (task["task_id"], g["reason"])


def test_solutions_run_with_the_standard_library_only(rows):
    task = rows["cc-sum-of-pairs"]
    src = "import sys\nprint(sys.flags.isolated, sys.flags.no_site, 'site-packages' in ''.join(sys.path))\n"
    g = grade(task, src, stop_on_failure=True)
    assert g["results"][0]["verdict"] == "WA" and "'1'" in g["results"][0]["detail"]


def test_a_solution_that_puts_site_packages_back_on_its_path_still_sees_no_third_party_package(rows):
    """-I -S only keeps site-packages off sys.path; a submission can append them itself. The grading sandbox covers
    every site-packages / dist-packages directory, so the import fails however the path is built."""
    import site

    task = rows["cc-sum-of-pairs"]
    dirs = site.getsitepackages() + ["/usr/lib/python3/dist-packages"]
    src = (f"import sys\nsys.path += {dirs!r}\nimport numpy\nprint('third-party', numpy.__version__)\n")
    g = grade(task, src, stop_on_failure=True)
    assert g["results"][0]["verdict"] == "RE" and "No module named 'numpy'" in g["results"][0]["detail"], g


# ---- the env, the probes, admission-style episodes --------------------------------------------------------------
def play(spec, task, policy, first=None):
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
                return spec.verifier.verify(task, info["artifacts"]), history, info["artifacts"]
        raise AssertionError("episode did not end")
    finally:
        env.close()


def test_run_env_lays_out_the_problem_and_only_the_samples(spec, rows):
    task = rows["cc-dijkstra"]
    env = spec.make()
    try:
        messages, _ = env.reset(options={"task": task})
        assert "Cheapest Route" in messages[0]["content"] and SOLUTION_PATH in messages[0]["content"]
        assert [t.name for t in env.tools] == ["bash", "str_replace_editor", "finish"]
        listing = env.sandbox.exec("cd /testbed && find . -type f | sort").stdout.split()
        n = len(task["public_tests"]["input"])
        assert listing == sorted(["./PROBLEM.md"] + [f"./samples/{i}.{e}" for i in range(1, n + 1) for e in ("in", "out")])
        private_input = task["private_tests"]["input"][0].strip()
        # the host's venv is bound read-only at its own path, which may lie under /tmp (a checkout in /tmp): skip it
        venv_top = "/" + "/".join(Path(sys.prefix).resolve().parts[1:3])
        grep = env.sandbox.exec(f"find /testbed /tmp -path {venv_top} -prune -o -type f -print0 | "
                                f"xargs -0 -r grep -lF -- {shlex.quote(private_input.splitlines()[0])}")
        assert grep.exit_code == 123 and grep.stdout == "", grep  # xargs: 123 = grep found nothing
    finally:
        env.close()


def test_golden_noop_and_malformed_episodes(spec, rows):
    from envhub.admission import malformed_actions

    task = rows["cc-balanced-brackets"]
    score, history, artifacts = play(spec, task, spec.golden)
    assert score.passed and score.reward == 1.0, score.details
    assert "ok" in history[-3]["content"] and artifacts["solution"] == solution(task)
    score, _, artifacts = play(spec, task, spec.noop)
    assert not score.passed and "could not read" in score.details["reason"]
    for kind, action in malformed_actions([t.name for t in spec.make().tools]).items():
        score, history, _ = play(spec, task, spec.noop, first=action)
        assert not score.passed, kind


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(HACK_PROBES))
def test_hack_probe_fails(name, spec, rows):
    for task_id in ("cc-sum-of-pairs", "cc-bipartite-check", "cc-polygon-area"):
        score, history, _ = play(spec, rows[task_id], HACK_PROBES[name])
        assert not score.passed, (name, task_id, score.details.get("reason"))
        if name == "read-hidden-tests-in-run":
            assert "NOT FOUND" in history[-3]["content"], history[-3]["content"][-500:]


@pytest.mark.slow
@pytest.mark.parametrize("masked", [False, True], ids=["unmasked-probes-find-the-tests", "masked-they-do-not"])
def test_package_is_hidden_even_when_installed_in_a_bound_prefix(masked, spec, rows, monkeypatch):
    """Simulate a non-editable install: the package visible inside the sandbox, where a venv's site-packages would
    put it. Without the mask the two search probes really find the hidden tests and pass (so they are real probes);
    with the mask (what the plugin does) both fail, in RUN and in EVAL."""
    from envhub_code_contests import PACKAGE, CodeContests, grader
    from envhub_code_contests.isolation import hide_package

    expose = [(str(PACKAGE), str(PACKAGE), "ro")]
    mask = hide_package(PACKAGE)

    def binds(spec_binds):  # the other binds (the judge launcher...) stay; only the plugin's mask is left out
        return expose + [b for b in spec_binds if masked or b not in mask]

    class Exposed(CodeContests):
        def sandbox_spec_for(self, task):
            s = super().sandbox_spec_for(task)
            s.binds = binds(s.binds)
            return s

    original = grader.eval_spec

    def exposed_eval_spec(memory_mb):
        s = original(memory_mb)
        s.binds = binds(s.binds)
        return s

    monkeypatch.setattr(grader, "eval_spec", exposed_eval_spec)
    task = rows["cc-bipartite-check"]
    for name in ("read-hidden-tests-in-run", "read-hidden-tests-at-eval"):
        env = Exposed(max_turns=4)
        try:
            env.reset(options={"task": task})
            listing = env.sandbox.exec(["ls", "-A", str(PACKAGE)]).stdout.split()
            assert (listing == []) is masked, listing
            probe = HACK_PROBES[name]
            obs, *_ = env.step(probe(task, []))
            _, _, done, _, info = env.step(probe(task, [{"role": "assistant", "content": ""}]))
            assert done
            env.release_sandbox()
        finally:
            env.close()
        if name == "read-hidden-tests-in-run":
            assert ("NOT FOUND" if masked else "FOUND 9 tests") in obs[0]["content"], obs[0]["content"][-300:]
        score = verify(task, info["artifacts"])
        assert score.passed is (not masked), (name, score.details["reason"])


@pytest.mark.slow
def test_golden_rollouts_through_the_executor(spec, rows, tiny_tokenizer):
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import RolloutConfig, rollout_many
    from envhub.rollout.fidelity import check_trajectory

    tasks = [rows[k] for k in ("cc-sum-of-pairs", "cc-fibonacci-mod", "cc-topo-order")]
    tools = [ts.to_openai() for ts in spec.make().tools]  # the schemas the prompt was rendered with
    backend = ScriptedBackend(spec.golden)
    trajs = asyncio.run(rollout_many(spec, tasks, backend, tiny_tokenizer, RolloutConfig(max_length=32768),
                                     concurrency=3))
    for t in trajs:
        assert t.finish_reason == "done" and t.passed and t.reward == 1.0, (t.task_id, t.error, t.details)
        assert t.num_turns == 3 and check_trajectory(t, tiny_tokenizer, tools=tools) == []
        assert t.details["score"]["verdicts"] == {"OK": t.details["score"]["tests"]}


def test_unknown_split_is_a_clear_error(spec):
    with pytest.raises(ValueError, match="known splits: test"):
        spec.load_tasks("validation")
