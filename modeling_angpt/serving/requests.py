"""What `angpt serve` checks in a request before transformers' server hands it to the model's worker
(docs/tools.md, "angpt serve facing clients"): each bad request is one 4xx answer with one line, in the
status and error body OpenAI's API and vLLM give, and never reaches the continuous-batching worker (an empty prompt,
or a prompt and `max_tokens` longer than the context, kill transformers' worker in transformers 5.25).

Two steps: `check_body` on the JSON body (no model needed), in the server's request guard
(modeling_angpt/serving/guard.py); `fit_to_context` once the prompt is tokenized, in the engine client
(modeling_angpt/serving/server.py), where the prompt's length is known.
"""
from __future__ import annotations

import contextvars
import json
import math
from dataclasses import dataclass

COMPLETIONS, CHAT, RESPONSES = "/v1/completions", "/v1/chat/completions", "/v1/responses"
GENERATION_PATHS = (COMPLETIONS, CHAT, RESPONSES)
# The body's limit on new tokens, per route (chat takes either; OpenAI prefers max_completion_tokens)
MAX_TOKENS_FIELDS = {COMPLETIONS: ("max_tokens",), CHAT: ("max_completion_tokens", "max_tokens"),
                     RESPONSES: ("max_output_tokens",)}

# The new-token limit the request named (None: it named none), from `check_body` to `fit_to_context`: both run in
# the request's task (the guard awaits the app), so a context variable carries it without touching transformers'
# handlers.
REQUESTED_MAX_TOKENS: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "angpt_requested_max_tokens", default=None)


@dataclass
class RequestError(ValueError):
    """A request the server refuses: its HTTP status, one line, and the body field at fault (OpenAI's `param`)."""
    status: int
    message: str
    param: str | None = None
    kind: str = "invalid_request_error"

    def __str__(self) -> str:
        return self.message

    def body(self) -> dict:
        """OpenAI's error body (the `openai` client raises its `BadRequestError` etc. with this message)."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shown(value) -> str:
    """A field's value as the client sent it (JSON, its first 200 characters), or "none" when it is left out."""
    return "none" if value is None else json.dumps(value)[:200]


def _check_positive_integer(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise RequestError(400, f"{name}: expected an integer of at least 1, got {json.dumps(value)}", name)
    return value


def _check_sampling(body: dict) -> None:
    """temperature in [0, 2], top_p in (0, 1] (OpenAI's ranges), n = 1 (one answer per request is served)."""
    temperature, top_p = body.get("temperature"), body.get("top_p")
    if temperature is not None and not (_is_number(temperature) and 0 <= temperature <= 2):
        raise RequestError(400, f"temperature: expected a number from 0 to 2, got {json.dumps(temperature)}",
                           "temperature")
    if top_p is not None and not (_is_number(top_p) and 0 < top_p <= 1):
        raise RequestError(400, f"top_p: expected a number greater than 0 and at most 1, got {json.dumps(top_p)}",
                           "top_p")
    for name in ("n", "best_of"):
        if body.get(name) not in (None, 1):
            raise RequestError(400, f"{name}: only 1 is served (one answer per request), got "
                                    f"{json.dumps(body[name])}", name)


def _check_stop(body: dict) -> None:
    stop = body.get("stop")
    if stop is None or isinstance(stop, str):
        return
    if not isinstance(stop, list) or not all(isinstance(item, str) for item in stop):
        raise RequestError(400, f"stop: expected a string or a list of strings, got {_shown(stop)}", "stop")


def _check_input(path: str, body: dict) -> None:
    """The prompt (completions), the messages (chat) or the input (responses) is there and not empty."""
    if path == COMPLETIONS:
        prompt = body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            raise RequestError(400, f"prompt: expected a non-empty string, got {_shown(prompt)}", "prompt")
    elif path == CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, f"messages: expected a non-empty list of messages, got {_shown(messages)}",
                               "messages")
        if not all(isinstance(message, dict) and isinstance(message.get("role"), str) for message in messages):
            raise RequestError(400, "messages: expected each message to be an object with a role", "messages")
    elif path == RESPONSES:
        given = body.get("input")
        if not isinstance(given, (str, list)) or not given:
            raise RequestError(400, f"input: expected a non-empty string or list, got {_shown(given)}", "input")


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(400, f"the request body is not valid JSON ({error})") from None
    if not isinstance(body, dict):
        raise RequestError(400, "the request body must be a JSON object")
    return body


def check_body(path: str, body: dict) -> tuple[str, int] | None:
    """Refuses (RequestError) what no model could answer; returns the new-token limit the body names, as (field,
    value), or None."""
    _check_input(path, body)
    requested = None
    for name in MAX_TOKENS_FIELDS[path]:
        value = _check_positive_integer(body, name)
        if value is not None and requested is None:
            requested = (name, value)
    _check_sampling(body)
    _check_stop(body)
    return requested


def fit_to_context(prompt_tokens: int, max_new_tokens: int, context: int | None,
                   requested: tuple[str, int] | None) -> int:
    """The new tokens to generate. A prompt whose length plus the requested limit exceeds the context is a 400
    naming both numbers (vLLM's answer); without a requested limit, the server's default is cut to what fits, and
    the answer ends with finish_reason "length" there (docs/tools.md, "angpt serve facing clients")."""
    if prompt_tokens == 0:
        raise RequestError(400, "the prompt is empty once tokenized: nothing to continue", "prompt")
    if context is None:
        return max_new_tokens
    if prompt_tokens >= context:
        raise RequestError(400, f"the prompt has {prompt_tokens} tokens, but the model's context is {context} "
                                "tokens, prompt and answer: no room to answer", "prompt")
    if requested is not None:
        name, value = requested
        if prompt_tokens + value > context:
            raise RequestError(400, f"{name}: the model's context is {context} tokens, but {prompt_tokens} in the "
                                    f"prompt + {value} to generate = {prompt_tokens + value}; ask for at most "
                                    f"{context - prompt_tokens}", name)
        return value
    return min(max_new_tokens, context - prompt_tokens)
