"""The guard `angpt serve` puts in front of transformers' server (an ASGI middleware on its FastAPI app, outermost;
docs/tools.md, "angpt serve facing clients"): who may call (`--api-key`, OpenAI's `Authorization: Bearer`), the body's
size, a bound on the requests held at once (429 past it), the body's fields (modeling_angpt/serving/requests.py), a time
limit per request, a truthful /health while the model's worker restarts, and /metrics (Prometheus' text format) with the
paged KV cache's free blocks. transformers' own middleware (request ids, cancelling a request whose client left) and
routes run inside it unchanged.
"""
from __future__ import annotations

import asyncio
import hmac
import json
from dataclasses import dataclass

from .requests import GENERATION_PATHS, REQUESTED_MAX_TOKENS, RequestError, check_body, parse_body


@dataclass
class GuardOptions:
    """`api_key`: None, every caller; `request_timeout`: seconds, None for no limit."""
    api_key: str | None = None
    max_concurrent_requests: int = 128
    request_timeout: float | None = 600.0
    max_request_bytes: int = 8 * 2**20


async def answer(scope, receive, send, status: int, content: dict, headers: dict | None = None) -> None:
    from starlette.responses import JSONResponse

    await JSONResponse(content, status_code=status, headers=headers)(scope, receive, send)


def replaying(body: bytes, receive):
    """`receive` for the app once the guard has read the body: the body once, then the client's messages (its
    disconnect, which transformers' CancelOnDisconnect waits for)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive_again():
        return pending.pop() if pending else await receive()

    return receive_again


class RequestGuard:
    """A plain ASGI middleware, as transformers' own are (a `BaseHTTPMiddleware` would put each streamed chunk
    through an extra task). `model_manager` is the server's (transformers' `ModelManager`)."""

    def __init__(self, app, options: GuardOptions, model_manager):
        self.app, self.options, self.model_manager = app, options, model_manager
        self.in_flight = 0  # generation requests past the checks and not yet answered (the event loop's only)
        # the Authorization header a caller with the key sends, built once rather than per request
        self.authorization = None if options.api_key is None else f"Bearer {options.api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path == "/health":  # /health and /metrics need no API key (vLLM's rule: monitors carry no key)
            return await self.health(scope, receive, send)
        if path == "/metrics":
            return await self.metrics(scope, receive, send)
        try:
            request_headers = dict(scope["headers"])
            self.check_api_key(request_headers)
            if path not in GENERATION_PATHS or scope["method"] != "POST":
                return await self.app(scope, receive, send)
            if self.in_flight >= self.options.max_concurrent_requests:
                raise RequestError(429, f"the server holds {self.in_flight} requests already, its limit "
                                        "(--max-concurrent-requests): retry later", kind="rate_limit_error")
            body = await self.read_body(request_headers, receive)
            requested = check_body(path, parse_body(body))
        except RequestError as error:
            headers = {"Retry-After": "1"} if error.status == 429 else None
            return await answer(scope, receive, send, error.status, error.body(), headers)
        REQUESTED_MAX_TOKENS.set(requested)
        self.in_flight += 1
        try:
            await self.within_time_limit(scope, replaying(body, receive), send)
        finally:
            self.in_flight -= 1

    def check_api_key(self, headers: dict) -> None:
        if self.authorization is None:
            return
        given = headers.get(b"authorization", b"").decode("latin-1")
        if not hmac.compare_digest(given.encode(), self.authorization):
            said = "no Authorization header" if not given else "a wrong API key"
            raise RequestError(401, f"{said}: send the server's key as 'Authorization: Bearer <key>' (--api-key)",
                               kind="authentication_error")

    async def read_body(self, headers: dict, receive) -> bytes:
        """The whole body, refused (413) past --max-request-bytes: at once when its Content-Length says so, else
        as soon as the bytes received pass it. (FastAPI's own `max_body_size` would answer in its `detail` form, and
        only once a route reads the body; the guard reads it anyway, to check its fields.)"""
        limit = self.options.max_request_bytes
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            raise self.too_large()
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise RequestError(499, "the client left before sending its request")
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                raise self.too_large()
            if not message.get("more_body", False):
                return b"".join(chunks)

    def too_large(self) -> RequestError:
        return RequestError(413, f"the request body is larger than the server's limit of "
                                 f"{self.options.max_request_bytes} bytes (--max-request-bytes)")

    async def within_time_limit(self, scope, receive, send) -> None:
        """The app, cancelled past --request-timeout: cancelling its task stops the generation (transformers'
        handlers send the worker a cancel, which frees the request's KV-cache blocks). A stream already started
        ends with an error event, as transformers' streams end on an error."""
        if self.options.request_timeout is None:  # no limit: the app as it is, no watch on each message it sends
            return await self.app(scope, receive, send)
        started = ended = False

        async def send_noting(message) -> None:
            nonlocal started, ended
            started |= message["type"] == "http.response.start"
            ended |= message["type"] == "http.response.body" and not message.get("more_body", False)
            await send(message)

        deadline = asyncio.timeout(self.options.request_timeout)
        try:
            async with deadline:
                await self.app(scope, receive, send_noting)
        except TimeoutError:
            if not deadline.expired():  # a time-out of the app's own, not this limit: the app's error stays its own
                raise
            error = RequestError(504, f"the request ran past the server's time limit of "
                                      f"{self.options.request_timeout:g} s (--request-timeout)", kind="timeout")
            if not started:
                await answer(scope, receive, send, error.status, error.body())
            elif not ended:
                event = f"data: {json.dumps(error.body())}\n\n".encode()
                await send({"type": "http.response.body", "body": event, "more_body": False})

    def engines(self) -> list:
        return list(self.model_manager.engines.values())

    async def health(self, scope, receive, send) -> None:
        """transformers' /health says 503 once the worker is dead for good; while it restarts, this says so."""
        if any(getattr(engine, "restarting", False) for engine in self.engines()):
            return await answer(scope, receive, send, 503, {"status": "unhealthy", "reason": "restarting"})
        await self.app(scope, receive, send)

    async def metrics(self, scope, receive, send) -> None:
        from starlette.responses import PlainTextResponse

        values = {"angpt:num_requests_in_server": self.in_flight,
                  "angpt:worker_restarts_total": sum(getattr(e, "restarts", 0) for e in self.engines())}
        for engine in self.engines():
            if engine.process_running and not getattr(engine, "restarting", False):
                try:
                    values.update(await asyncio.wait_for(engine.submit(batching_state), timeout=2))
                except (asyncio.TimeoutError, RuntimeError):  # a busy or dying worker: the server's own figures
                    pass
        text = "".join(f"# TYPE {name} gauge\n{name} {value}\n" for name, value in values.items())
        await PlainTextResponse(text, media_type="text/plain; version=0.0.4")(scope, receive, send)


def batching_state(model, processor) -> dict:
    """Runs in the model's process (transformers' `EngineClient.submit`): the batching manager's requests running
    and waiting, and its paged KV cache's free and total blocks (a block: `--cb-block-size` tokens of every layer).
    Free counts the blocks a finished request left cached for prefix sharing too: no request holds them and the
    cache evicts them as soon as a request needs room. The manager is the one `remember_batching_manager`
    (modeling_angpt/serving/server.py) kept on the model."""
    manager = getattr(model, "serving_batching_manager", None)
    processor_ = None if manager is None else manager.batch_processor
    if processor_ is None:  # generate(), or the worker not started yet
        return {}
    cache, scheduler = processor_.cache, processor_.scheduler
    allocators = cache.cache_allocators.values()
    cached_bytes = sum(len(allocator.ledger.cached_blocks) * allocator.bytes_per_block for allocator in allocators)
    free_bytes = int(cache.compute_free_capacity(relative=False)) + cached_bytes
    return {"angpt:num_requests_running": len(scheduler.active_requests),
            "angpt:num_requests_waiting": len(scheduler.waiting_requests),
            "angpt:kv_cache_free_blocks": free_bytes // sum(allocator.bytes_per_block for allocator in allocators),
            "angpt:kv_cache_blocks": cache.num_blocks}
