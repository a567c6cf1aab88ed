"""An online GRPO trainer over the rollout service: generation and training overlap, a weight update every step.

One loop serves every schedule, because the schedule *is* the staleness gate's ``eta`` (AReaL's
``max_head_offpolicyness``; ``envhub.rollout.staleness``):

* ``eta = 0`` -- **synchronous**: the gate admits one batch per version; the trainer waits for all of it, trains,
  updates the weights, and only then is the next batch admitted.
* ``eta = 1`` -- **one-step-off** (verl's one_step_off_policy, slime's overlapped mode): the next batch is generated
  by the previous weights while the trainer trains.
* ``eta = k`` -- **asynchronous** (AReaL, verl fully-async): rollouts run up to ``k`` versions ahead; a weight update
  pauses the servers in ``abort`` mode, so a generation in flight keeps its tokens and continues under the new weights
  (each chunk tagged with its own version).

Per step the trainer, over HTTP: collects ``groups`` informative groups (:class:`~envhub.training.DAPOCollector`,
which reports the trainer's version to the gate and the samples it throws away), ``POST /trainer/step`` begin,
computes GRPO advantages and one optimizer step, ``POST /pause``, copies the weights into the generator, ``POST
/resume {version}``, ``POST /trainer/step`` end. The weight copy is the one step that is not HTTP: the service and its
generator run in a process of their own (``generator.py``) whose parameters are shared memory, and the trainer writes
into them (a colocated trainer's CUDA-IPC / NCCL weight sync, on CPU); everything the agent could notice goes through
the real service.

The loss: on-policy (``eta = 0``) and "naive" runs use the PPO-clip surrogate against the logprobs the engine sampled
with (``policy_gradient_loss``: the ratio to a policy ``eta`` versions old is clipped, and those tokens stop
teaching); ``decoupled=True`` uses AReaL's decoupled PPO loss (``decoupled_ppo_loss``) with proximal logprobs
recomputed by a forward pass of the weights about to be updated (``prox_logp_method: recompute``).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Schedule:
    """One training run's settings."""

    name: str
    eta: int  # 0 sync, 1 one-step-off, k: up to k versions ahead
    decoupled: bool = False  # AReaL's decoupled PPO loss (else PPO-clip against the behaviour logprobs)
    prox: str = "recompute"  # the decoupled loss's proximal logprobs: a forward pass, or AReaL's "loglinear"
    steps: int = 30
    groups: int = 8  # informative groups per step
    group_size: int = 8
    lr: float = 2e-3
    minibatches: int = 1  # optimizer steps per batch (AReaL's ppo_n_minibatches), against one proximal policy
    max_tokens: int = 12  # eight digits and the end of the turn, with room to overrun
    temperature: float = 1.0
    pause_mode: str = "abort"  # "hold" keeps the calls in flight waiting; "abort" re-sends them after the resume
    seed: int = 0

    @property
    def batch(self) -> int:
        return self.groups * self.group_size


@dataclass
class Sample:
    """One finished rollout as the trainer saw it (every rollout, trained on or not)."""

    t: float  # seconds since the run started
    reward: float
    version: int  # the oldest version among its model tokens (-1: no model token)
    ok: bool


@dataclass
class StepLog:
    step: int
    t: float  # seconds since the run started, at the end of the step
    reward: float  # mean reward of the samples trained on
    waited_s: float  # the trainer waiting for its batch (idle)
    train_s: float  # the optimizer step
    sync_s: float  # pause + weight copy + resume
    lags: list[int]  # per trained sample: trainer version - oldest version of its tokens


@dataclass
class Report:
    schedule: dict[str, Any]
    wall_s: float
    steps: list[StepLog]
    samples: list[Sample]
    collector: dict[str, Any]
    gate: dict[str, Any]
    throughput: dict[str, Any]
    eval_before: float | None = None
    eval_after: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def trained(self) -> int:
        return sum(len(s.lags) for s in self.steps)

    @property
    def samples_per_s(self) -> float:
        return self.trained / self.wall_s if self.wall_s else 0.0

    @property
    def trainer_idle(self) -> float:
        return sum(s.waited_s for s in self.steps) / self.wall_s if self.wall_s else 0.0

    def lag_histogram(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for s in self.steps:
            for lag in s.lags:
                out[lag] = out.get(lag, 0) + 1
        return dict(sorted(out.items()))

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(trained=self.trained, samples_per_s=self.samples_per_s, trainer_idle=self.trainer_idle,
                 lag_histogram=self.lag_histogram())
        return d


class RecordingClient:
    """A :class:`~envhub.training.RolloutClient` that notes every finished rollout (reward, version, time)."""

    def __init__(self, client: Any, t0: float):
        self._client, self.t0, self.samples = client, t0, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def process(self, *args: Any, **kw: Any) -> Any:
        traj = await self._client.process(*args, **kw)
        versions = [v for v in (traj.response_versions or []) if v >= 0]
        self.samples.append(Sample(time.monotonic() - self.t0, float(traj.reward or 0.0),
                                   min(versions) if versions else -1, bool(traj.ok)))
        return traj


class OnlineGRPO:
    """Trains ``model`` online against the rollout service at ``url`` whose generator samples with ``generator_params``.

    Args:
        model: the trainer's policy (a transformers causal LM, float32, on CPU).
        generator_params: the parameters the service's backend samples with (``GeneratorProcess.parameters``: shared
            memory), in ``model.parameters()`` order; the weight update copies into them.
        url: the rollout service.
        prompts: an endless iterator of instances (``{"env_id", "task"}``).
        schedule: the run's :class:`Schedule`.
        pad_token_id: for batching.
    """

    def __init__(self, model: Any, generator_params: list[Any], url: str, prompts: Any, schedule: Schedule,
                 pad_token_id: int):
        import torch

        self.model, self.generator_params, self.url = model, generator_params, url
        self.prompts, self.s, self.pad = prompts, schedule, pad_token_id
        self.opt = torch.optim.Adam(model.parameters(), lr=schedule.lr)
        self.version = 0
        self.on_step: Any = None  # called with each StepLog (progress output)

    async def run(self) -> Report:
        from envhub.training import DAPOCollector, RolloutClient, TooManyGroups

        s = self.s
        async with RolloutClient(self.url) as raw:
            await raw.configure_staleness(max_staleness=s.eta, batch_size=s.batch, mode="pace")
            t0 = time.monotonic()
            client = RecordingClient(raw, t0)
            # asynchronous: enough jobs outstanding that the gate, not the client, decides what runs ((eta + 1)
            # batches), all carried over a step; synchronous: one batch (plus replacements for the groups DAPO
            # drops), nothing carried
            collector = DAPOCollector(
                client, self.prompts, group_size=s.group_size, max_inflight=(s.eta + 1) * s.batch,
                carry_groups=s.eta * s.groups, max_staleness=s.eta,
                sampling_params={"max_tokens": s.max_tokens, "temperature": s.temperature, "seed": s.seed})
            steps: list[StepLog] = []
            try:
                for step in range(s.steps):
                    w0 = time.monotonic()
                    try:  # a collapsed policy (every sample of a prompt alike) would make DAPO resample forever
                        groups = await collector.collect(s.groups, policy_version=self.version,
                                                         max_groups=20 * s.groups)
                    except TooManyGroups as e:
                        if not e.groups:
                            raise
                        groups = e.groups  # train on the informative groups it found
                    waited = time.monotonic() - w0
                    t1 = time.monotonic()
                    # the step boundary is a report, not a handshake: the trainer does not wait for a busy server
                    begin = asyncio.ensure_future(raw.trainer_step("begin"))
                    reward, lags, n = await asyncio.to_thread(self._train, groups)
                    t2 = time.monotonic()
                    self.version += 1
                    await raw.pause(s.pause_mode if s.eta > 0 else "hold")
                    self._copy_weights()
                    await raw.resume(self.version)
                    await begin
                    await asyncio.gather(raw.trainer_step("end", samples=n),
                                         raw.report_staleness(version=self.version, consumed=n))
                    steps.append(StepLog(step, time.monotonic() - t0, reward, waited, t2 - t1,
                                         time.monotonic() - t2, lags))
                    if self.on_step is not None:
                        self.on_step(steps[-1])
                wall = time.monotonic() - t0
            finally:
                await collector.close()
            status = (await raw.status())[0]
            gate = (await raw.staleness())[0]
        return Report(asdict(s), wall, steps, client.samples, dict(collector.stats), gate,
                      status.get("throughput") or {})

    # ---- one optimizer step (a worker thread: the event loop keeps collecting meanwhile) --------------------------
    def _train(self, groups: list[Any]) -> tuple[float, list[int], int]:
        import torch

        from envhub.training import (
            decoupled_ppo_loss, grpo_advantages, loglinear_proximal_logprobs, policy_gradient_loss, to_tensors,
            token_logprobs,
        )

        trajs, adv, lags = [], [], []
        for g in groups:  # advantages over the whole group (withheld members keep the baseline), train the rest
            group_adv = grpo_advantages(g.rewards, [g.key] * len(g.rewards))
            for t, a, keep in zip(g.trajectories, group_adv, g.trainable):
                if keep:
                    trajs.append(t)
                    adv.append(a)
                    versions = [v for v in t.response_versions or [] if v >= 0]
                    lags.append(self.version - min(versions) if versions else 0)
        if not trajs:
            return 0.0, [], 0
        batch = to_tensors(trajs, pad_token_id=self.pad)
        advantages = torch.tensor(adv, dtype=torch.float32)
        mask = batch["loss_mask"]
        behave = batch["logprobs"][:, 1:]

        def logprobs(rows: Any) -> torch.Tensor:
            out = self.model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows],
                             position_ids=batch["position_ids"][rows])
            return token_logprobs(out.logits, batch["input_ids"][rows])

        recomputed = None
        if self.s.decoupled and self.s.prox != "loglinear":
            with torch.no_grad():  # the weights about to be updated: AReaL's proximal policy, recomputed once
                recomputed = logprobs(slice(None))
        # AReaL's ppo_n_minibatches: one optimizer step per minibatch, against the same proximal policy; with one,
        # the recomputed proximal policy *is* the policy being updated and its clip never binds
        for rows in torch.arange(len(trajs)).chunk(max(1, min(self.s.minibatches, len(trajs)))):
            logp = logprobs(rows)
            if self.s.decoupled and self.s.prox == "loglinear":  # no extra forward: interpolated from versions
                prox = loglinear_proximal_logprobs(behave[rows], logp.detach(), batch["versions"][rows, 1:],
                                                   self.version)
                loss = decoupled_ppo_loss(logp, prox, behave[rows], advantages[rows], mask[rows])
            elif recomputed is not None:
                loss = decoupled_ppo_loss(logp, recomputed[rows], behave[rows], advantages[rows], mask[rows])
            else:
                loss = policy_gradient_loss(logp, behave[rows], advantages[rows], mask[rows])
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
        reward = sum(float(t.reward or 0.0) for t in trajs) / len(trajs)
        return reward, lags, len(trajs)

    def _copy_weights(self) -> None:
        """The weight update, while the servers are paused (nothing samples): the trainer's weights into the
        generator's model."""
        import torch

        with torch.no_grad():
            for dst, src in zip(self.generator_params, self.model.parameters(), strict=True):
                if dst.shape != src.shape:  # the two sides loaded different models: copying would corrupt, not fail
                    raise ValueError(f"generator parameter {tuple(dst.shape)} vs trainer's {tuple(src.shape)}")
                dst.copy_(src)


async def evaluate(url: str, instances: list[dict[str, Any]], *, samples: int = 4, max_tokens: int = 8,
                   seed: int = 1000) -> float:
    """Mean reward of ``samples`` sampled replies per instance at the servers' current weights (temperature 1)."""
    from envhub.training import RolloutClient

    async with RolloutClient(url) as client:
        jobs = [client.process({**inst, "trajectory_id": k},
                               {"max_tokens": max_tokens, "temperature": 1.0, "seed": seed + 17 * i + k})
                for i, inst in enumerate(instances) for k in range(samples)]
        trajs = await asyncio.gather(*jobs)
        # the gate counted these as delivered samples: tell it none will be trained on, or they would use up the
        # trainer's staleness budget (capacity = (eta + v + 1) * B - accepted - running) and the next batch would
        # never be admitted
        delivered = sum(1 for t in trajs if t.ok and (t.details.get("staleness") or {}).get("verdict") == "fresh")
        if delivered:
            await client.report_staleness(discarded=delivered)
    return sum(float(t.reward or 0.0) for t in trajs) / len(trajs)
