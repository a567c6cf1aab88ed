"""AReaL 1.0.4's proxy (``areal.experimental.openai.proxy.proxy_rollout_server``), unpatched, for
``benchmarks/gateway_throughput.py``: run in ``.venv-areal`` (``make areal-venv``), it starts the proxy's own
``main()`` on loopback in this process and configures it the way AReaL's controller does, through its
``/create_engine`` and ``/call initialize`` routes, with :class:`StandInEngine`; then prints
``{"areal": URL}`` (the benchmark's ready line).

The stand-in engine answers every call at once with one fixed tool call (the same text the envhub benchmark's
scripted policy samples, tokenized by the same tokenizer, ended by EOS), logprob -0.5, version 0: as with envhub's
scripted backend, only the proxy is measured. AReaL's defaults otherwise (``chat_template_type="hf"``: its documented
default, a full render of the conversation per call; its tool-call parsers need sglang or vLLM, absent on CPU, so the
reply is text and the client answers with a user turn).

    .venv-areal/bin/python benchmarks/areal_proxy.py --tokenizer smollm2
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from types import SimpleNamespace
from typing import Any

ADMIN = "areal-admin"
REPLY = 'Running step 1.\n<tool_call>\n{"name": "exec_command", "arguments": {"cmd": "sed -n 1,+40p src/module_1.py"}}' \
        "\n</tool_call>"


class StandInEngine:
    """What AReaL's proxy needs of an inference engine: ``config`` fields, ``initialize``, ``destroy``,
    ``agenerate(ModelRequest) -> ModelResponse``."""

    def __init__(self, tokenizer_path: str, reply_ids: list[int]):
        self.reply = list(reply_ids)
        self.config = SimpleNamespace(
            tokenizer_path=tokenizer_path, lora_name=None, seed=1,
            agent=SimpleNamespace(tool_call_parser="qwen25", reasoning_parser="qwen3", engine_max_tokens=None,
                                  chat_template_type="hf", session_timeout_seconds=3600, admin_api_key=ADMIN))

    def initialize(self, *args: Any, **kwargs: Any) -> None:
        return None

    def destroy(self) -> None:
        return None

    def get_version(self) -> int:
        return 0

    async def agenerate(self, req: Any) -> Any:
        from areal.api import ModelResponse

        n = len(self.reply)
        return ModelResponse(input_tokens=list(req.input_ids), output_tokens=list(self.reply),
                             output_logprobs=[-0.5] * n, output_versions=[0] * n, stop_reason="stop",
                             tokenizer=getattr(req, "tokenizer", None))


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def _configure(url: str, tokenizer_dir: str, reply_ids: list[int]) -> None:
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            time.sleep(0.1)
    _post(url + "/create_engine", {"engine": "areal_proxy.StandInEngine",
                                   "init_kwargs": {"tokenizer_path": tokenizer_dir, "reply_ids": reply_ids}})
    _post(url + "/call", {"method": "initialize"})
    print(json.dumps({"areal": url}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokenizer", default="smollm2")
    args = ap.parse_args()
    from envhub.testing.models import load_tokenizer, resolve_model

    tok = load_tokenizer(resolve_model(args.tokenizer))
    tokenizer_dir = tempfile.mkdtemp(prefix="areal-tok-")
    tok.save_pretrained(tokenizer_dir)  # AReaL loads its tokenizer by path (AutoTokenizer)
    reply_ids = tok.encode(REPLY, add_special_tokens=False) + [tok.eos_token_id]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from areal.experimental.openai.proxy import proxy_rollout_server as server

    threading.Thread(target=_configure, args=(f"http://127.0.0.1:{port}", tokenizer_dir, reply_ids),
                     daemon=True).start()
    sys.argv = [sys.argv[0], "--host", "127.0.0.1", "--port", str(port), "--experiment-name", "bench",
                "--trial-name", "t", "--role", "proxy", "--worker-index", "0",
                "--nfs-record-root", tempfile.mkdtemp(prefix="areal-nr-")]
    server.main()


if __name__ == "__main__":
    main()
