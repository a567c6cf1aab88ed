"""The rollout side in a process of its own: envhub's rollout service and its ``hf`` generator, as a deployment runs
them beside a trainer, with the generator's weights in shared memory.

Why a second process: a trainer and a rollout server are different programs (OpenRLHF's vLLM actors, verl's rollout
workers, AReaL's generation servers). Run in the trainer's process, the service's event loop, its HTTP handling and
the generator's Python all take the trainer's interpreter lock, so every rollout in flight slows the optimizer step,
and the more a schedule overlaps (eta = 2, 4) the more it pays for what a real deployment does not. Apart, the
trainer's core trains while the generator's core generates.

The weight update stays what it was: the trainer copies its parameters into the generator's while the service is
paused (``POST /pause`` ... ``POST /resume {version}``). The generator's parameters are moved to shared memory in the
child and handed to the parent through ``torch.multiprocessing`` (which passes the storage, not a copy), so the copy
writes straight into the tensors the child samples with -- the CPU counterpart of a colocated trainer's CUDA-IPC or
NCCL weight sync in verl and slime.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def _serve(model_path: str, example_dir: str, out: Any, stop: Any) -> None:
    """The child: register the env, load the generator, share its weights, serve until ``stop`` is set."""
    sys.path.insert(0, example_dir)
    import torch

    import echo_digit
    from envhub.backends.hf import HFBackend
    from envhub.service import RolloutService, ServerThread

    torch.set_num_threads(1)  # one core generates; the trainer's process has the other
    echo_digit.register()
    backend = HFBackend(model_path, max_batch_size=32)
    params = [p.data for p in backend.model.parameters()]
    for p in params:
        p.share_memory_()  # in place: the model samples with these very tensors
    service = RolloutService(backend.tokenizer, backends=[backend], init_workers=64, run_workers=512,
                             eval_workers=64, metrics_window_s=3600.0)
    with ServerThread(service) as srv:
        out.put({"url": srv.url, "params": params, "pad_token_id": backend.pad_token_id})
        stop.wait()


class GeneratorProcess:
    """``with GeneratorProcess(model_path) as gen:`` -- ``gen.url`` serves rollouts, ``gen.parameters`` are the
    generator's weights (shared memory; write them only while the service is paused), ``gen.pad_token_id``."""

    def __init__(self, model_path: str | Path, *, start_timeout_s: float = 300.0):
        self.model_path, self.start_timeout_s = str(model_path), start_timeout_s
        self.url = ""
        self.parameters: list[Any] = []
        self.pad_token_id = 0

    def __enter__(self) -> GeneratorProcess:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")  # a fresh interpreter: no threads or locks inherited from the trainer
        out, self._stop = ctx.Queue(), ctx.Event()
        self._proc = ctx.Process(target=_serve, name="envhub-generator", daemon=True,
                                 args=(self.model_path, str(Path(__file__).resolve().parent), out, self._stop))
        self._proc.start()
        try:
            ready = out.get(timeout=self.start_timeout_s)
        except Exception as e:
            self._proc.kill()
            raise RuntimeError(f"the generator process did not start within {self.start_timeout_s:.0f} s "
                               f"(exit code {self._proc.exitcode}); its error is above") from e
        self.url, self.parameters, self.pad_token_id = ready["url"], ready["params"], ready["pad_token_id"]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.parameters = []  # drop our handles on the shared storage before the child frees it
        self._stop.set()
        self._proc.join(timeout=30)
        if self._proc.is_alive():  # a lifespan shutdown that hangs must not hang the run
            self._proc.kill()
            self._proc.join(timeout=10)
