"""Gemini's own API (what Gemini CLI and ``google-genai`` speak): ``POST /v1beta/models/{model}:generateContent``,
``:streamGenerateContent`` (SSE with ``?alt=sse``; without it one JSON array of the same chunks, as Google's server
answers) and ``:countTokens`` (also under ``/v1/models/``). The key comes as ``x-goog-api-key`` (or ``?key=``).

How a request becomes chat messages (there is no vLLM route to follow here; docs/decisions.md, "#28 item 9"):

* ``systemInstruction`` (a string or a Content) is the system message, its text parts joined with ``"\\n"``;
* a ``user`` turn's ``functionResponse`` parts become ``tool`` messages where they stand (before the turn's text, as
  the Anthropic route orders ``tool_result`` blocks); the tool message's text is ``response["output"]`` when that is
  the response's only field and a string (Gemini CLI's shape), else the response as compact JSON; a response without
  an ``id`` takes the id of the call of the same name in the model turn before it;
* a ``model`` turn is an assistant message: its text parts concatenated (a streamed reply arrives in pieces), its
  ``functionCall`` parts the tool calls (``args`` as JSON arguments); ``thought`` parts are dropped (the gateway
  never issues them) and ``thoughtSignature`` is ignored;
* ``tools[].functionDeclarations`` are function tools: ``parametersJsonSchema`` as is, or ``parameters`` (Google's
  OpenAPI subset) with its upper-case ``type`` names lower-cased to JSON Schema's; a declaration's ``response`` /
  ``responseJsonSchema`` (the return schema) is not rendered: the chat tool format has no field for it.

What cannot be honoured is refused with Google's 400 (``{"error": {"code", "message", "status"}}``), never dropped:
another part kind (images, files, code execution), hosted tools (``googleSearch``, ``codeExecution``...), a forced
function-calling mode (``ANY``), ``candidateCount`` > 1, JSON mode, penalties, ``cachedContent``, unknown fields.
``safetySettings`` are accepted and not applied (the gateway filters nothing). The reply's ``functionCall`` parts
carry ids the gateway minted, but chain matching never depends on them: Gemini CLI and other clients may drop or
re-mint them, and :mod:`envhub.gateway.matching` then finds the parent by the issued call's name and arguments.
"""
from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import parse_qs

from envhub.gateway.core import ChatRequest, ChatResult
from envhub.gateway.dialects import chat, sampling
from envhub.gateway.messages import BadRequest, tool_call

NAME = "gemini"
PREFIXES = ("/v1beta/models/", "/v1/models/", "/v1alpha/models/")
METHODS = ("generateContent", "streamGenerateContent", "countTokens")
_ROUTE = re.compile(r"^/v1(?:beta|alpha)?/models/([^/:]+):([A-Za-z]+)$")
_TOP = ("contents", "systemInstruction", "tools", "toolConfig", "generationConfig", "safetySettings", "model")
# generationConfig fields honoured; the other documented ones are refused by name (they would change the reply)
_GEN = {"temperature": "temperature", "topP": "top_p", "topK": "top_k", "seed": "seed",
        "maxOutputTokens": "maxOutputTokens", "stopSequences": "stopSequences"}
_GEN_CHECKED = ("candidateCount", "responseMimeType", "responseModalities", "thinkingConfig")
_PART_EXTRAS = ("thought", "thought_signature", "part_metadata", "media_resolution", "video_metadata")


def route(path: str) -> tuple[str, str] | None:
    """``(model, method)`` of a Gemini model route, or ``None`` for any other path."""
    m = _ROUTE.match(path)
    return (m.group(1), m.group(2)) if m else None


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name)


def _get(d: dict[str, Any], name: str) -> Any:
    """A field by its camelCase name or its snake_case one (Google's JSON parser takes both)."""
    return d[name] if name in d else d.get(_snake(name))


def _or(v: Any, default: Any) -> Any:
    """``v``, or ``default`` when absent (``None``): an empty list where an object belongs is an error, not a default."""
    return default if v is None else v


def _known(d: dict[str, Any], names: tuple[str, ...], where: str) -> None:
    allowed = set(names) | {_snake(n) for n in names}
    for k in d:
        if k not in allowed:
            raise BadRequest(f'Invalid JSON payload received. Unknown name "{k}" at \'{where}\': Cannot find field '
                             f"(this gateway serves {', '.join(names)})", param=f"{where}.{k}".lstrip("."))


def _obj(v: Any, where: str) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise BadRequest(f"{where} must be an object, got {type(v).__name__}", param=where)
    return v


def _text(part: dict[str, Any], where: str) -> str:
    if not isinstance(part["text"], str):
        raise BadRequest(f"{where}.text must be a string", param=f"{where}.text")
    return part["text"]


def _system(v: Any) -> str:
    if v is None or isinstance(v, str):
        return v or ""
    parts = _obj(v, "systemInstruction").get("parts")
    if not isinstance(parts, list):
        raise BadRequest("systemInstruction.parts must be a list", param="systemInstruction.parts")
    texts = []
    for j, p in enumerate(parts):
        where = f"systemInstruction.parts[{j}]"
        if not isinstance(p, dict) or "text" not in p:
            raise BadRequest(f"{where} must be a text part (systemInstruction takes text only)", param=where)
        texts.append(_text(p, where))
    return "\n".join(texts)


def _response_text(response: Any, where: str) -> str:
    if response is None:
        return ""
    response = _obj(response, f"{where}.response")
    if list(response) == ["output"] and isinstance(response["output"], str):
        return response["output"]
    return json.dumps(response, ensure_ascii=False, separators=(",", ":"))


def _turn(c: Any, i: int, pending: list[list[str]]) -> list[dict[str, Any]]:
    """One Content as chat messages; ``pending`` holds the (name, id) of the last model turn's calls."""
    c = _obj(c, f"contents[{i}]")
    role = c.get("role") or "user"
    if role not in ("user", "model", "function"):
        raise BadRequest(f"contents[{i}].role must be user or model, got {role!r}", param=f"contents[{i}].role")
    parts = c.get("parts")
    if not isinstance(parts, list) or not parts:
        raise BadRequest(f"contents[{i}].parts must be a non-empty list", param=f"contents[{i}].parts")
    texts, calls, out = [], [], []
    for j, p in enumerate(parts):
        where = f"contents[{i}].parts[{j}]"
        p = _obj(p, where)
        kinds = [k for k in p if _snake(k) not in _PART_EXTRAS]  # what the part holds, besides its annotations
        if p.get("thought") is True:
            continue  # a thought summary: the gateway never issues one, and it is not part of the conversation
        kind = kinds[0] if len(kinds) == 1 else None
        if kind == "text":
            texts.append(_text(p, where))
        elif kind in ("functionCall", "function_call") and role == "model":
            fc = _obj(p[kind], f"{where}.functionCall")
            name, args = fc.get("name"), _or(fc.get("args"), {})
            if not isinstance(name, str) or not name or not isinstance(args, dict):
                raise BadRequest(f"{where}.functionCall needs a name and args (an object)", param=where)
            calls.append(tool_call(str(fc.get("id") or ""), name, args))
        elif kind in ("functionResponse", "function_response") and role in ("user", "function"):
            fr = _obj(p[kind], f"{where}.functionResponse")
            name, call_id = fr.get("name"), fr.get("id")
            if not isinstance(name, str) or not name:
                raise BadRequest(f"{where}.functionResponse.name is required", param=where)
            if fr.get("parts"):
                raise BadRequest(f"{where}.functionResponse.parts (media in a function response) is not served: "
                                 "this gateway serves text only", param=f"{where}.functionResponse.parts")
            if not call_id:  # the id of the call it answers (a client may omit or re-mint ids)
                hit = next((e for e in pending if e[0] == name), None)
                call_id = hit[1] if hit else ""
                if hit:
                    pending.remove(hit)
            out.append({"role": "tool", "tool_call_id": str(call_id), "name": name,
                        "content": _response_text(fr.get("response"), where)})
        else:
            what = kind or (", ".join(kinds) if kinds else "an empty")
            raise BadRequest(f"{where} is {what!r} part{' in a ' + role + ' turn' if kind else ''}: this gateway "
                             "serves text, functionCall (model turns) and functionResponse (user turns) parts; "
                             "send other content as text", param=where)
    if role == "model":
        msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
        if calls:
            msg["tool_calls"] = calls
        pending[:] = [[c["function"]["name"], c["id"]] for c in calls]
        return [msg]
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    contents = _get(body, "contents")
    if isinstance(contents, dict):
        contents = [contents]
    if not isinstance(contents, list) or not contents:
        raise BadRequest("contents must be a non-empty list", param="contents")
    out: list[dict[str, Any]] = []
    system = _system(_get(body, "systemInstruction"))
    if system:
        out.append({"role": "system", "content": system})
    pending: list[list[str]] = []
    for i, c in enumerate(contents):
        out += _turn(c, i, pending)
    return out


def _schema(s: Any) -> Any:
    """Google's OpenAPI-subset Schema as JSON Schema: ``"type": "OBJECT"`` -> ``"object"``, recursively."""
    if isinstance(s, list):
        return [_schema(x) for x in s]
    if not isinstance(s, dict):
        return s
    return {k: (v.lower() if k == "type" and isinstance(v, str) else _schema(v)) for k, v in s.items()}


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = _get(body, "tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        t = _obj(t, f"tools[{i}]")
        hosted = [k for k in t if _snake(k) != "function_declarations"]
        if hosted:
            raise BadRequest(f"tools[{i}].{hosted[0]} is a hosted tool, which this gateway does not serve (a local "
                             "model cannot run it): send functionDeclarations only", param=f"tools[{i}].{hosted[0]}")
        decls = _get(t, "functionDeclarations")
        decls = [] if decls is None else decls
        if not isinstance(decls, list):
            raise BadRequest(f"tools[{i}].functionDeclarations must be a list", param=f"tools[{i}]")
        for j, d in enumerate(decls):
            where = f"tools[{i}].functionDeclarations[{j}]"
            d = _obj(d, where)
            params, schema = _get(d, "parameters"), _get(d, "parametersJsonSchema")
            if params is not None and schema is not None:
                raise BadRequest(f"{where}: send parameters or parametersJsonSchema, not both", param=where)
            fn = {"name": d.get("name"), "description": d.get("description"),
                  "parameters": schema if schema is not None else _schema(params)}
            if not isinstance(fn["name"], str) or not fn["name"]:
                raise BadRequest(f"{where}.name is required", param=f"{where}.name")
            out.append(chat.vllm_tool(fn, None, where))
    return out or None


def _function_mode(body: dict[str, Any]) -> str:
    config = _get(body, "toolConfig")
    if config is None:
        return "AUTO"
    fcc = _or(_get(_obj(config, "toolConfig"), "functionCallingConfig"), {})
    mode = str(_obj(fcc, "toolConfig.functionCallingConfig").get("mode") or "AUTO").upper()
    if mode not in ("AUTO", "NONE", "MODE_UNSPECIFIED") or _get(fcc, "allowedFunctionNames"):
        raise BadRequest(f"toolConfig.functionCallingConfig {json.dumps(fcc)} is not supported: the model samples "
                         "freely and the gateway parses what it wrote (use mode AUTO or NONE)",
                         param="toolConfig.functionCallingConfig")
    return mode


def _sampling(body: dict[str, Any]) -> tuple[Any, bool]:
    config = _obj(_or(_get(body, "generationConfig"), {}), "generationConfig")
    _known(config, tuple(_GEN) + _GEN_CHECKED, "generationConfig")
    count = _get(config, "candidateCount")
    if count not in (None, 1):
        raise BadRequest(f"generationConfig.candidateCount={count!r} is not supported: the gateway records one "
                         "sampled candidate per call; send separate requests", param="generationConfig.candidateCount")
    mime = _get(config, "responseMimeType")
    if mime not in (None, "", "text/plain"):
        raise BadRequest(f"generationConfig.responseMimeType={mime!r} is not supported (no constrained decoding): "
                         "use text/plain", param="generationConfig.responseMimeType")
    modalities = _get(config, "responseModalities")
    if modalities not in (None, [], ["TEXT"], ["text"]):
        raise BadRequest("generationConfig.responseModalities: this gateway answers TEXT only",
                         param="generationConfig.responseModalities")
    flat = {wire: _get(config, name) for name, wire in _GEN.items()}
    stop = flat.get("stopSequences")
    if stop is not None and not isinstance(stop, list):  # dialects.sampling would also take a lone string
        raise BadRequest("generationConfig.stopSequences must be a list of strings",
                         param="generationConfig.stopSequences")
    try:
        return sampling({k: v for k, v in flat.items() if v is not None}, ("maxOutputTokens",), "stopSequences")
    except BadRequest as e:  # name the field as the client spelled it
        name = next((n for n, w in _GEN.items() if w == e.param), e.param)
        raise BadRequest(f"generationConfig.{str(e).replace(str(e.param), str(name), 1)}",
                         param=f"generationConfig.{name}") from None


def parse(body: dict[str, Any], model: str, *, stream: bool = False, counting: bool = False) -> ChatRequest:
    """A ``generateContent`` body (or a ``countTokens`` one: ``contents``, or a whole ``generateContentRequest``)
    as a :class:`ChatRequest`; :class:`BadRequest` names the field to change."""
    if counting:
        inner = _get(body, "generateContentRequest")
        _known(body, ("contents", "generateContentRequest"), "")
        if inner is not None:
            body = _obj(inner, "generateContentRequest")
    if _get(body, "cachedContent") is not None:
        raise BadRequest("cachedContent is not supported: send the contents", param="cachedContent")
    _known(body, _TOP, "")
    params, given = _sampling(body)
    tools = None if _function_mode(body) == "NONE" else _tools(body)
    return ChatRequest(NAME, _messages(body), tools, params, given, stream, model)


def _parts(r: ChatResult) -> list[dict[str, Any]]:
    parts: list[dict[str, Any]] = [{"text": r.text}] if r.text or not r.tool_calls else []
    for c in r.tool_calls:
        try:
            args = json.loads(c["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            args = {}
        parts.append({"functionCall": {"id": c["id"], "name": c["function"]["name"],
                                       "args": args if isinstance(args, dict) else {"value": args}}})
    return parts


def _usage(r: ChatResult) -> dict[str, int]:
    return {"promptTokenCount": r.prompt_tokens, "candidatesTokenCount": r.completion_tokens,
            "totalTokenCount": r.prompt_tokens + r.completion_tokens}


def _chunk(r: ChatResult, req: ChatRequest, parts: list[dict[str, Any]], last: bool) -> dict[str, Any]:
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    out: dict[str, Any] = {"candidates": [cand]}
    if last:
        cand["finishReason"] = "MAX_TOKENS" if r.finish_reason == "length" else "STOP"
        out["usageMetadata"] = _usage(r)
    out.update(modelVersion=req.model or "envhub", responseId=r.call.call_id)
    return out


def reply(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
    return _chunk(r, req, _parts(r), True)


def chunks(r: ChatResult, req: ChatRequest) -> list[dict[str, Any]]:
    """The streamed reply: one chunk per part (text first, then each function call), the last with the finish
    reason and ``usageMetadata`` (synthetic streaming: one backend call, then the chunks in one burst)."""
    parts = _parts(r)
    return [_chunk(r, req, [p], i == len(parts) - 1) for i, p in enumerate(parts)]


def stream(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> list[bytes]:
    return [b"data: " + json.dumps(c, ensure_ascii=False, separators=(",", ":")).encode() + b"\r\n\r\n"
            for c in chunks(r, req)]


def too_long(tokens: int, limit: int) -> str:
    """Gemini's own words for a prompt over the context."""
    return f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({limit})."


STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          409: "ABORTED", 410: "FAILED_PRECONDITION", 429: "RESOURCE_EXHAUSTED", 499: "CANCELLED", 500: "INTERNAL",
          501: "UNIMPLEMENTED", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}


def error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """Google's error body (``google.rpc.Status`` as JSON): the HTTP code, the message, the canonical status name
    (any other 4xx ``INVALID_ARGUMENT``... ``FAILED_PRECONDITION``, any other 5xx ``INTERNAL``)."""
    name = STATUS.get(status) or ("INVALID_ARGUMENT" if 400 <= status < 500 else "INTERNAL")
    return {"error": {"code": status, "message": message, "status": name}}


class _Call:
    """The dialect of one generate call, for the app's model-call path (parse, reply, stream): this route's model
    and stream form. The JSON-array stream is a plain JSON reply (``ChatRequest.stream`` false) holding the chunks."""

    def __init__(self, model: str, method: str, alt: str):
        self.model, self.streaming, self.sse = model, method == "streamGenerateContent", alt == "sse"

    def parse(self, body: dict[str, Any]) -> ChatRequest:
        return parse(body, self.model, stream=self.streaming and self.sse)

    def reply(self, r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> Any:
        # streamGenerateContent without alt=sse: Google answers one JSON array of the stream's chunks
        return chunks(r, req) if self.streaming else reply(r, req, body)

    stream = staticmethod(stream)


async def serve(app: Any, send: Any, receive: Any, scope: dict[str, Any], path: str, body: dict[str, Any],
                key: str | None) -> None:
    """Answer a POST on a Gemini route (``app`` is the :class:`~envhub.gateway.app.GatewayApp`)."""
    model, method = route(path) or ("", "")
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    key = key or (query.get("key") or [None])[0]
    if method == "countTokens":
        session = app._session(key)
        req = parse(body, model, counting=True)
        session.touch()
        payload = json.dumps({"totalTokens": app.gw.count_tokens(req)}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        return
    if method not in METHODS:
        raise BadRequest(f"models/{model}:{method} is not served (served: {', '.join(METHODS)})", status=404)
    await app._model_call(send, receive, _Call(model, method, (query.get("alt") or [""])[0]), body, key)
