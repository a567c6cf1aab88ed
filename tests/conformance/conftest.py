"""Fixtures of the ProRL conformance tier: a real rollout server on loopback (uvicorn, the app ``envhub serve``
runs) whose backend is the envs' golden players with distinct, known logprobs, so the tests can tell whether each
token's logprob reaches the client's batch at the right place."""
from __future__ import annotations

import asyncio
import sys
import threading
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # prorl_clients, prorl_fixtures, whatever the import mode

from prorl_fixtures import logprob_of  # noqa: E402


@pytest.fixture
def prorl_server(tiny_tokenizer):
    """``start(**RolloutService kwargs) -> (ServerThread, backend)``; servers are stopped at the end of the test."""
    from envhub.backends.base import Generation
    from envhub.service import RolloutService, ServerThread
    from envhub.service.golden import GoldenBackend

    class LogprobGolden(GoldenBackend):
        """The golden players (real tokenizer), reporting :func:`logprob_of` instead of zeros, recording the
        sampling params each call got, and able to hold calls (``hold.clear()``: turns wait until it is set) so a test can
        cancel a job mid-run. A test stand-in for an LLM server, which cannot run here at speed."""

        def __init__(self):
            super().__init__()
            self.seen: list = []
            self.hold = threading.Event()
            self.hold.set()
            self.unwind_s = 0.0  # how long a cancelled call takes to stop (a real HTTP call to vLLM is not instant)

        async def generate(self, prompt_ids, params, *, session_id=""):
            self.seen.append(params)
            try:
                while not self.hold.is_set():  # the server's loop runs in another thread: poll, never block it
                    await asyncio.sleep(0.02)
            except asyncio.CancelledError:
                await asyncio.shield(asyncio.sleep(self.unwind_s))
                raise
            gen = await super().generate(prompt_ids, params, session_id=session_id)
            return Generation(gen.token_ids, [logprob_of(i, t) for i, t in enumerate(gen.token_ids)],
                              gen.finish_reason)

    servers = []

    def start(**kw):
        backend = LogprobGolden()
        service = RolloutService(tiny_tokenizer, backends=[backend], **kw)
        srv = ServerThread(service).start()
        servers.append(srv)
        return srv, backend

    yield start
    for srv in servers:
        srv.stop()
