"""`angpt serve` facing clients (docs/tools.md, "angpt serve facing clients"): every bad request of the kinds that reach
a public endpoint is answered 4xx with one line before it reaches the model's worker, and a valid request right after it
is answered as greedy `generate` answers it; only callers with the API key get in; the server holds a bounded number of
requests (429 past it), stops a request past its time limit (504), frees a stream's slot and KV-cache blocks when its
client leaves (the free-block count of /metrics back to its idle value); a model worker killed on purpose is restarted,
and killed once more than --max-worker-restarts allows, the server exits with status 1.

Before these checks, an empty prompt or a `max_tokens` past the context killed transformers' continuous-batching
worker (a tiny transformers Qwen3 under `transformers serve --continuous-batching` dies the same way).
"""
from __future__ import annotations

import re
import threading
import time

import httpx
import psutil
import pytest

from checkpoint_fixtures import save_source
from serve_fixtures import ascii_tokenizer, free_port, greedy_text, started_server

pytestmark = pytest.mark.tools

KEY, CONTEXT, SHORT, TIME_LIMIT, BODY_LIMIT = "sk-test-82", 16384, 256, 6, 200_000
PROMPT, NEW_TOKENS = "To be, or not", 8
LONG = CONTEXT - 16  # new tokens of a request that runs well past the time limit (16k decoding steps)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from modeling_angpt import AnGPTConfig

    path = tmp_path_factory.mktemp("guarded") / "model"
    vocab = len(ascii_tokenizer(path))
    save_source(path, lambda architecture, **kw: AnGPTConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=CONTEXT, architecture=architecture, **kw))
    return path


@pytest.fixture(scope="module")
def server(checkpoint):
    """One guarded server for the module (the key from the environment variable, as a deployment sets it)."""
    port = free_port()
    flags = ("--max-concurrent-requests", "2", "--request-timeout", str(TIME_LIMIT), "--max-request-bytes",
             str(BODY_LIMIT))
    with started_server(checkpoint, port, *flags, ANGPT_API_KEY=KEY):
        yield httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {KEY}"},
                           timeout=120), str(checkpoint)


@pytest.fixture(scope="module")
def expected(checkpoint):
    return greedy_text(checkpoint, PROMPT, NEW_TOKENS)


def completion(client, model, **fields):
    return client.post("/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": NEW_TOKENS,
                                                **fields})


def assert_served(client, model, expected):
    answer = completion(client, model, temperature=0)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == expected


def assert_refused(answer, status: int, *words: str) -> str:
    """The status, and OpenAI's error body with one line naming what is wrong."""
    assert answer.status_code == status, answer.text
    message = answer.json()["error"]["message"]
    assert "\n" not in message and all(word in message for word in words), message
    return message


def metrics(client) -> dict[str, int]:
    text = client.get("/metrics").text
    return {name: int(value) for name, value in re.findall(r"^angpt:(\w+) (\d+)$", text, re.MULTILINE)}


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
BAD_REQUESTS = [  # (route, body fields on top of a valid request, None: left out; status, words of the message)
    (COMPLETIONS, {"prompt": None}, 400, "prompt: expected a non-empty string, got none"),
    (COMPLETIONS, {"prompt": ""}, 400, 'prompt: expected a non-empty string, got ""'),
    (COMPLETIONS, {"max_tokens": 10**6}, 400, f"context is {CONTEXT} tokens", "+ 1000000 to generate"),
    (COMPLETIONS, {"max_tokens": -5}, 400, "max_tokens: expected an integer of at least 1, got -5"),
    (COMPLETIONS, {"max_tokens": 0}, 400, "max_tokens: expected an integer of at least 1, got 0"),
    (COMPLETIONS, {"temperature": -1}, 400, "temperature: expected a number from 0 to 2, got -1"),
    (COMPLETIONS, {"temperature": 2.5}, 400, "temperature: expected a number from 0 to 2, got 2.5"),
    (COMPLETIONS, {"top_p": 5}, 400, "top_p: expected a number greater than 0 and at most 1, got 5"),
    (COMPLETIONS, {"top_p": 0}, 400, "top_p: expected a number greater than 0 and at most 1, got 0"),
    (COMPLETIONS, {"n": 2}, 400, "n: only 1 is served"),
    (COMPLETIONS, {"stop": ["ok", 7]}, 400, 'stop: expected a string or a list of strings, got ["ok", 7]'),
    (CHAT, {"prompt": None, "messages": None}, 400, "messages: expected a non-empty list of messages, got none"),
    (CHAT, {"prompt": None, "messages": []}, 400, "messages: expected a non-empty list of messages, got []"),
    (CHAT, {"prompt": None, "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens: expected an integer of at least 1, got 0"),
    (CHAT, {"prompt": None, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, 400,
     f"context is {CONTEXT} tokens"),
]


def test_every_bad_request_is_refused_and_the_next_one_served(server, expected):
    client, model = server
    for route, fields, status, *words in BAD_REQUESTS:
        body = {"model": model, "prompt": PROMPT, "max_tokens": NEW_TOKENS, **fields}
        answer = client.post(route, json={name: value for name, value in body.items() if value is not None})
        assert_refused(answer, status, *words)
        assert_served(client, model, expected)
    assert_refused(client.post(COMPLETIONS, content=b"{not json", headers={"Content-Type": "application/json"}),
                   400, "not valid JSON")
    assert_served(client, model, expected)
    assert_refused(completion(client, model, prompt="x" * BODY_LIMIT), 413, f"limit of {BODY_LIMIT} bytes")
    assert_served(client, model, expected)
    assert client.get("/health").json() == {"status": "ok"}


def test_only_callers_with_the_key_get_in(server, expected):
    client, model = server
    body = {"model": model, "prompt": PROMPT, "max_tokens": NEW_TOKENS}
    assert_refused(httpx.post(f"{client.base_url}/v1/completions", json=body), 401, "no Authorization header")
    wrong = {"Authorization": "Bearer sk-wrong"}
    assert_refused(httpx.post(f"{client.base_url}/v1/completions", json=body, headers=wrong), 401, "a wrong API key")
    assert_refused(httpx.get(f"{client.base_url}/v1/models"), 401, "Authorization")
    assert httpx.get(f"{client.base_url}/health").status_code == 200  # monitors carry no key
    from openai import OpenAI  # as users call it: the key as api_key

    answer = OpenAI(base_url=f"{client.base_url}/v1", api_key=KEY, max_retries=0).completions.create(
        model=model, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0)
    assert answer.choices[0].text == expected


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_blocks(server, expected):
    client, model = server
    assert wait_until(lambda: metrics(client)["kv_cache_free_blocks"] == metrics(client)["kv_cache_blocks"], 10)
    idle = metrics(client)
    assert idle["kv_cache_blocks"] > 0 and idle["num_requests_running"] == idle["num_requests_in_server"] == 0
    started = time.monotonic()
    with client.stream("POST", "/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": LONG,
                                                        "stream": True}) as stream:
        events = stream.iter_lines()  # kept: an iterator dropped closes its connection
        assert [next(events) for _ in range(4)]
        busy = metrics(client)
        assert busy["num_requests_running"] == 1 and busy["kv_cache_free_blocks"] < idle["kv_cache_blocks"]
    assert wait_until(lambda: metrics(client) == idle, TIME_LIMIT)
    assert time.monotonic() - started < TIME_LIMIT  # freed by the client leaving, not by the time limit
    assert_served(client, model, expected)


def test_a_full_server_answers_429_and_a_slow_request_504(server, expected):
    client, model = server
    body = {"model": model, "prompt": PROMPT, "max_tokens": LONG, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as first, \
            client.stream("POST", "/v1/completions", json=body) as second:
        events = first.iter_lines(), second.iter_lines()  # kept: an iterator dropped closes its connection
        assert all(next(stream_events) for stream_events in events)
        answer = completion(client, model)
        assert_refused(answer, 429, "holds 2 requests already", "--max-concurrent-requests")
        assert answer.headers["Retry-After"] == "1"
    assert wait_until(lambda: metrics(client)["num_requests_in_server"] == 0, 10)
    assert_served(client, model, expected)
    started = time.monotonic()
    assert_refused(completion(client, model, max_tokens=LONG), 504, f"time limit of {TIME_LIMIT} s")
    assert TIME_LIMIT <= time.monotonic() - started < TIME_LIMIT + 10
    idle = metrics(client)
    assert wait_until(lambda: metrics(client)["kv_cache_free_blocks"] == idle["kv_cache_blocks"], 10)
    assert_served(client, model, expected)


@pytest.fixture(scope="module")
def short_server(checkpoint):
    """A server of requests of at most SHORT tokens (--max-model-len), whose model's worker may restart once."""
    port = free_port()
    with started_server(checkpoint, port, "--max-model-len", str(SHORT), "--max-worker-restarts", "1") as server:
        yield server, httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120), str(checkpoint)


def test_without_max_tokens_the_answer_is_cut_to_the_context(short_server):
    """A prompt 12 tokens short of the context and no max_tokens: 12 tokens, finish_reason "length" (with a
    max_tokens past the context, a 400 instead: BAD_REQUESTS)."""
    _, client, model = short_server
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    ids = tokenizer("To be, or not to be, that is the question: " * 40).input_ids[:SHORT - 12]
    answer = client.post("/v1/completions", json={"model": model, "prompt": tokenizer.decode(ids)})
    assert answer.status_code == 200, answer.text
    usage, choice = answer.json()["usage"], answer.json()["choices"][0]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (SHORT - 12, 12), usage
    assert choice["finish_reason"] == "length"
    assert_refused(completion(client, model, max_tokens=SHORT), 400, f"context is {SHORT} tokens")


def model_process(server) -> psutil.Process:
    """transformers' model process: the server's child spawned by multiprocessing (not its resource tracker)."""
    children = [child for child in psutil.Process(server.pid).children(recursive=True)
                if "spawn_main" in " ".join(child.cmdline())]
    assert len(children) == 1, children
    return children[0]


def test_a_killed_worker_is_restarted_then_the_server_exits(short_server, expected):
    """Killed (SIGKILL) with a request in flight (held there by stopping the process first): that request gets a 503
    naming the cause, /health says 503 while the model's process restarts, a request sent meanwhile waits and gets the
    same answer as before; killed once more than --max-worker-restarts allows, the server exits with status 1 and one
    line, for a process supervisor to restart it."""
    server, client, model = short_server
    stopped, in_flight = model_process(server), {}
    stopped.suspend()
    asking = threading.Thread(target=lambda: in_flight.update(answer=completion(client, model)))
    asking.start()
    assert wait_until(lambda: metrics(client)["num_requests_in_server"] == 1, 60)
    stopped.kill()
    asking.join(60)
    assert in_flight["answer"].status_code == 503
    assert "The model's worker died while answering" in in_flight["answer"].json()["error"]
    assert wait_until(lambda: client.get("/health").status_code == 503, 10)
    assert client.get("/health").json() == {"status": "unhealthy", "reason": "restarting"}
    assert_served(client, model, expected)  # sent while restarting: it waits for the new process
    assert client.get("/health").json() == {"status": "ok"}
    assert metrics(client)["worker_restarts_total"] == 1
    model_process(server).kill()
    assert server.wait(timeout=60) == 1
    output = server.output.read_text()
    errors = [line for line in output.splitlines() if line.startswith("angpt serve: error:")]
    assert len(errors) == 1 and "the model's worker died again after 1 restart" in errors[0], output[-3000:]
    assert "Traceback" not in output, output[-3000:]
