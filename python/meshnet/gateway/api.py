"""The OpenAI-compatible HTTP API (FastAPI on Starlette, served by uvicorn in main.py).

  GET  /v1/models                certified models this gateway serves, with their coverage
  POST /v1/chat/completions      chat, streaming (SSE) or not
  POST /v1/completions           plain completions, streaming or not
  GET  /metrics                  Prometheus text (GatewayMetrics)
  GET  /healthz                  liveness

Every /v1 call checks the API key first (401), then bounds and parses the body (413/400), then
the model (404); a generation then takes one of its key's concurrent slots (429), and only then
is its prompt measured (400 past max_prompt_chars), rendered and tokenized, at most
`prompt_builders` at a time across all keys, before it asks the tracker for a route: a key at
its limit costs the gateway nothing but the refusal (issue 35, finding 5). A streaming
response starts only once the first token is in, so the route's refusals (429
RESOURCE_EXHAUSTED with Retry-After, 503 no coverage, 504 a deadline) are real HTTP statuses; a
failure after that ends the stream with an OpenAI error event. A client that goes away, from
the moment its body is read, cancels its route (CANCEL along the chain: every hop frees its KV).
Prompts are built here: the GGUF's chat template (jinja2), and the GGUF's tokenizer, with no
torch in the process. A chat with active tools (issue 33) has a tool_use.ToolPlan: its prompt
renders the tools, its text keeps the family's marker tokens, and its answer's tool calls are
parsed (whole, or streamed as tool-call deltas); without one, nothing here changes. Forced tool
calls and JSON response formats are sampled under a grammar (constrained.py) on the last hop.
Size: about 500 lines, because the two generation endpoints are one contract (the same checks in
the same order) and read best together; request models are in schema.py, the generation in
generation.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import secrets
import time
import uuid
from typing import AsyncIterator, Optional, Sequence

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from meshnet.client.session import GenerationParams, MeshnetError
from meshnet.client.text import IncrementalText
from meshnet.gateway import constrained, prompts, schema, tool_use
from meshnet.gateway.errors import ApiError, bad_request, from_status
from meshnet.gateway.keys import ApiKey, KeyRing
from meshnet.gateway.metrics import GatewayMetrics
from meshnet.wire import seam as t


@dataclasses.dataclass(frozen=True)
class ServedModel:
    name: str  # the tracker's certified model name, and the API's model id
    tokenizer: object  # GgufTokenizer: encode, decode, chat_template, bos/eos tokens, stop_token_ids


@dataclasses.dataclass(frozen=True)
class GatewayConfig:
    default_max_tokens: int = 256
    max_body_bytes: int = 1 << 20  # request bodies past this are refused (413) before they are read
    first_token_timeout: float = 120.0
    stall_timeout: float = 60.0
    anonymous_client_id: str = "gateway"  # the ledger's client when no keys are configured
    max_prompt_chars: int = 256 * 1024  # prompt text past this is refused (400) before it is rendered or tokenized
    prompt_builders: int = 2  # prompts rendered and tokenized at once (on threads); more wait their turn


@dataclasses.dataclass
class _Piece:
    text: str
    tokens: list  # SampledToken(s) the text came from (for logprobs)


class _Generation:
    """One request's run: prompt -> route -> text pieces; owns the key slot and the stream."""

    def __init__(self, app: "Gateway", served: ServedModel, key: Optional[ApiKey], prompt_ids: list[int],
                 params: GenerationParams, stops: Sequence[str], slot, decode=None) -> None:
        """`slot`: the key's concurrent-generation slot, already taken; released by close().
        `decode`: token ids to text, the tokenizer's decode unless given (tool_use.decoder)."""
        self.app, self.served, self.key = app, served, key
        self.prompt_ids, self.params = prompt_ids, params
        self.text = IncrementalText(decode or (lambda ids: served.tokenizer.decode(ids)), stops)
        self.finish_reason = "length"
        self.completion_tokens = 0
        self._slot = slot
        self._stream = None
        self._first: Optional[t.SampledToken] = None
        self._started = time.perf_counter()
        self._last = 0.0
        self._ended = False
        self._pending: list = []

    async def open(self) -> None:
        """Opens the route and waits for the first token (or the refusal)."""
        self.app.metrics.live.labels(self.served.name).inc()
        client_id = self.key.client_id if self.key is not None else self.app.config.anonymous_client_id
        try:
            self._stream = self.app.backend.start(self.served.name, client_id, self.prompt_ids, self.params)
            self._first = await self._stream.next()
        except MeshnetError as err:
            self.close()
            raise from_status(err.status, model=self.served.name) from None
        except BaseException:
            self.close()
            raise
        self.app.metrics.prompt_tokens.labels(self.served.name).inc(len(self.prompt_ids))

    async def pieces(self) -> AsyncIterator[_Piece]:
        """Text as it becomes stable, with the tokens behind it; sets finish_reason at the end."""
        token = self._first
        while token is not None:
            now = time.perf_counter()
            if self.completion_tokens == 0:
                self.app.metrics.ttft.labels(self.served.name).observe(now - self._started)
            else:
                self.app.metrics.inter_token.labels(self.served.name).observe(now - self._last)
            self._last = now
            self.completion_tokens += 1
            self.app.metrics.completion_tokens.labels(self.served.name).inc()
            self._pending.append(token)
            finished = self._stream.finish_reason  # the last hop's word on this token (seam minor 1)
            if finished == t.FinishReason.STOP:
                self.finish_reason = "stop"
                break  # a stop token: its text is not part of the answer
            piece = self.text.feed(token.token_id)
            if piece or self.text.stopped:
                yield self._take(piece)
            if self.text.stopped:
                self.finish_reason = "stop"
                self.close()  # the swarm would go on generating: cancel it now
                return
            try:
                token = await self._stream.next()
            except MeshnetError as err:
                raise from_status(err.status, model=self.served.name) from None
        rest = self.text.finish()
        if rest or self._pending:
            yield self._take(rest)

    def _take(self, text: str) -> _Piece:
        piece = _Piece(text, self._pending)
        self._pending = []
        return piece

    def close(self, disconnected: bool = False) -> None:
        """Ends the run however it ended: cancels a route still generating, frees the slot. Idempotent."""
        if self._ended:
            return
        self._ended = True
        if self._stream is not None:
            self._stream.cancel()
            self.app.metrics.failovers.labels(self.served.name).inc(self._stream.failovers)
        if disconnected:
            self.app.metrics.disconnects.labels(self.served.name).inc()
        self.app.metrics.live.labels(self.served.name).dec()
        self._slot.__exit__(None, None, None)

    def usage(self) -> dict:
        return {"prompt_tokens": len(self.prompt_ids), "completion_tokens": self.completion_tokens,
                "total_tokens": len(self.prompt_ids) + self.completion_tokens}


class Gateway:
    """What the app needs: the served models, the backend that runs generations, the keys."""

    def __init__(self, models: Sequence[ServedModel], backend, keys: Optional[KeyRing],
                 config: GatewayConfig = GatewayConfig()) -> None:
        self.models = {m.name: m for m in models}
        self.backend, self.keys, self.config = backend, keys, config
        self.metrics = GatewayMetrics()
        self.prompt_builders = asyncio.Semaphore(config.prompt_builders)

    def slot(self, key: Optional[ApiKey]) -> contextlib.AbstractContextManager:
        """One of `key`'s concurrent generations (429 on entry when all are taken); no bound
        without keys."""
        return self.keys.slot(key) if key is not None and self.keys is not None else contextlib.nullcontext()


def create_app(gateway: Gateway) -> FastAPI:
    app = FastAPI(title="Meshnet gateway", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.gateway = gateway
    metrics = gateway.metrics

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        metrics.refusals.labels(str(err.http_status)).inc()
        return JSONResponse(err.body(), status_code=err.http_status, headers=err.headers())

    app.add_middleware(_CountRequests, metrics=metrics)

    @app.get("/healthz")
    async def healthz() -> PlainTextResponse:
        return PlainTextResponse("ok\n")

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def list_models(request: Request) -> JSONResponse:
        _authenticate(gateway, request)
        data = [await _describe(gateway, name) for name in gateway.models]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/v1/models/{model:path}")
    async def get_model(model: str, request: Request) -> JSONResponse:
        _authenticate(gateway, request)
        _served(gateway, model)
        return JSONResponse(await _describe(gateway, model))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _generate(gateway, request, schema.ChatRequest, "chat", prompts.chat_prompt)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(gateway, request, schema.CompletionRequest, "text", prompts.completion_prompt)

    return app


class _CountRequests:
    """ASGI middleware: counts every answer by endpoint and status. Pure ASGI, not Starlette's
    BaseHTTPMiddleware, which wraps `receive` so that a handler never sees its client leave."""

    def __init__(self, app, metrics: GatewayMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = [500]

        async def sending(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self.metrics.requests.labels(_endpoint(scope["path"]), str(status[0])).inc()


# ---- requests --------------------------------------------------------------------------------

def _endpoint(path: str) -> str:
    for known in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/metrics", "/healthz"):
        if path.startswith(known):
            return known
    return "other"


def _authenticate(gateway: Gateway, request: Request) -> Optional[ApiKey]:
    if gateway.keys is None:
        return None
    return gateway.keys.authenticate(request.headers.get("authorization"))


async def _read_json(request: Request, limit: int) -> object:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > limit):
        raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise ApiError(413, f"request body over {limit} bytes", code="request_too_large")
    try:
        data = json.loads(body)
    except ValueError as err:
        raise bad_request(f"the request body is not valid JSON: {err}") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    try:  # a lone surrogate (a "\\ud800" escape) is valid JSON but no text: refuse it here, not at encoding
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request("the request body holds a lone surrogate (an unpaired \\uD800-\\uDFFF escape)") from None
    except RecursionError:
        raise bad_request("the request body is nested too deeply") from None
    return data


def _served(gateway: Gateway, model: str) -> ServedModel:
    served = gateway.models.get(model)
    if served is None:
        raise ApiError(404, f"The model {model!r} does not exist; this gateway serves {sorted(gateway.models)}",
                       param="model", code="model_not_found")
    return served


async def _describe(gateway: Gateway, name: str) -> dict:
    try:
        cover = await asyncio.to_thread(gateway.backend.coverage, name)
        if not cover.status.ok:
            state, gaps, nodes = "unknown", [], 0
        else:
            gaps = [[g.start, g.end] for g in cover.gaps]
            nodes = cover.routable_count
            state = "full" if not gaps else ("partial" if nodes else "none")
    except Exception:  # the tracker unreachable: the model is listed, its coverage is unknown
        state, gaps, nodes = "unknown", [], 0
    return {"id": name, "object": "model", "created": 0, "owned_by": "meshnet",
            "meshnet": {"coverage": state, "gaps": gaps, "routable_nodes": nodes}}


async def _generate(gateway: Gateway, request: Request, body_type: type, kind: str, prompt_of) -> Response:
    """Key, body, model, the key's slot, the prompt's size, the prompt (off the event loop, a
    few at a time: a long prompt takes a while to render and tokenize), then the generation and
    its response."""
    key = _authenticate(gateway, request)
    body = schema.parse(body_type, await _read_json(request, gateway.config.max_body_bytes))
    body.check_common()
    served = _served(gateway, body.model)
    plan = tool_use.plan_for(body, served) if kind == "chat" else None
    alternatives = body.alternatives()
    slot = gateway.slot(key)
    slot.__enter__()  # ApiError 429 when the key is at its limit, before any work on the prompt
    try:
        chars = prompts.prompt_chars(body)
        if chars > gateway.config.max_prompt_chars:
            raise ApiError(400, f"the prompt has {chars} characters, over this gateway's limit of "
                                f"{gateway.config.max_prompt_chars}", param="messages" if kind == "chat" else "prompt",
                           code="context_length_exceeded")
        build = functools.partial(prompt_of, plan=plan) if plan is not None else prompt_of
        async with gateway.prompt_builders:
            prompt_ids = await asyncio.to_thread(build, served, body)
            grammar = await asyncio.to_thread(constrained.grammar_for, body, plan) if kind == "chat" else ""
        decode = tool_use.decoder(served.tokenizer, plan.family) if plan is not None else None
        run = _Generation(gateway, served, key, prompt_ids,
                          _params(body, served, alternatives, gateway.config, grammar), body.stop_strings(), slot,
                          decode)
    except BaseException:
        slot.__exit__(None, None, None)
        raise
    return await _respond(request, run, body, kind, alternatives, plan)


def _params(body, served: ServedModel, alternatives: Optional[int], config: GatewayConfig,
            grammar: str = "") -> GenerationParams:
    seed = body.seed if body.seed is not None else secrets.randbits(63)
    top_p = body.top_p if body.top_p < 1.0 else 0.0  # 1 keeps every token: no nucleus cut
    return GenerationParams(max_tokens=body.budget(config.default_max_tokens), temperature=body.temperature,
                            top_p=top_p, seed=seed, stop_token_ids=tuple(served.tokenizer.stop_token_ids),
                            first_token_timeout=config.first_token_timeout, stall_timeout=config.stall_timeout,
                            top_logprobs=alternatives or 0, grammar=grammar)


# ---- responses -------------------------------------------------------------------------------

async def _respond(request: Request, run: _Generation, body, kind: str, alternatives: Optional[int],
                   plan: Optional[tool_use.ToolPlan]) -> Response:
    """The response; a client that leaves before it is complete cancels the route at once (issue
    35, finding 10): a watcher waits for the disconnect from the moment the body is read until the
    first token (streaming: StreamingResponse watches from there on) or the whole answer."""
    ident = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())
    if body.stream:
        if not await _unless_disconnected(request, run, run.open()):
            return Response(status_code=499)
        return StreamingResponse(_sse(request, run, body, kind, alternatives, ident, created, plan),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    text, tokens = [], []

    async def answer() -> None:
        await run.open()
        async for piece in run.pieces():
            text.append(piece.text)
            tokens.extend(piece.tokens)

    try:
        if not await _unless_disconnected(request, run, answer()):
            return Response(status_code=499)  # nobody waits for the answer
    finally:
        run.close()
    content = "".join(text)
    logprobs = _logprobs(run, kind, tokens) if alternatives is not None else None
    if kind == "chat":
        message, finish = {"role": "assistant", "content": content}, run.finish_reason
        if plan is not None:
            message, finish = plan.answer(content, ident, finish)
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": content, "logprobs": logprobs, "finish_reason": run.finish_reason}
        obj = "text_completion"
    return JSONResponse({"id": ident, "object": obj, "created": created, "model": run.served.name,
                         "choices": [choice], "usage": run.usage()})


async def _unless_disconnected(request: Request, run: _Generation, work) -> bool:
    """Runs `work` while watching for the client's disconnect; True when it completed (its
    exception, if any, raised), False when the client left first (the route is cancelled)."""
    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task, watcher = asyncio.ensure_future(work), asyncio.ensure_future(disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:  # this handler cancelled (the server stopping): the work goes with it
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        task.result()
        return True
    task.cancel()
    run.close(disconnected=True)
    return False


async def _sse(request: Request, run: _Generation, body, kind: str, alternatives: Optional[int], ident: str,
               created: int, plan: Optional[tool_use.ToolPlan]) -> AsyncIterator[bytes]:
    """The SSE events. With a tool plan, each piece's text goes through tool_use.ToolDeltas: a
    chunk per content or tool-call delta, the tokens' logprobs on the next chunk sent."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    usage_field = {"usage": None} if body.include_usage else {}

    def chunk(choice: Optional[dict], **extra) -> bytes:
        payload = {"id": ident, "object": obj, "created": created, "model": run.served.name,
                   "choices": [choice] if choice is not None else [], **usage_field, **extra}
        return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"

    def choice(text: str, tokens: list, finish: Optional[str] = None, first: bool = False,
               delta: Optional[dict] = None) -> dict:
        logprobs = _logprobs(run, kind, tokens) if alternatives is not None and tokens else None
        if kind == "chat":
            if delta is None:
                delta = {"role": "assistant", "content": text} if first else (
                    {"content": text} if text or not finish else {})
            return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}

    finished = False
    try:
        if kind == "chat":
            yield chunk(choice("", [], first=True))
        calls = tool_use.ToolDeltas(plan, ident) if plan is not None else None
        held: list = []  # tokens whose text ToolDeltas holds back
        async for piece in run.pieces():
            if calls is None:
                yield chunk(choice(piece.text, piece.tokens))
                continue
            held += piece.tokens
            for delta in calls.feed(piece.text):
                yield chunk(choice("", held, delta=delta))
                held = []
        finish = run.finish_reason
        if calls is not None:
            for delta in calls.finish():
                yield chunk(choice("", held, delta=delta))
                held = []
            finish = calls.finish_reason(finish)
        yield chunk(choice("", held, finish))
        if body.include_usage:
            yield chunk(None, usage=run.usage())
        yield b"data: [DONE]\n\n"
        finished = True
    except ApiError as err:  # after the first token: the stream ends with the error event
        run.app.metrics.refusals.labels(str(err.http_status)).inc()
        yield b"data: " + json.dumps(err.body()).encode() + b"\n\n"
        finished = True
    finally:
        run.close(disconnected=not finished)


def _logprobs(run: _Generation, kind: str, tokens: list) -> dict:
    tok = run.served.tokenizer

    def text_of(token_id: int) -> str:
        return tok.decode([token_id], skip_special=False)

    if kind == "chat":
        content = []
        for s in tokens:
            piece = text_of(s.token_id)
            content.append({"token": piece, "logprob": s.logprob, "bytes": list(piece.encode()),
                            "top_logprobs": [{"token": text_of(a.token_id), "logprob": a.logprob,
                                              "bytes": list(text_of(a.token_id).encode())} for a in s.top]})
        return {"content": content}
    return {"tokens": [text_of(s.token_id) for s in tokens], "token_logprobs": [s.logprob for s in tokens],
            "top_logprobs": [{text_of(a.token_id): a.logprob for a in s.top} for s in tokens]}
