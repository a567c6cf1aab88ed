"""The gateway renders what vLLM's server renders (#28, item 2): the ``vllm`` tier.

A policy trained through the gateway is deployed behind vLLM's OpenAI server; if the two render one request to
different prompt ids, the policy meets prompts in deployment it never saw in training. Here the same requests --
chat with ten tools (``"strict": false``, a tool without description, one without parameters) and tool-call history,
Responses with function calls, Anthropic Messages with ``tool_use`` / ``tool_result`` -- go through vLLM's own
request classes and rendering (vLLM 0.32's GPU-less render server, ``python -m
vllm.entrypoints.launchers.render.entry``: ``/v1/chat/completions/render``, ``/v1/responses/render``,
``/v1/messages/render``, the code vLLM's own chat, responses and messages routes delegate to) and through the
gateway over HTTP, for the tiny model's ChatML and Llama-3.1 templates and SmolLM2's template (no tool support);
the prompt ids must be identical.

Runs with the tier (``make test-vllm``, ``ENVHUB_REQUIRE_VLLM=1``, or ``pytest -m vllm``); needs ``.venv-vllm``
(``scripts/setup-vllm.sh``).
"""
from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from pathlib import Path

import httpx
import pytest
from gw_helpers import Recording

from envhub.backends.scripted import ScriptedBackend
from envhub.env import Action
from envhub.gateway import Gateway, GatewayThread

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "backends"))
from vllm_server import VLLMServer, require_vllm_tier, vllm_python  # noqa: E402

# one worker per module under pytest-xdist: its vLLM server (a module fixture) starts once, not once per worker
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group(__name__)]


class RenderServer(VLLMServer):
    """vLLM's GPU-less render server: its request classes and chat rendering, no engine."""

    def argv(self) -> list[str]:
        return [str(vllm_python()), "-m", "vllm.entrypoints.launchers.render.entry", "--model", self.model_dir,
                "--served-model-name", self.served_name, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--enable-auto-tool-choice",
                "--tool-call-parser", "hermes"]

    def render(self, route: str, body: dict) -> list[int]:
        req = urllib.request.Request(self.url + route + "/render", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())["token_ids"]


@pytest.fixture(scope="module")
def vllm_ready(request):
    require_vllm_tier(request)


def smollm2_template_model(tmp: Path) -> Path:
    """The tiny model with SmolLM2-135M-Instruct's chat template (ChatML that ignores ``tools``): same tokenizer
    family, no 260 MB conversion."""
    from envhub.testing.chat_templates import SMOLLM2_TEMPLATE
    from envhub.testing.models import build_tiny_model

    src = build_tiny_model(template="chatml")
    out = tmp / "tiny-smollm2-template"
    shutil.copytree(src, out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["chat_template"] = SMOLLM2_TEMPLATE
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


@pytest.fixture(scope="module", params=["chatml", "llama3", "smollm2"])
def pair(request, vllm_ready, tmp_path_factory):
    """(vLLM's render server, the gateway) for one template."""
    from envhub.testing.models import build_tiny_model, load_tokenizer

    model = (smollm2_template_model(tmp_path_factory.mktemp("m")) if request.param == "smollm2"
             else build_tiny_model(template=request.param))
    backend = Recording(ScriptedBackend(lambda task, messages: Action("ok")))
    gw = Gateway(backend, load_tokenizer(model))
    with RenderServer(model, served_name="tiny", max_model_len=4096) as vllm, GatewayThread(gw) as srv:
        yield request.param, vllm, gw, srv, backend


def gateway_prompt(gw, srv, backend, route: str, body: dict) -> list[int]:
    s = gw.start_session("parity")
    r = httpx.post(srv.url + route, json=body, headers={"Authorization": f"Bearer {s.api_key}"}, timeout=60)
    assert r.status_code == 200, r.text
    return backend.calls[-1][0]


def tools(flat: bool = False) -> list[dict]:
    """Ten function tools as Codex CLI sends them (``strict: false``), one without a description, one without
    parameters, properties in an order that is not sorted."""
    out = []
    for i in range(10):
        fn: dict = {"name": f"tool_{i}", "description": f"Tool number {i}: does thing {i}.",
                    "parameters": {"type": "object", "properties": {"zeta": {"type": "string"},
                                                                    "alpha": {"type": "integer"}},
                                   "required": ["zeta"], "additionalProperties": False},
                    "strict": False}
        if i == 3:
            del fn["description"]
        if i == 7:
            del fn["parameters"]
        out.append({"type": "function", **fn} if flat else {"type": "function", "function": fn})
    return out


CHAT = {"model": "tiny", "messages": [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "List the files, then count them."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "tool_0", "arguments": '{"zeta": "ls", "alpha": 2}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "a.txt\nb.txt"},
    {"role": "assistant", "content": "Two files."},
    {"role": "user", "content": [{"type": "text", "text": "Now "}, {"type": "text", "text": "count lines."}]}],
    "tools": tools()}

RESPONSES = {"model": "tiny", "instructions": "You are a coding agent.", "input": [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List the files."}]},
    {"type": "function_call", "call_id": "call_1", "name": "tool_0", "arguments": '{"zeta": "ls"}'},
    {"type": "function_call_output", "call_id": "call_1", "output": "a.txt\nb.txt"},
    {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Two files."}]},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count lines."}]}],
    "tools": tools(flat=True)}

ANTHROPIC = {"model": "tiny", "max_tokens": 64, "system": [{"type": "text", "text": "You are a coding agent."}],
             "messages": [
                 {"role": "user", "content": "List the files."},
                 {"role": "assistant", "content": [{"type": "text", "text": "Listing."},
                                                   {"type": "tool_use", "id": "toolu_1", "name": "tool_0",
                                                    "input": {"zeta": "ls", "alpha": 2}}]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                                              {"type": "text", "text": "Count lines."}]}],
             "tools": [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                        "input_schema": t["function"].get("parameters", {"type": "object"})} for t in tools()]}

CASES = {"chat": ("/v1/chat/completions", CHAT), "responses": ("/v1/responses", RESPONSES),
         "anthropic": ("/v1/messages", ANTHROPIC),
         "chat-no-tools": ("/v1/chat/completions", {k: v for k, v in CHAT.items() if k != "tools"} | {
             "messages": [m for m in CHAT["messages"] if m["role"] in ("system", "user")]})}


@pytest.mark.parametrize("case", list(CASES))
def test_the_gateway_renders_the_prompt_ids_vllms_server_renders(pair, case):
    template, vllm, gw, srv, backend = pair
    route, body = CASES[case]
    want = vllm.render(route, body)
    got = gateway_prompt(gw, srv, backend, route, body)
    if got != want:
        tok = gw.tokenizer
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        raise AssertionError(f"{template}/{case}: gateway {len(got)} ids, vLLM {len(want)}; first difference at "
                             f"{at}:\n  gateway: {tok.decode(got[at:at + 40])!r}\n  vLLM:    "
                             f"{tok.decode(want[at:at + 40])!r}")


def test_the_system_tool_list_option_is_the_other_rendering(pair):
    """SmolLM2's template shows no tools: by default the gateway renders none (as vLLM); ``system_tool_list=True``
    (``envhub gateway --system-tool-list``) appends them to the system message -- and then no longer matches vLLM,
    which is what shows this test can fail."""
    template, vllm, gw, _, _ = pair
    if template != "smollm2":
        pytest.skip("only a template without tool support differs")
    backend = Recording(ScriptedBackend(lambda task, messages: Action("ok")))
    listed = Gateway(backend, gw.tokenizer, system_tool_list=True)
    with GatewayThread(listed) as srv:
        got = gateway_prompt(listed, srv, backend, "/v1/chat/completions", CHAT)
    assert got != vllm.render("/v1/chat/completions", CHAT)
    assert "tool_9" in gw.tokenizer.decode(got)
