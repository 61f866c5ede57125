"""The soak and the upstream check of bench/serve_load.py: a running `angpt serve` asked a long shuffled mix of valid
requests, every kind of bad request and clients that leave mid-stream (each must get its expected status; the valid
ones must all be answered), its RSS before and after; and `transformers serve` sent the two requests that kill its
continuous-batching worker."""
from __future__ import annotations

import asyncio
import json
import random
import time

import httpx
import psutil

CONCURRENCY, BODY_LIMIT = 16, 65536  # the soak server runs with --max-request-bytes BODY_LIMIT
# (name, route, JSON fields on top of a valid completion (None: left out) or raw bytes, headers, status)
BAD = [
    ("no prompt", "/v1/completions", {"prompt": None}, {}, 400),
    ("empty prompt", "/v1/completions", {"prompt": ""}, {}, 400),
    ("max_tokens past the context", "/v1/completions", {"max_tokens": 10**6}, {}, 400),
    ("max_tokens -5", "/v1/completions", {"max_tokens": -5}, {}, 400),
    ("temperature -1", "/v1/completions", {"temperature": -1}, {}, 400),
    ("top_p 5", "/v1/completions", {"top_p": 5}, {}, 400),
    ("n 2", "/v1/completions", {"n": 2}, {}, 400),
    ("stop not strings", "/v1/completions", {"stop": [1, 2]}, {}, 400),
    ("empty messages", "/v1/chat/completions", {"prompt": None, "messages": []}, {}, 400),
    ("not JSON", "/v1/completions", b"{not json", {}, 400),
    ("body past the limit", "/v1/completions", {"prompt": "x" * BODY_LIMIT}, {}, 413),
    ("no API key", "/v1/completions", {}, {"Authorization": ""}, 401),
    ("wrong API key", "/v1/completions", {}, {"Authorization": "Bearer sk-wrong"}, 401),
]
VALID, STREAMED, LEFT = "valid", "valid, streamed", "left mid-stream"
MIX = [VALID] * 4 + [STREAMED] * 2 + [LEFT] * 2 + [name for name, *_ in BAD]


async def streamed(client: httpx.AsyncClient, body: dict, leave_after: int | None = None) -> dict:
    """One streamed completion: status, time to first text, latency, tokens; `leave_after`: close the connection
    after that many events (a client that leaves)."""
    started, first, tokens, events = time.perf_counter(), None, 0, 0
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True,
                                                              "stream_options": {"include_usage": True}}) as answer:
        if answer.status_code != 200:
            await answer.aread()
            return {"status": answer.status_code, "ok": False}
        async for line in answer.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                return {"status": 200, "ok": False, "error": event["error"]}
            events += 1
            if first is None and event.get("choices") and event["choices"][0].get("text"):
                first = time.perf_counter() - started
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if leave_after is not None and events >= leave_after:
                return {"status": 200, "ok": True, "left": True}
    return {"status": 200, "ok": tokens > 0, "ttft": first, "latency": time.perf_counter() - started,
            "tokens": tokens}


def tree_rss(pid: int) -> float:
    """MB resident: the server and its children (the model's process)."""
    process = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [process, *process.children(recursive=True)]) / 2**20


async def ask(client: httpx.AsyncClient, kind: str, model: str, prompt: str) -> bool:
    """Whether the request got what it should."""
    body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
    if kind == VALID:
        answer = await client.post("/v1/completions", json=body)
        return answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] > 0
    if kind in (STREAMED, LEFT):
        result = await streamed(client, {**body, "max_tokens": 200} if kind == LEFT else body,
                                leave_after=2 if kind == LEFT else None)
        return result["ok"]
    _, route, fields, headers, status = next(entry for entry in BAD if entry[0] == kind)
    if isinstance(fields, bytes):
        answer = await client.post(route, content=fields, headers={"Content-Type": "application/json"})
    else:
        sent = {name: value for name, value in {**body, **fields}.items() if value is not None}
        answer = await client.post(route, json=sent, headers=headers)
    return answer.status_code == status


async def drain(base: str, key: str, concurrency: int, timeout: float, jobs: list, handle) -> float:
    """`await handle(client, job)` for each of `jobs` (taken from its end), `concurrency` at once, on one client that
    sends the API key; the seconds they took (the load runs and the soak both ask this way)."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=base, timeout=timeout, limits=limits,
                                 headers={"Authorization": f"Bearer {key}"}) as client:
        async def worker():
            while jobs:
                await handle(client, jobs.pop())

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


async def run_mix(base: str, model: str, kinds: list[str], prompts: list[str], key: str) -> dict[str, int]:
    """Failures per kind."""
    failed = dict.fromkeys(set(kinds), 0)

    async def ask_one(client: httpx.AsyncClient, job: tuple[int, str]) -> None:
        index, kind = job
        try:
            ok = await ask(client, kind, model, prompts[index % len(prompts)])
        except httpx.HTTPError:
            ok = False
        failed[kind] += not ok

    await drain(base, key, CONCURRENCY, 300, list(enumerate(kinds)), ask_one)
    return failed


def metrics(base: str) -> dict[str, int]:
    text = httpx.get(f"{base}/metrics", timeout=30).text
    return {line.split()[0].split(":")[1]: int(line.split()[1]) for line in text.splitlines()
            if line.startswith("angpt:")}


def soak(base: str, model: str, server, prompts: list[str], count: int, key: str) -> str:
    rng = random.Random(0)
    kinds = [MIX[index % len(MIX)] for index in range(count)]
    rng.shuffle(kinds)
    asyncio.run(run_mix(base, model, [VALID] * 32, prompts, key))  # warm-up, before the first RSS
    before = tree_rss(server.pid)
    started = time.perf_counter()
    failed = asyncio.run(run_mix(base, model, kinds, prompts, key))
    seconds = time.perf_counter() - started
    time.sleep(2)
    after, state = tree_rss(server.pid), metrics(base)
    valid = sum(kinds.count(kind) for kind in (VALID, STREAMED))
    bad = len(kinds) - valid - kinds.count(LEFT)
    wrong = {kind: n for kind, n in failed.items() if n and kind not in (VALID, STREAMED)}
    return (f"Soak: {len(kinds)} requests at concurrency {CONCURRENCY} in {seconds:.0f} s: {valid} valid "
            f"({kinds.count(STREAMED)} of them streamed), {kinds.count(LEFT)} clients leaving mid-stream after 2 "
            f"events, {bad} bad ({len(BAD)} kinds). Valid requests failed: {failed[VALID] + failed[STREAMED]}; "
            f"others not answered as expected: {wrong or 0}. Server RSS (API and model processes) {before:.1f} MB "
            f"before, {after:.1f} MB after ({after - before:+.1f} MB); after the soak the KV cache has "
            f"{state.get('kv_cache_free_blocks')} of {state.get('kv_cache_blocks')} blocks free, "
            f"{state.get('num_requests_in_server')} requests in the server, "
            f"{state.get('worker_restarts_total')} worker restarts.")


def said(request) -> str:
    try:
        answer = request()
    except httpx.HTTPError as error:
        return f"no answer ({type(error).__name__})"
    return f"{answer.status_code} {answer.text[:100]!r}"


def upstream_check(start, free_port, stop, model: str, context: int) -> list[str]:
    """Each of the two requests sent to a fresh `transformers serve`: its answer, then /health, then whether the
    server process is still running 8 s later (transformers stops a server whose worker died)."""
    lines = []
    for name, fields in (("an empty prompt", {"prompt": ""}),
                         (f"max_tokens 10^6 on a {context}-position model", {"prompt": "To be", "max_tokens": 10**6})):
        port = free_port()
        server = start(port)
        try:
            base = f"http://127.0.0.1:{port}"
            answer = said(lambda: httpx.post(f"{base}/v1/completions", json={"model": model, **fields}, timeout=300))
            health = said(lambda: httpx.get(f"{base}/health", timeout=30))
            valid = {"model": model, "prompt": "To be", "max_tokens": 4}
            after = said(lambda: httpx.post(f"{base}/v1/completions", json=valid, timeout=30))
            time.sleep(8)
            lines.append(f"transformers serve, {name}: {answer}; then /health {health}; a valid request {after}; 8 s "
                         f"later the server process "
                         f"{'runs' if server.poll() is None else f'has exited with code {server.returncode}'}.")
        finally:
            stop(server)
    return lines
