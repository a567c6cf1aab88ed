"""The executor: golden rollouts, budgets, marked failures, cancellation, concurrency off the event loop."""
import asyncio
import threading

import pytest

import envhub
from envhub import EnvSpec, Response, TextEnv
from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams
from envhub.backends.scripted import ScriptedBackend
from envhub.rollout.executor import Episode, RolloutConfig, rollout, rollout_many
from envhub.rollout.fidelity import check_trajectory
from envhub.task import select


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("env_id", ["countdown", "guess-number"])
@pytest.mark.parametrize("tok", ["tiny_tokenizer", "llama3_tokenizer"])
def test_golden_rollouts_pass_and_are_token_faithful(env_id, tok, request):
    tokenizer = request.getfixturevalue(tok)
    spec = envhub.get_spec(env_id)
    backend = ScriptedBackend(spec.golden)
    trajs = run(rollout_many(spec, select(spec.load_tasks(), n=6), backend, tokenizer, samples=2))
    assert len(trajs) == 12 and [t.details["sample"] for t in trajs[:2]] == [0, 1]
    for t in trajs:
        assert t.finish_reason == "done" and t.passed and t.reward == 1.0, (t.error, t.details)
        assert len(t.response_ids) == len(t.response_mask) == len(t.response_logprobs)
        assert check_trajectory(t, tokenizer) == []
        assert set(t.metrics) >= {"init_s", "run_s", "eval_s", "gen_s", "env_s"}
    multi = [t for t in trajs if t.num_turns > 1]
    assert env_id == "countdown" or multi and all(len(t.action_ranges) == t.num_turns for t in multi)
    assert backend.open_sessions == 0  # every session closed


class Scripted(LLMBackend):
    """A backend that returns fixed token ids: for exercising the executor's edges."""

    def __init__(self, ids, finish="stop", fail=None, delay=0.0):
        self.ids, self.finish, self.fail, self.delay, self.closed = ids, finish, fail, delay, []

    async def generate(self, prompt_ids, params, *, session_id=""):
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail:
            raise self.fail
        ids = self.ids[: params.max_tokens]
        return Generation(ids, [-0.5] * len(ids), "length" if len(ids) < len(self.ids) else self.finish)

    def close_session(self, session_id):
        self.closed.append(session_id)


def countdown_task():
    spec = envhub.get_spec("countdown")
    return spec, dict(spec.load_tasks()[0])


def test_length_cut_is_marked_truncated(tiny_tokenizer):
    spec, task = countdown_task()
    ids = tiny_tokenizer.encode("a long answer " * 20, add_special_tokens=False)
    t = run(rollout(spec, task, Scripted(ids), tiny_tokenizer, RolloutConfig(sampling=SamplingParams(max_tokens=5))))
    assert t.finish_reason == "length" and t.truncated and t.response_mask == [1] * 5
    assert t.response_logprobs == [-0.5] * 5 and not t.passed and t.error is None


def test_token_budget_counts_the_prompt(tiny_tokenizer):
    spec, task = countdown_task()
    ids = tiny_tokenizer.encode("x " * 50, add_special_tokens=False)
    probe = run(rollout(spec, task, Scripted([1]), tiny_tokenizer))
    budget = len(probe.prompt_ids) + 7
    t = run(rollout(spec, task, Scripted(ids), tiny_tokenizer, RolloutConfig(max_length=budget)))
    assert t.finish_reason == "length" and len(t.prompt_ids) + len(t.response_ids) == budget


def test_max_turns_cuts_a_multi_turn_episode(tiny_tokenizer):
    spec = envhub.get_spec("guess-number")
    task = dict(spec.load_tasks()[2])
    wrong = tiny_tokenizer.encode(str(task["high"] + 1), add_special_tokens=False)
    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    t = run(rollout(spec, task, Scripted(wrong + [eos]), tiny_tokenizer, RolloutConfig(max_turns=3)))
    assert t.finish_reason == "max_turns" and not t.truncated and t.num_turns == 3 and not t.passed  # ended on EOS
    assert len(t.action_ranges) == 3 and check_trajectory(t, tiny_tokenizer) == []


class Recording(Scripted):
    """Keeps a copy of the context of every call (the executor passes its running list: copy to keep)."""

    def __init__(self, ids):
        super().__init__(ids)
        self.contexts = []

    async def generate(self, prompt_ids, params, *, session_id=""):
        self.contexts.append(list(prompt_ids))
        return await super().generate(prompt_ids, params, session_id=session_id)


def test_each_turn_the_backend_sees_exactly_the_record_so_far(tiny_tokenizer):
    spec = envhub.get_spec("guess-number")
    task = dict(spec.load_tasks()[2])
    wrong = tiny_tokenizer.encode(str(task["high"] + 1), add_special_tokens=False)
    backend = Recording(wrong + [tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")])
    t = run(rollout(spec, task, backend, tiny_tokenizer, RolloutConfig(max_turns=4)))
    full = t.prompt_ids + t.response_ids
    assert [len(c) for c in backend.contexts] == [len(t.prompt_ids) + s for s, _ in t.action_ranges]
    assert all(c == full[:len(c)] for c in backend.contexts)


def test_a_non_blocking_verifier_grades_on_the_event_loop(tiny_tokenizer):
    from envhub.verifier import FunctionVerifier

    threads = []

    def grade(task, artifacts):
        threads.append(threading.get_ident())
        return True

    spec, task = countdown_task()
    for blocking in (True, False):
        s = EnvSpec(id="c3", env=spec.env, tasks=spec.tasks, verifier=FunctionVerifier(grade, blocking=blocking),
                    golden=spec.golden)
        t = run(rollout(s, task, ScriptedBackend(spec.golden), tiny_tokenizer))
        assert t.passed and t.reward == 1.0
        assert (threads[-1] == threading.get_ident()) is (not blocking)


def test_backend_failure_becomes_a_marked_trajectory(tiny_tokenizer):
    spec, task = countdown_task()
    backend = Scripted([1], fail=BackendError("server 127.0.0.1:1 refused the connection"))
    t = run(rollout(spec, task, backend, tiny_tokenizer, session_id="s1"))
    assert t.finish_reason == "error" and "RUN: BackendError: server 127.0.0.1:1 refused" in t.error
    assert t.prompt_ids and t.reward == 0.0 and backend.closed == ["s1"]


class Exploding(TextEnv):
    def start(self, task):
        if task.get("explode_on") == "reset":
            raise RuntimeError("reset blew up")
        return "go"

    def respond(self, action):
        raise RuntimeError("step blew up")


def exploding_spec(verifier=lambda t, a: True):
    return EnvSpec(id="exploding", env=Exploding, tasks=lambda s: [], verifier=verifier, golden=lambda t, m: "x")


@pytest.mark.parametrize("where,stage", [("reset", "INIT"), ("step", "RUN")])
def test_env_exceptions_are_marked_with_their_stage(where, stage, tiny_tokenizer):
    t = run(rollout(exploding_spec(), {"task_id": "x", "explode_on": where}, Scripted([5, 6]), tiny_tokenizer))
    assert t.finish_reason == "error" and t.error.startswith(f"{stage}: RuntimeError: {where} blew up")
    assert t.env_id == "exploding" and t.task_id == "x"


@pytest.mark.parametrize("where,stage", [("reset", "init"), ("step", "run")])
def test_an_env_exception_is_logged_once_with_its_ids(where, stage, tiny_tokenizer, caplog):
    """One record per failed rollout: job (session) id, stage, env id, task id and the error, in the text and as
    fields, with the traceback."""
    with caplog.at_level("ERROR", logger="envhub"):
        run(rollout(exploding_spec(), {"task_id": "x", "explode_on": where}, Scripted([5, 6]), tiny_tokenizer,
                    session_id="sess-1"))
    records = [r for r in caplog.records if getattr(r, "job_id", None) == "sess-1"]
    assert len(records) == 1, caplog.text
    r = records[0]
    assert (r.stage, r.env_id, r.task_id, r.error) == (stage, "exploding", "x", f"RuntimeError: {where} blew up")
    assert r.getMessage() == f"job sess-1 stage={stage} env=exploding task=x: RuntimeError: {where} blew up"
    assert r.exc_info and r.exc_info[0] is RuntimeError


def test_crashing_verifier_is_a_marked_failure_not_an_exception(tiny_tokenizer):
    """No verdict is not a wrong answer: the rollout is failed (nothing of it trained), not `done` with reward 0."""
    spec, task = countdown_task()
    spec = EnvSpec(id="c2", env=spec.env, tasks=spec.tasks, verifier=lambda t, a: 1 / 0, golden=spec.golden)
    t = run(rollout(spec, task, ScriptedBackend(spec.golden), tiny_tokenizer))
    assert t.finish_reason == "error" and t.reward == 0.0 and not t.passed and sum(t.loss_mask) == 0
    assert t.error.startswith("EVAL: ") and "ZeroDivisionError" in t.details["score"]["error"]


def test_timeout_is_marked(tiny_tokenizer):
    spec, task = countdown_task()
    t = run(rollout(spec, task, Scripted([1], delay=5), tiny_tokenizer, timeout_s=0.2))
    assert t.finish_reason == "timeout" and "0.2" in t.error


def test_cancellation_propagates_after_cleanup(tiny_tokenizer):
    spec, task = countdown_task()
    backend = Scripted([1], delay=5)

    async def go():
        job = asyncio.create_task(rollout(spec, task, backend, tiny_tokenizer, session_id="c"))
        await asyncio.sleep(0.1)
        job.cancel()
        with pytest.raises(asyncio.CancelledError):
            await job

    run(go())
    assert backend.closed == ["c"]


def test_stages_can_run_separately_and_report_timings(tiny_tokenizer):
    spec, task = countdown_task()

    async def go():
        ep = Episode(spec, task, ScriptedBackend(spec.golden), tiny_tokenizer)
        await ep.init()
        assert ep.trajectory().prompt_ids and not ep.trajectory().response_ids
        await ep.run()
        assert ep.env.done and ep.artifacts["answer"]
        await ep.evaluate()
        await ep.close()
        return ep.trajectory()

    t = run(go())
    assert t.passed and all(t.metrics[k] >= 0 for k in ("init_s", "run_s", "eval_s"))


class Rendezvous(TextEnv):
    """A blocking env: each step waits until 4 steps are in progress at once (only possible off the event loop)."""

    barrier = threading.Barrier(4, timeout=10)

    def start(self, task):
        return "wait"

    def respond(self, action):
        self.barrier.wait()
        return Response(done=True, artifacts={"answer": "ok"})


def test_blocking_envs_run_off_the_event_loop_concurrently(tiny_tokenizer):
    spec = EnvSpec(id="rendezvous", env=Rendezvous, tasks=lambda s: [], verifier=lambda t, a: True,
                   golden=lambda t, m: "x")
    tasks = [{"task_id": str(i)} for i in range(4)]
    trajs = run(rollout_many(spec, tasks, Scripted([7]), tiny_tokenizer, concurrency=4))
    assert all(t.finish_reason == "done" and t.passed for t in trajs), [t.error for t in trajs]


PLAIN_CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
                "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def test_tools_are_described_in_the_system_message_when_the_template_hides_them(tiny_model_path):
    """SmolLM2's template ignores `tools`: the executor then states them (in the parser's format) itself."""
    from envhub import FunctionTool, ToolEnv, ToolSpec, finish_tool
    from envhub.testing.models import load_tokenizer
    from envhub.policy import call, finish, script

    class Add(ToolEnv):
        def start(self, task):
            return "Add 2 and 3, then finish with the sum."

        def make_tools(self):
            add = FunctionTool(ToolSpec("add", "Add two integers", {
                "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"]}), lambda env, a, b: str(a + b))
            return [add, finish_tool()]

    tok = load_tokenizer(tiny_model_path)
    tok.chat_template = PLAIN_CHATML
    golden = script([call("add", a=2, b=3), finish("5")])
    spec = EnvSpec(id="add-plain", env=Add, tasks=lambda s: [], verifier=lambda t, a: a["answer"] == "5", golden=golden)
    t = run(rollout(spec, {"task_id": "a"}, ScriptedBackend(golden), tok))
    assert t.passed and t.num_turns == 2, t.error
    system = t.messages[0]
    assert system["role"] == "system" and '"name": "add"' in system["content"] and "To call a tool" in system["content"]
    assert "To call a tool" in tok.decode(t.prompt_ids)
    assert check_trajectory(t, tok) == []


def test_prompt_and_response_caps(tiny_tokenizer):
    spec = envhub.get_spec("guess-number")
    task = dict(spec.load_tasks()[0])
    long = run(rollout(spec, task, ScriptedBackend(spec.golden), tiny_tokenizer, RolloutConfig(max_prompt_length=5)))
    assert long.finish_reason == "error" and "exceeds the prompt length 5" in long.error and not long.response_ids
    capped = run(rollout(spec, task, ScriptedBackend(spec.hack_probes["claim-victory"]), tiny_tokenizer,
                         RolloutConfig(max_response_length=30)))
    assert capped.finish_reason == "length" and len(capped.response_ids) <= 30  # `truncated`: see the OpenRLHF test


class CrashesOnSecondStep(TextEnv):
    """Plays one turn normally, then its step raises: a crash mid-episode, after the model sampled tokens."""

    def start(self, task):
        return "guess"

    def respond(self, action):
        if self.turn >= 2:
            raise RuntimeError("env crashed mid-episode")
        return Response("again", done=False)


def test_a_failed_episode_keeps_its_record_but_carries_no_trainable_token(tiny_tokenizer):
    from envhub.training import to_tensors

    spec = EnvSpec(id="crash-mid", env=CrashesOnSecondStep, tasks=lambda s: [], verifier=lambda t, a: True,
                   golden=lambda t, m: "x")
    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    t = run(rollout(spec, {"task_id": "c"}, Scripted([5, 6, eos]), tiny_tokenizer))
    assert t.finish_reason == "error" and "env crashed mid-episode" in t.error and t.reward == 0.0
    assert sum(t.response_mask) == 6 and len(t.action_ranges) == 2  # the exact record is kept for inspection
    assert t.loss_mask == [0] * len(t.response_mask) and t.trainable_ranges == []
    batch = to_tensors([t])
    assert int(batch["action_mask"].sum()) == 0  # a trainer learns nothing from it


def test_truncated_means_the_models_last_turn_was_cut_as_in_openrlhf(tiny_tokenizer):
    """OpenRLHF (utils/agent.py) sets ``truncated`` from the last generation's ``finish_reason == "length"``: a
    budget that runs out at the env's reply, after the model ended its turn, is not a truncation."""
    spec = envhub.get_spec("guess-number")
    task = dict(spec.load_tasks()[2])
    wrong = tiny_tokenizer.encode(str(task["high"] + 1), add_special_tokens=False)
    eos = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    probe = run(rollout(spec, task, Scripted(wrong + [eos]), tiny_tokenizer, RolloutConfig(max_turns=2)))
    first_turn_end = len(probe.prompt_ids) + probe.action_ranges[0][1]
    # the env's first reply does not fit: cut at the env reply, the model's turn had ended on its EOS
    t = run(rollout(spec, task, Scripted(wrong + [eos]), tiny_tokenizer, RolloutConfig(max_length=first_turn_end + 2)))
    assert t.finish_reason == "length" and t.truncated is False and t.response_mask[-1] == 1
    # the model's own turn cut by the budget: truncated
    t = run(rollout(spec, task, Scripted(wrong + [eos]), tiny_tokenizer, RolloutConfig(max_length=first_turn_end - 1)))
    assert t.finish_reason == "length" and t.truncated is True
