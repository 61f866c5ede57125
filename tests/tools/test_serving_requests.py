"""The request checks of `angpt serve` (modeling_angpt/serving/requests.py) on their own, no server: each bad body
is one RequestError with its status, field and one line, a good body passes and names its new-token limit, and a
prompt is fitted to the context (400 naming both numbers when the request asked for too many tokens, cut to what
fits when it asked for none). tests/tools/test_serve_guard.py sends the same requests to a running server.
"""
from __future__ import annotations

import pytest

from modeling_angpt.serving.server import open_to_others_warning
from modeling_angpt.serving.requests import RequestError, check_body, fit_to_context, parse_body

pytestmark = pytest.mark.tools

COMPLETIONS, CHAT, RESPONSES = "/v1/completions", "/v1/chat/completions", "/v1/responses"
GOOD = {COMPLETIONS: {"prompt": "To be", "max_tokens": 5},
        CHAT: {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5},
        RESPONSES: {"input": "hi", "max_output_tokens": 5}}


@pytest.mark.parametrize("path, fields, param", [
    (COMPLETIONS, {"prompt": None}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": [1, 2]}, "prompt"),
    (COMPLETIONS, {"max_tokens": -5}, "max_tokens"),
    (COMPLETIONS, {"max_tokens": 2.5}, "max_tokens"),
    (COMPLETIONS, {"max_tokens": True}, "max_tokens"),
    (COMPLETIONS, {"temperature": -1}, "temperature"),
    (COMPLETIONS, {"temperature": "hot"}, "temperature"),
    (COMPLETIONS, {"top_p": 5}, "top_p"),
    (COMPLETIONS, {"top_p": 0}, "top_p"),
    (COMPLETIONS, {"n": 3}, "n"),
    (COMPLETIONS, {"best_of": 2}, "best_of"),
    (COMPLETIONS, {"stop": [1]}, "stop"),
    (COMPLETIONS, {"stop": {"a": 1}}, "stop"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": None}, "messages"),
    (CHAT, {"messages": ["hi"]}, "messages"),
    (CHAT, {"max_completion_tokens": 0}, "max_completion_tokens"),
    (CHAT, {"max_tokens": -1}, "max_tokens"),
    (RESPONSES, {"input": ""}, "input"),
    (RESPONSES, {"max_output_tokens": 0}, "max_output_tokens"),
])
def test_each_bad_field_is_one_400_naming_it(path, fields, param):
    body = {name: value for name, value in {**GOOD[path], **fields}.items() if value is not None}
    with pytest.raises(RequestError) as refused:
        check_body(path, body)
    assert (refused.value.status, refused.value.param) == (400, param)
    assert str(refused.value).startswith(f"{param}: ") and "\n" not in str(refused.value)
    assert refused.value.body()["error"] == {"message": str(refused.value), "type": "invalid_request_error",
                                             "param": param, "code": 400}


def test_good_bodies_pass_and_name_their_limit():
    assert check_body(COMPLETIONS, GOOD[COMPLETIONS]) == ("max_tokens", 5)
    assert check_body(CHAT, GOOD[CHAT]) == ("max_completion_tokens", 5)
    assert check_body(RESPONSES, GOOD[RESPONSES]) == ("max_output_tokens", 5)
    assert check_body(COMPLETIONS, {"prompt": "x", "temperature": 0, "top_p": 1, "n": 1, "stop": "."}) is None
    assert check_body(CHAT, {"messages": [{"role": "user", "content": "x"}], "temperature": 2, "stop": ["a"]}) is None


@pytest.mark.parametrize("raw, said", [(b"{no", "not valid JSON"), (b"[1, 2]", "must be a JSON object"),
                                       (b"\xff", "not valid JSON")])
def test_a_body_that_is_no_json_object_is_a_400(raw, said):
    with pytest.raises(RequestError, match=said) as refused:
        parse_body(raw)
    assert refused.value.status == 400


def test_a_prompt_is_fitted_to_the_context():
    assert fit_to_context(10, 1024, 256, None) == 246  # no limit asked: the server's default, cut to what fits
    assert fit_to_context(10, 100, 256, None) == 100
    assert fit_to_context(10, 1024, 256, ("max_tokens", 246)) == 246
    assert fit_to_context(10, 1024, None, None) == 1024  # a model without a known context
    with pytest.raises(RequestError) as refused:
        fit_to_context(10, 1024, 256, ("max_tokens", 10**6))
    assert str(refused.value) == ("max_tokens: the model's context is 256 tokens, but 10 in the prompt + 1000000 to "
                                  "generate = 1000010; ask for at most 246")
    for prompt_tokens, said in ((256, "no room to answer"), (0, "empty once tokenized")):
        with pytest.raises(RequestError, match=said):
            fit_to_context(prompt_tokens, 1024, 256, None)


def test_listening_beyond_this_machine_without_a_key_warns_in_one_line():
    warning = open_to_others_warning("0.0.0.0", None)
    assert warning.startswith("angpt serve: warning: listening on 0.0.0.0 without an API key") and "\n" not in warning
    assert open_to_others_warning("0.0.0.0", "sk-key") is None
    for loopback in ("127.0.0.1", "localhost", "::1"):
        assert open_to_others_warning(loopback, None) is None, loopback
