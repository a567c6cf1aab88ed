"""The controller's signal path against a live vLLM (the ``vllm`` tier: ``make test-vllm``): the CPU build in
``.venv-vllm`` serves the tests' tiny model with room for 2 sequences; a rollout service with that server as its
backend scrapes ``GET /metrics`` each tick (the server paced: ``paced_sampler.py``). At rest the queue is empty; with 8 long completions sent straight to the
server, the controller reads them waiting (``vllm:num_requests_waiting``), at most 2 running and a KV-cache usage,
and cuts the limit on the queue."""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import httpx
import pytest

from envhub.service.controller import Knobs

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from vllm_server import VLLMServer, paced, require_vllm_tier  # noqa: E402

# one worker for the module under pytest-xdist: its vLLM server starts once
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group(__name__)]


class TwoSeqServer(VLLMServer):
    def argv(self) -> list[str]:
        return super().argv() + ["--max-num-seqs", "2"]


@pytest.fixture(scope="module")
def vllm(request, tmp_path_factory):
    """Run only when asked (``ENVHUB_REQUIRE_VLLM=1`` or ``-m vllm``), as the other vLLM tier tests."""
    require_vllm_tier(request)
    from envhub.testing.models import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("vllm-ctl"), template="chatml", seed=0)
    # paced (10 ms a sampling step, logits untouched): unpaced, the tiny model finished the 8 completions before a
    # tick on a busy host could read the queue (an empty queue read in two CI runs of four at load ~16-22); paced,
    # the 6 waiting ones wait at least 15 s each
    with TwoSeqServer(model, **paced(0.01)) as s:
        yield s


async def test_the_controller_reads_a_live_vllm_queue_and_cuts_on_it(vllm, serve):
    srv = serve(backends=[vllm.url], run_workers=8, controller=Knobs(start=8, interval_s=600, patience=1))
    ctl = srv.service.controller
    d = srv.call(ctl.tick())
    assert ctl.last.waiting == 0 and ctl.last.running == 0 and ctl.last.kv_usage is not None, ctl.last
    assert d.action == "hold" and ctl.scrape_errors == 0, d

    async def long_call(client: httpx.AsyncClient) -> None:
        await client.post("/v1/completions", json={"model": vllm.served_name, "prompt": [1, 2, 3, 4] * 20,
                                                   "max_tokens": 1500, "ignore_eos": True})

    async with httpx.AsyncClient(base_url=vllm.url, timeout=600) as client:
        calls = [asyncio.ensure_future(long_call(client)) for _ in range(8)]
        deadline = time.monotonic() + 120
        while True:  # the scheduler takes 2; the rest wait
            d = srv.call(ctl.tick())
            if ctl.last.waiting and ctl.last.waiting >= 4:
                break
            assert time.monotonic() < deadline, ctl.last
            await asyncio.sleep(0.2)
        assert ctl.last.running <= 2 and ctl.last.kv_usage > 0, ctl.last
        assert (d.action, d.signal, d.new) == ("decrease", "queue", 5), d
        assert "waiting" in d.reason
        for c in calls:
            c.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
