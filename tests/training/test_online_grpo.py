"""It learns, online: the example in ``examples/online_grpo`` trains the tiny model with GRPO through the real rollout
service (HTTP on loopback, the ``hf`` backend, the staleness gate at eta=2, pause -> weight copy -> resume every step)
and the reward rises.

What each check stands for:

* the reward of the batches the trainer receives rises, and so does the held-out reward *sampled by the service*
  after training (the learning reached the generator through the weight update, not just the trainer's copy);
* asynchrony is real and bounded: trained samples are 1 and 2 versions old, never more than eta;
* every model token of every trained sample is tagged with a version the service actually served;
* broken on purpose -- the weight copy skipped, so the generator never changes -- the held-out reward is exactly what
  it was (same seeds, same weights): the check above cannot pass without the update reaching the service.
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "online_grpo"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import echo_digit
        import run
        import trainer
        import warmup

        echo_digit.register()
        yield run, trainer, warmup
    finally:
        sys.path.remove(str(EXAMPLE))


@pytest.fixture(scope="module")
def warm_model(example, tiny_model_path, tmp_path_factory):
    _, _, warmup = example
    return warmup.format_warmup(tiny_model_path, tmp_path_factory.mktemp("warm"))


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # the trainer and the generator each take one of the two cores
    yield
    torch.set_num_threads(n)


def train(example, model_path, steps=12):
    run, trainer, _ = example
    schedule = trainer.Schedule("eta2", eta=2, steps=steps, groups=8, group_size=8, seed=0)
    return asyncio.run(run.run_schedule(schedule, model_path, latency_s=0.02, latency_sigma=1.0, n_eval=16))


def mean(xs):
    return sum(xs) / len(xs)


def test_the_reward_rises_online_at_eta_2(example, warm_model):
    report = train(example, warm_model)
    rewards = [s.reward for s in report.steps]
    assert mean(rewards[-4:]) > mean(rewards[:3]) + 0.05, rewards
    assert report.eval_after > report.eval_before + 0.05, (report.eval_before, report.eval_after)
    lags = report.lag_histogram()
    assert max(lags) <= 2 and sum(n for lag, n in lags.items() if lag >= 1) > len(report.steps) * 8, lags
    served = {s.version for s in report.samples if s.ok}
    assert served <= set(range(len(report.steps) + 1)) and len(served) > 3, served


def test_without_the_weight_update_the_served_policy_does_not_move(example, warm_model, monkeypatch):
    _, trainer, _ = example
    monkeypatch.setattr(trainer.OnlineGRPO, "_copy_weights", lambda self: None)
    report = train(example, warm_model, steps=4)
    assert report.eval_after == report.eval_before
