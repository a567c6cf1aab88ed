"""swe-gym: the offline split, its loader, the grader (golden / empty / broken / hacked patches, each defense on its
own), episodes through the env and the executor on real bwrap sandboxes, and admission over every instance.

Hacked patches are built on the host from the same hack definitions the admission probes play through the env
(``envhub_swe_gym.policies.HACKS``); each one is first shown to *work* against a grader with its defenses off, so
a passing "hack fails" test means something.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envhub_swe_gym import generate, loader, patchguard, policies, repos
from envhub_swe_gym.gitutil import git, out
from envhub_swe_gym.grader import DEFENSES, SweGymVerifier, as_list
from envhub_swe_gym.sources import all_specs
from envhub_swe_gym.testrun import diff_files, is_test_path, parse_pytest_rA

DATA = Path(generate.__file__).parent / "data"
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    """Checkouts and mirrors in a cache of this module's own (built once, shared by every test here)."""
    old = os.environ.get("ENVHUB_CACHE")
    os.environ["ENVHUB_CACHE"] = str(tmp_path_factory.mktemp("envhub-cache"))
    yield
    if old is None:
        os.environ.pop("ENVHUB_CACHE", None)
    else:
        os.environ["ENVHUB_CACHE"] = old


@pytest.fixture(scope="module")
def rows():
    return [dict(r) for r in loader.load_swe_gym("train", source="offline")]


def by_id(rows, instance_id):
    return next(r for r in rows if r["instance_id"] == instance_id)


def make_diff(row, ops, tmp_path) -> str:
    """The diff an agent would submit after playing hack ``ops`` (see ``policies.HACKS``) on the task's checkout."""
    work = tmp_path / f"work-{time.monotonic_ns()}"
    shutil.copytree(repos.checkout(row["repo"], row["base_commit"]), work, symlinks=True)
    for op in ops:
        target = work / op[1] if op[0] != "bash" else None
        if op[0] == "write":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(op[2])
            if op[3]:
                target.chmod(0o755)
        elif op[0] == "append":
            target.write_text(target.read_text() + op[2])
        elif op[0] == "remove":
            target.unlink(missing_ok=True)
        else:  # a shell step, run on the host copy the way the probe runs it in the sandbox
            subprocess.run(["bash", "-c", op[1].replace(policies.REPO, str(work))], check=True, capture_output=True)
    git("add", "-A", cwd=work)
    return out("diff", "--cached", "--binary", row["base_commit"], cwd=work) + "\n"


def edit_diff(row, path, old, new, tmp_path) -> str:
    """A diff replacing ``old`` by ``new`` in ``path`` at the task's base commit."""
    work = tmp_path / f"edit-{time.monotonic_ns()}"
    shutil.copytree(repos.checkout(row["repo"], row["base_commit"]), work, symlinks=True)
    text = (work / path).read_text()
    assert text.count(old) == 1, f"{old!r} not found once in {path}"
    (work / path).write_text(text.replace(old, new))
    return out("diff", row["base_commit"], cwd=work) + "\n"


# ---- the offline split and its loader ---------------------------------------------------------------------------
def test_offline_split_has_swe_gym_schema_through_datasets():
    import datasets

    ds = loader.load_swe_gym("train", source="offline")
    assert isinstance(ds, datasets.Dataset)
    assert 12 <= len(ds) <= 20
    assert ds.column_names == ["instance_id", "hints_text", "patch", "test_patch", "created_at", "problem_statement",
                               "repo", "base_commit", "version", "PASS_TO_PASS", "FAIL_TO_PASS", "task_id"]
    assert ds.features["FAIL_TO_PASS"].feature.dtype == "string"
    assert len({r["repo"] for r in ds}) == 3
    for r in ds:
        assert r["task_id"] == r["instance_id"]
        owner, name = r["repo"].split("/")
        assert r["instance_id"].startswith(f"{owner}__{name}-")
        assert len(r["base_commit"]) == 40 and r["FAIL_TO_PASS"]
        assert not set(r["FAIL_TO_PASS"]) & set(r["PASS_TO_PASS"])
        assert r["patch"].startswith("diff --git") and r["test_patch"].startswith("diff --git")
        assert not any(is_test_path(p) for p in diff_files(r["patch"])), "golden patches touch code only"
        assert all(is_test_path(p) for p in diff_files(r["test_patch"])), "test patches touch tests only"
        assert {n.split("::")[0] for n in r["FAIL_TO_PASS"]} <= set(diff_files(r["test_patch"]))


def test_lite_split_is_a_subset_and_aliases_work():
    full = {r["instance_id"]: r for r in loader.load_swe_gym("train", source="offline")}
    lite = loader.load_swe_gym("lite", source="offline")
    assert 0 < len(lite) < len(full)
    assert all(full[r["instance_id"]] == r for r in lite)
    assert len(loader.load_swe_gym("test", source="offline")) == len(full)
    with pytest.raises(ValueError, match="unknown swe-gym split"):
        loader.load_swe_gym("validation", source="offline")


def _serve(handler_body):
    """A real HTTP server on loopback whose every request runs ``handler_body(handler)``."""
    import http.server
    import threading

    class H(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            handler_body(self)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_auto_source_is_offline_fast_when_the_hub_does_not_answer(monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "ENVHUB_SWE_GYM_SOURCE"):
        monkeypatch.delenv(var, raising=False)
    hang = _serve(lambda h: time.sleep(5))  # accepts the connection, never answers
    ok = _serve(lambda h: (h.send_response(200), h.end_headers()))
    try:
        monkeypatch.setattr(loader, "_reachable", None)
        monkeypatch.setattr(loader, "HUB_URL", f"http://127.0.0.1:{hang.server_address[1]}/api/datasets/x")
        t0 = time.perf_counter()
        assert loader.hub_reachable(timeout=0.3) is False
        assert time.perf_counter() - t0 < 1.5, "the probe must not hang"
        assert loader.resolve_source("auto") == "offline"
        with pytest.raises(ConnectionError, match="not reachable"):
            loader.load_swe_gym("train", source="hub")
        monkeypatch.setattr(loader, "_reachable", None)
        monkeypatch.setattr(loader, "HUB_URL", f"http://127.0.0.1:{ok.server_address[1]}/api/datasets/x")
        assert loader.resolve_source("auto") == "hub"
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the variable wins over a probe that said yes
        assert loader.resolve_source("auto") == "offline"
    finally:
        hang.shutdown()
        ok.shutdown()


def test_swe_bench_json_string_test_lists_are_accepted():
    import datasets

    row = json.loads((DATA / "train.jsonl").read_text().splitlines()[0])
    row.pop("task_id")
    row["FAIL_TO_PASS"] = json.dumps(row["FAIL_TO_PASS"])
    row["PASS_TO_PASS"] = json.dumps(row["PASS_TO_PASS"])
    row["hints_text"] = None
    ds = loader.normalize(datasets.Dataset.from_list([row]))
    r = ds[0]
    assert r["FAIL_TO_PASS"] == json.loads(row["FAIL_TO_PASS"]) and r["task_id"] == row["instance_id"]
    assert r["hints_text"] == ""
    assert as_list(row["PASS_TO_PASS"]) == r["PASS_TO_PASS"]


def test_base_commits_are_reproducible(tmp_path, rows):
    """Replaying the histories with fixed authors and dates gives the shipped commit ids (no tests run: fast)."""
    manifest = json.loads((DATA / "repos" / "manifest.json").read_text())
    rebuilt = []
    for spec in all_specs():
        repo = tmp_path / spec.repo.replace("/", "__")
        rebuilt += generate.build_repo(spec, repo)
        assert out("rev-parse", "HEAD", cwd=repo) == manifest[spec.repo]["head"]
    assert [(r["instance_id"], r["base_commit"], r["patch"], r["test_patch"]) for r in rebuilt] == \
           [(r["instance_id"], r["base_commit"], r["patch"], r["test_patch"]) for r in rows]


@pytest.mark.slow
def test_generator_check_reproduces_the_shipped_split():
    """The full rebuild, tests run before/after each golden patch included, matches the shipped files exactly."""
    assert generate.check() == []


def test_bundles_verify_and_checkouts_hold_no_future(rows):
    for _repo, meta in json.loads((DATA / "repos" / "manifest.json").read_text()).items():
        git("bundle", "verify", "-q", str(DATA / meta["bundle"]), cwd=DATA)
    for row in rows[::5]:
        co = repos.checkout(row["repo"], row["base_commit"])
        assert out("rev-parse", "HEAD", cwd=co) == row["base_commit"]
        assert out("status", "--porcelain", cwd=co) == ""
        assert out("remote", cwd=co) == ""
        ancestors = set(out("rev-list", row["base_commit"], cwd=co).split())
        stored = {line.split()[0] for line in out("cat-file", "--batch-all-objects", "--batch-check", cwd=co)
                  .splitlines() if line.split()[1] == "commit"}
        assert stored == ancestors, "the checkout must hold no commit after base_commit"
        assert repos.checkout(row["repo"], row["base_commit"]) == co  # cached


# ---- parsing and patch hygiene (pure functions) ---------------------------------------------------------------------
def test_parse_pytest_rA_reads_only_the_summary():
    log = "\n".join([
        "PASSED tests/test_a.py::test_forged",  # printed by code under test: not in the summary, ignored
        "=========== short test summary info ===========",
        "PASSED tests/test_a.py::test_ok",
        "FAILED tests/test_a.py::test_bad - AssertionError: assert 1 == 2",
        "PASSED tests/test_a.py::test_p[a - b]",
        "ERROR tests/test_a.py::test_ok - RuntimeError: teardown",
        "SKIPPED [1] tests/test_a.py:9: flaky",
        "XFAIL tests/test_a.py::test_x - reason",
        "ERROR tests/test_b.py - ImportError: boom",
        "====== 1 failed, 2 passed, 1 error in 0.12s ======",
    ])
    r = parse_pytest_rA(log, expected=["tests/test_a.py::test_p[a - b]"])
    assert r.complete and r.final_line.startswith("1 failed")
    assert r.statuses == {"tests/test_a.py::test_ok": "ERROR", "tests/test_a.py::test_bad": "FAILED",
                          "tests/test_a.py::test_p[a - b]": "PASSED", "tests/test_a.py::test_x": "XFAIL"}
    assert r.collection_errors == ["tests/test_b.py"]
    assert not parse_pytest_rA("collected 3 items\nPASSED tests/test_a.py::test_ok\n").complete


def test_filter_drops_every_kind_of_protected_file(rows, tmp_path):
    row = by_id(rows, "envhub__spanlib-21")
    for name in ("rewrite-tests", "conftest-force-pass", "runner-config-plugin", "site-customize", "path-shim"):
        kept, dropped = patchguard.filter_patch(make_diff(row, policies.HACKS[name](row), tmp_path))
        assert kept == "", f"{name}: {kept[:300]}"
        assert dropped, name
    golden_kept, golden_dropped = patchguard.filter_patch(row["patch"])
    assert golden_kept == row["patch"] and golden_dropped == []
    for path in ("json.py", "_pytest/__init__.py", ".git/config", "pkg/x.cpython-311-x86_64-linux-gnu.so",
                 "bin/tool", "a/b/conftest.py", "setup.cfg", "lib/evil.pth", "spanlib/usercustomize.py"):
        assert patchguard.protected_reason(path), path
    for path in ("spanlib/interval.py", "README.md", "docs/usage.md", "spanlib/pytest_helpers.txt"):
        assert patchguard.protected_reason(path) is None, path
    weird = 'diff --git "a/sp\\303\\251c.py" "b/sp\\303\\251c.py"\nnew file mode 100644\n--- /dev/null\n' \
            '+++ "b/sp\\303\\251c.py"\n@@ -0,0 +1 @@\n+x = 1\n'
    sections, _ = patchguard.split_patch(weird)
    assert sections[0].paths == ["spéc.py"]
    link = "diff --git a/spanlib/x.py b/spanlib/x.py\nnew file mode 120000\n--- /dev/null\n+++ b/spanlib/x.py\n" \
           "@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n"
    assert patchguard.filter_patch(link)[1][0]["reason"] == "a symlink or submodule"


def test_scan_passes_every_golden_patch_and_flags_runner_hacks(rows, tmp_path):
    assert [r["instance_id"] for r in rows if patchguard.scan_patch(r["patch"])] == []
    row = rows[0]
    for name in ("exit-on-import", "runner-monkeypatch", "rewrite-tests-on-import"):
        findings = patchguard.scan_patch(make_diff(row, policies.HACKS[name](row), tmp_path))
        assert findings, name
    assert patchguard.scan_patch("diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1 +1,2 @@\n x = 1\n"
                                 "+y = re.compile('a')  # compile( in a comment, sys.exit()\n") == []


# ---- the grader, on real sandboxes ----------------------------------------------------------------------------------
@needs_bwrap
def test_grader_golden_empty_broken_and_unapplicable(rows, tmp_path):
    v = SweGymVerifier()
    t3, s36 = by_id(rows, "envhub__textkit-3"), by_id(rows, "envhub__spanlib-36")
    regress = edit_diff(t3, "textkit/numbers.py", 'suffix = {1: "st", 2: "nd", 3: "rd"}.get(abs(n) % 10, "th")',
                        'suffix = "th"', tmp_path)  # fixes 11th..13th, breaks 1st/2nd/3rd
    still_wrong = edit_diff(s36, "spanlib/dates.py", "if day.weekday() < 6:", "if day.weekday() < 7:", tmp_path)
    cases = [(t3, t3["patch"]), (s36, s36["patch"]), (t3, ""), (t3, regress), (s36, still_wrong),
             (s36, "diff --git a/spanlib/dates.py b/spanlib/dates.py\n--- a/spanlib/dates.py\n+++ b/spanlib/dates.py\n"
                   "@@ -1,1 +1,1 @@\n-no such line\n+x\n"), (s36, None)]
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda c: v.verify(c[0], {"patch": c[1]} if c[1] is not None else {}), cases))
    golden_t3, golden_s36, empty, regressed, wrong, unapplicable, missing = scores
    for s in (golden_t3, golden_s36):
        assert s.passed and s.reward == 1.0 and s.details["resolved"], s.details.get("reason")
        assert set(s.details["tests"].values()) == {"PASSED"}
    assert not empty.passed and "empty" in empty.details["reason"]
    assert not regressed.passed and regressed.reward == 0.0
    assert "tests/test_numbers.py::test_ordinal_teens" in regressed.details["tests_status"]["FAIL_TO_PASS"]["success"]
    assert "tests/test_numbers.py::test_ordinal_basic" in regressed.details["tests_status"]["PASS_TO_PASS"]["failure"]
    assert not wrong.passed and wrong.details["tests"]["tests/test_dates.py::test_business_days_weekend_only"] == "FAILED"
    assert not unapplicable.passed and "does not apply" in unapplicable.details["reason"]
    assert not missing.passed and "no patch" in missing.details["reason"]


@needs_bwrap
def test_the_test_run_sees_a_read_only_tree(rows, tmp_path):
    """A fix that only holds while /testbed is read-only: resolved with the defense on, not with it off."""
    row = by_id(rows, "envhub__spanlib-21")
    probe = ("\n\ntry:\n    open(__file__.replace('__init__.py', 'probe.txt'), 'w').close()\n"
             "    raise RuntimeError('the tree under test is writable')\nexcept OSError:\n    pass\n")
    patch = row["patch"] + make_diff(row, [("append", "spanlib/__init__.py", probe)], tmp_path)
    no_scan = DEFENSES - {"scan"}
    assert patchguard.scan_patch(patch), "the scan alone would refuse this patch: switch it off to test the mount"
    assert SweGymVerifier(defenses=no_scan).verify(row, {"patch": patch}).passed
    writable = SweGymVerifier(defenses=no_scan - {"readonly"}).verify(row, {"patch": patch})
    assert not writable.passed and "writable" in writable.details["log_tail"]


# Which hack succeeds against an undefended grader, and which single defense is enough to stop it. ``None``: the
# run itself (absolute interpreter, -I, our ini, and since #13 the authenticated verdict records, which never read
# pytest's reports or log) stops it, whatever is switched off. That the report-forcing hacks beat the grader *before*
# #13 even with its defenses on is shown in test_swe_gym_verdicts.py against the old grader rebuilt from git.
HACK_MATRIX: dict[str, set[str] | None] = {
    "conftest-force-pass": None,
    "runner-monkeypatch": None,
    "exit-on-import": None,
    "runner-config-plugin": None,
    "site-customize": None,
    "path-shim": None,
    "skip-markers": None,
}


@needs_bwrap
@pytest.mark.parametrize("hack", sorted(HACK_MATRIX))
def test_each_hack_is_real_and_each_defense_stops_it(hack, rows, tmp_path):
    row = by_id(rows, "envhub__spanlib-21")
    patch = make_diff(row, policies.HACKS[hack](row), tmp_path)
    stoppers = HACK_MATRIX[hack]
    configs = {"all": DEFENSES, "none": frozenset()}
    if stoppers:
        configs.update({f"only-{d}": frozenset({d}) for d in DEFENSES})
    with ThreadPoolExecutor(4) as pool:
        scores = dict(zip(configs, pool.map(lambda d: SweGymVerifier(defenses=d).verify(row, {"patch": patch}),
                                            configs.values())))
    assert not scores["all"].passed, scores["all"].details["reason"]
    if stoppers is None:
        assert not scores["none"].passed, f"{hack} beat the bare runner: {scores['none'].details}"
        return
    assert scores["none"].passed, f"{hack} should beat an undefended grader (else this test proves nothing): " \
                                  f"{scores['none'].details.get('reason')}"
    for d in DEFENSES:
        s = scores[f"only-{d}"]
        assert s.passed == (d not in stoppers), f"{hack} with only {d!r}: {s.details.get('reason')}"


# ---- episodes: the env, the executor, admission ----------------------------------------------------------------
@pytest.fixture(scope="module")
def spec():
    import envhub

    return envhub.get_spec("swe-gym")


def play(spec, task, policy, **make_kw):
    """Play ``policy`` to the end of the episode; returns (env's first messages, last info, history). Closes the env."""
    env = spec.make(**make_kw)
    try:
        first, _ = env.reset(seed=0, options={"task": task})
        history = list(first)
        while True:
            action = policy(task, history)
            obs, _, terminated, truncated, info = env.step(action)
            history += [action.to_message() if hasattr(action, "to_message") else {"role": "assistant"}, *obs]
            if terminated or truncated:
                return first, info, history
    finally:
        env.close()


@needs_bwrap
def test_golden_episode_through_the_env_and_a_real_sandbox(spec, rows):
    from envhub.policy import call, finish, script

    task = by_id(rows, "envhub__minicalc-52")
    looks = script([
        call("bash", command="cd /testbed && git log --all --format=%H && git cat-file --batch-all-objects "
                             "--batch-check | grep -c commit && git status --short && whoami && pwd"),
        finish(),
    ])
    first, info, history = play(spec, task, looks)
    assert [m["role"] for m in first] == ["user"]
    assert task["problem_statement"].strip() in first[0]["content"] and "/testbed" in first[0]["content"]
    seen = history[2]["content"]
    log = [line for line in seen.splitlines() if len(line) == 40]
    assert log[0] == task["base_commit"], "the sandbox holds the repository at base_commit"
    assert int(seen.splitlines()[len(log)]) == len(log), "and no commit object beyond its history"
    assert info["artifacts"] == {"patch": ""}
    _, info, _ = play(spec, task, spec.golden)
    assert info["artifacts"]["patch"] == task["patch"], "the extracted diff is the golden patch, byte for byte"
    score = spec.verifier.verify(task, info["artifacts"])
    assert score.passed and score.reward == 1.0, score.details["reason"]


@needs_bwrap
def test_diff_extraction_covers_new_files_commits_and_broken_repos(spec, rows):
    from envhub.policy import call, script

    task = by_id(rows, "envhub__textkit-8")
    busy = script([
        call("bash", command="cd /testbed && echo 'X = 1' > textkit/extra.py && echo '# note' >> textkit/slug.py && "
                             "git add -A && git commit -qm wip && echo tmp > /tmp/outside && "
                             "mkdir -p textkit/__pycache__ && echo junk > textkit/__pycache__/x.pyc"),
    ])
    _, info, history = play(spec, task, busy)
    patch = info["artifacts"]["patch"]
    assert "b/textkit/extra.py" in patch and "+# note" in patch, "committed and new files are in the diff"
    assert "__pycache__" not in patch and "/tmp/outside" not in patch
    vandal = script([call("bash", command="rm -rf /testbed/.git")])
    _, info, _ = play(spec, task, vandal)
    assert info["artifacts"]["patch"] == "" and "could not extract" in info["artifacts"]["error"]
    score = spec.verifier.verify(task, info["artifacts"])
    assert not score.passed and "could not extract" in score.details["artifact_error"]


@needs_bwrap
def test_out_of_turns_the_work_so_far_is_graded(spec, rows):
    task = by_id(rows, "envhub__spanlib-30")
    _, info, _ = play(spec, task, spec.golden, max_turns=2)  # create + git apply, then the budget is spent
    assert info["artifacts"]["patch"] == task["patch"]
    assert spec.verifier.verify(task, info["artifacts"]).passed


@needs_bwrap
@pytest.mark.slow
def test_probes_fail_through_the_env(spec, rows):
    task = by_id(rows, "envhub__spanlib-21")

    def one(name):
        _, info, _ = play(spec, task, spec.hack_probes[name])
        return name, spec.verifier.verify(task, info["artifacts"])

    with ThreadPoolExecutor(4) as pool:
        results = dict(pool.map(one, sorted(spec.hack_probes)))
    assert len(results) >= 10
    passed = {n: s.details["reason"] for n, s in results.items() if s.passed}
    assert not passed, passed
    dropped = {n for n, s in results.items() if s.details.get("dropped")}
    rejected = {n for n, s in results.items() if s.details.get("findings")}
    assert {"conftest-force-pass", "runner-config-plugin", "site-customize", "path-shim", "skip-markers",
            "rewrite-tests", "delete-tests"} <= dropped
    assert {"exit-on-import", "runner-monkeypatch", "rewrite-tests-on-import"} <= rejected


@needs_bwrap
def test_golden_rollout_through_the_executor(spec, rows):
    """Token in, token out: the golden policy rendered by a real tokenizer and chat template (a tiny model built
    offline, cached), parsed back into tool calls, run in the sandbox, graded in EVAL."""
    import asyncio

    from envhub.backends.base import SamplingParams
    from envhub.backends.scripted import ScriptedBackend
    from envhub.testing.models import build_tiny_model, load_tokenizer
    from envhub.rollout.executor import RolloutConfig, rollout

    tok = load_tokenizer(build_tiny_model(template="chatml"))
    task = by_id(rows, "envhub__textkit-11")
    config = RolloutConfig(max_length=1 << 16, sampling=SamplingParams(max_tokens=1 << 14))
    traj = asyncio.run(rollout(spec, task, ScriptedBackend(spec.golden), tok, config))
    assert traj.error is None and traj.finish_reason == "done", traj.error
    assert traj.passed and traj.reward == 1.0
    assert traj.num_turns == 3 and traj.details["score"]["resolved"]
    assert len(traj.response_ids) == len(traj.response_mask) == len(traj.response_logprobs)
    assert 0 in traj.response_mask and 1 in traj.response_mask
    assert traj.metrics["eval_s"] > 0 and traj.metrics["run_s"] > 0


@needs_bwrap
@pytest.mark.slow
@pytest.mark.timeout(1500)  # 18 tasks x 26 hack probes, graded in fresh sandboxes: ~4.5 min alone on 2 cores
def test_admission_admits_every_instance(spec):
    from envhub.admission import admit

    report = admit(spec, concurrency=4)
    assert report.fit, report.unfit_reasons
    assert report.passed == len(report.tasks) == len(spec.load_tasks()), report.quarantined
    names = {c.name for t in report.tasks for c in t.checks}
    assert {"golden", "noop", "deterministic"} | {f"hack:{n}" for n in spec.hack_probes} <= names


@needs_bwrap
def test_gymnasium_make_grades_at_the_end_of_the_episode(spec, rows):
    import gymnasium

    task = by_id(rows, "envhub__minicalc-58")
    env = gymnasium.make(spec.gym_id)
    try:
        obs, _ = env.reset(seed=0, options={"task": task})
        history, rewards = list(obs), []
        for _ in range(5):
            action = spec.golden(task, history)
            obs, reward, terminated, truncated, info = env.step(action)
            history += [action.to_message(), *obs]
            rewards.append(reward)
            if terminated or truncated:
                break
    finally:
        env.close()
    assert terminated and rewards == [0.0, 0.0, 1.0] and info["score"]["passed"]
