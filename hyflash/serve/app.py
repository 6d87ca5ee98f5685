"""The FastAPI app: OpenAI's chat and text completion endpoints (streamed as server-sent events, or not),
the model list, /health and /metrics, and OpenAI-style errors for everything that goes wrong.

A request is validated and tokenised here, then queued on the engine worker; the handler waits for the
worker to start it (or answers 503 after the queue timeout) and relays its events. A streamed response
whose client disconnects cancels the generation (Starlette cancels the stream; the stream's `finally`
sets the job's flag, which the worker reads at its next pass).
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass

import jinja2
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from hyflash.errors import HyflashError
from hyflash.serve.metrics import ServerMetrics
from hyflash.serve.schemas import APIError, ChatCompletionRequest, CompletionRequest, CompletionSettings
from hyflash.serve.worker import Delta, Done, EngineWorker, Failed, GenerationRequest, Job, Started, Summary

log = logging.getLogger("hyflash.serve")

DISCONNECT_POLL_S = 0.25  # how often a non-streamed request checks that its client is still there


@dataclass(frozen=True)
class ServeConfig:
    model_name: str  # what /v1/models lists and requests may name
    queue_timeout: float = 60.0  # seconds a request may wait for the engine before it gets 503
    dtype: str = ""  # the target's dtype (what --dtype auto chose), reported by /health


@dataclass(frozen=True)
class _Shape:
    """How chat and text completions differ on the wire."""

    object: str
    chunk_object: str
    id_prefix: str
    chat: bool

    def choice(self, text: str, finish_reason: str | None) -> dict:
        body = {"message": {"role": "assistant", "content": text}} if self.chat else {"text": text}
        return {"index": 0, **body, "logprobs": None, "finish_reason": finish_reason}

    def chunk_choice(self, text: str | None, finish_reason: str | None = None, first: bool = False) -> dict:
        if not self.chat:
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        delta = ({"role": "assistant"} if first else {}) | ({"content": text} if text is not None else {})
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


CHAT = _Shape("chat.completion", "chat.completion.chunk", "chatcmpl-", chat=True)
TEXT = _Shape("text_completion", "text_completion", "cmpl-", chat=False)


def _sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def create_app(worker: EngineWorker, config: ServeConfig, metrics: ServerMetrics | None = None) -> FastAPI:
    """The app around a worker (not yet started: the app's lifespan starts and stops it)."""
    metrics = metrics or ServerMetrics()
    metrics.watch(lambda: worker.waiting, lambda: worker.busy)
    target = worker.target
    tokenizer_lock = threading.Lock()  # the worker decodes while handlers encode: one at a time
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        log.info("hyflash serve: %s ready", config.model_name)
        yield
        worker.stop()
        log.info("hyflash serve: engine stopped")

    app = FastAPI(title="hyflash", lifespan=lifespan)

    def answer(request: Request, status: int, body: dict) -> JSONResponse:
        metrics.request(request.url.path, status)
        return JSONResponse(body, status_code=status)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        return answer(request, exc.status, exc.body())

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        error = exc.errors()[0]
        if error.get("type") == "json_invalid":
            return answer(request, 400, APIError(400, f"malformed JSON body: {error.get('msg')}",
                                                 code="invalid_json").body())
        where = [str(part) for part in error.get("loc", ()) if part != "body"]
        param = ".".join(where) or None
        message = str(error.get("msg", "invalid request")).removeprefix("Value error, ")
        return answer(request, 400, APIError(400, f"{param}: {message}" if param else message, param=param,
                                             code=error.get("type")).body())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return answer(request, exc.status_code, APIError(exc.status_code, str(exc.detail), kind).body())

    @app.get("/health")
    async def health(request: Request):
        return answer(request, 200, {"status": "ok", "model": config.model_name, "dtype": config.dtype,
                                     "queue_depth": worker.waiting})

    @app.get("/v1/models")
    async def models(request: Request):
        card = {"id": config.model_name, "object": "model", "created": created, "owned_by": "hyflash"}
        return answer(request, 200, {"object": "list", "data": [card]})

    @app.get("/metrics")
    async def prometheus(request: Request):
        metrics.request(request.url.path, 200)
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(body)
        if not getattr(target.tokenizer, "chat_template", None):
            raise APIError(400, f"{config.model_name} has no chat template: use /v1/completions", param="messages")
        messages = [m.for_template() for m in body.messages]
        prompt_ids = _encode("messages", lambda: target.encode_chat(messages))
        return await _complete(request, body, prompt_ids, CHAT)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body)
        if isinstance(body.prompt, str):
            prompt_ids = _encode("prompt", lambda: target.encode_prompt(body.prompt, chat=False))
        else:
            prompt_ids = _encode("prompt", lambda: _check_ids(list(body.prompt)))
        return await _complete(request, body, prompt_ids, TEXT)

    def _check_model(body: CompletionSettings) -> None:
        if body.model is not None and body.model != config.model_name:
            raise APIError(404, f"model {body.model!r} is not served here: this server runs {config.model_name!r}",
                           param="model", code="model_not_found")

    def _check_ids(ids: list[int]) -> list[int]:
        bad = [i for i in ids if not 0 <= i < target.vocab_size]
        if bad:
            raise HyflashError(f"token ids {bad[:5]} are outside the vocabulary (0..{target.vocab_size - 1})")
        target.check_prompt_length(len(ids))
        return ids

    def _encode(param: str, encode) -> list[int]:
        try:
            with tokenizer_lock:
                return encode()
        except HyflashError as exc:  # empty, too long for the context, ids out of range
            raise APIError(400, str(exc), param=param, code="invalid_prompt") from exc
        except jinja2.TemplateError as exc:  # e.g. a template that refuses a system message
            raise APIError(400, f"the chat template refused these messages: {exc}", param="messages") from exc

    async def _complete(request: Request, body: CompletionSettings, prompt_ids: list[int], shape: _Shape):
        limit = body.token_limit()
        generation = GenerationRequest(
            prompt_ids=prompt_ids, max_tokens=limit if limit is not None else target.max_context,
            sampling=body.sampling(), seed=body.seed if body.seed is not None else secrets.randbits(63),
            stop=body.stop_strings())
        job = worker.submit(generation, asyncio.get_running_loop())
        await _wait_until_started(job)
        head = {"id": shape.id_prefix + secrets.token_hex(12), "created": int(time.time()), "model": config.model_name}
        if body.stream:
            # The response starts with the first text, not before: work on this side during the prefill takes a
            # core from the engine on a small machine (and an engine failure then still gets its HTTP status).
            first = await _first_event(job)
            if isinstance(first, Failed):
                raise _failure(first)
            metrics.request(request.url.path, 200)
            return StreamingResponse(_stream(job, head, shape, first), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        summary = await _collect(request, job)
        return answer(request, 200, {**head, "object": shape.object,
                                     "choices": [shape.choice(summary.text, summary.finish_reason)],
                                     "usage": summary.usage(), "hyflash": summary.extension()})

    async def _wait_until_started(job: Job) -> None:
        try:
            event = await asyncio.wait_for(job.events.get(), timeout=config.queue_timeout)
        except asyncio.TimeoutError:
            if worker.withdraw(job):
                raise APIError(503, f"the engine stayed busy for {config.queue_timeout:g} s (--queue-timeout): "
                               "retry later", "server_error", code="queue_timeout") from None
            event = await job.events.get()  # it started just now
        except asyncio.CancelledError:
            job.cancel()
            raise
        if isinstance(event, Failed):
            raise _failure(event)
        assert isinstance(event, Started), event

    async def _first_event(job: Job):
        try:
            return await job.events.get()
        except asyncio.CancelledError:
            job.cancel()
            raise

    async def _collect(request: Request, job: Job) -> Summary:
        """The finished generation; cancels it if the client disconnects while waiting."""
        try:
            while True:
                try:
                    event = await asyncio.wait_for(job.events.get(), timeout=DISCONNECT_POLL_S)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        job.cancel()
                        raise APIError(499, "the client disconnected", code="client_disconnected") from None
                    continue
                if isinstance(event, Done):
                    return event.summary
                if isinstance(event, Failed):
                    raise _failure(event)
        except asyncio.CancelledError:
            job.cancel()
            raise

    async def _stream(job: Job, head: dict, shape: _Shape, first):
        chunk = {**head, "object": shape.chunk_object}
        try:
            if shape.chat:
                yield _sse({**chunk, "choices": [shape.chunk_choice("", first=True)]})
            event = first
            while True:
                if isinstance(event, Delta):
                    yield _sse({**chunk, "choices": [shape.chunk_choice(event.text)]})
                elif isinstance(event, Done):
                    summary = event.summary
                    yield _sse({**chunk, "choices": [shape.chunk_choice(None if shape.chat else "",
                                                                          summary.finish_reason)]})
                    yield _sse({**chunk, "choices": [], "usage": summary.usage(), "hyflash": summary.extension()})
                    break
                elif isinstance(event, Failed):
                    yield _sse(_failure(event).body())
                    break
                event = await job.events.get()
            yield _sse("[DONE]")
        finally:
            job.cancel()  # a no-op once the generation has ended; otherwise the client is gone

    return app


def _failure(event: Failed) -> APIError:
    kind = "server_error" if event.status >= 500 else "invalid_request_error"
    return APIError(event.status, event.message, kind)
