"""`angpt serve`: transformers' OpenAI-compatible server with continuous batching, asked by the real `openai` client on
127.0.0.1, answers what `generate` gives greedily for the same prompt: a completion, a stream, and a chat completion
(the tokenizer carries a chat template, which `angpt export` carries over), for the training form and the folded form
(docs/tools.md, "transformers serve"). Bad input is one line.

Each server is a process of its own, with the model in a second process (transformers' design): tens of seconds
on a 2-core CPU, so these run in `make test-tools` (marker tools).
"""
from __future__ import annotations

import socket

import pytest
from openai import OpenAI
from transformers import AutoTokenizer

from modeling_angpt.export.fold import export_checkpoint

from checkpoint_fixtures import save_source
from cli_helpers import angpt, assert_one_line_error
from serve_fixtures import CHAT_TEMPLATE, ascii_tokenizer, free_port, greedy_text, running_server

pytestmark = pytest.mark.tools

PROMPT, MESSAGES, NEW_TOKENS = "To be, or not", [{"role": "user", "content": "that is the question"}], 12


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """anGPT's training form with a chat-template tokenizer, and its export (which must carry the template over)."""
    from modeling_angpt import AnGPTConfig

    root = tmp_path_factory.mktemp("serve")
    vocab = len(ascii_tokenizer(root / "training"))
    save_source(root / "training", lambda architecture, **kw: AnGPTConfig(
        vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, architecture=architecture, **kw))
    export_checkpoint(str(root / "training"), str(root / "folded"))
    return root


@pytest.mark.parametrize("form", ["training", "folded"])
def test_openai_client_gets_what_generate_gives(checkpoints, form):
    checkpoint = checkpoints / form
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer.chat_template == CHAT_TEMPLATE  # the folded one's came through `angpt export`
    expected = greedy_text(checkpoint, PROMPT, NEW_TOKENS)
    expected_chat = greedy_text(checkpoint, tokenizer.apply_chat_template(MESSAGES, tokenize=False,
                                                                         add_generation_prompt=True), NEW_TOKENS)
    assert expected and expected_chat
    with running_server(checkpoint, free_port()) as base_url:
        client, model = OpenAI(base_url=base_url, api_key="unused", max_retries=0), str(checkpoint)
        completion = client.completions.create(model=model, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0)
        stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0,
                                           stream=True)
        streamed = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
        chat = client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=NEW_TOKENS, temperature=0)
    assert completion.choices[0].text == expected
    assert completion.usage.completion_tokens == NEW_TOKENS
    assert streamed == expected
    assert chat.choices[0].message.content == expected_chat


def test_a_missing_checkpoint_is_one_line(tmp_path):
    assert_one_line_error(angpt("serve", tmp_path / "nowhere"), "checkpoint", "no such directory")


def test_a_port_in_use_is_one_line(checkpoints, capsys):
    from modeling_angpt.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(checkpoints / "folded"), "--port", str(port)]) == 1
    error = capsys.readouterr().err.strip()
    assert error == f"angpt serve: error: --port {port}: 127.0.0.1:{port} is already in use; pick another port"


def test_a_max_model_len_past_the_context_is_one_line(checkpoints, capsys):
    from modeling_angpt.cli import main

    assert main(["serve", str(checkpoints / "folded"), "--max-model-len", "65", "--port", str(free_port())]) == 1
    assert capsys.readouterr().err.strip() == ("angpt serve: error: --max-model-len 65: longer than the model's "
                                               "context (64 tokens), past which its answers are wrong")


def test_a_cpu_server_sizes_its_cache_for_the_model_not_for_ram():
    from modeling_angpt.serving.server import ServeOptions, with_cpu_cache_sizes

    sized = with_cpu_cache_sizes(ServeOptions("ckpt", device="cpu"), max_position_embeddings=1000)
    assert (sized.cb_block_size, sized.cb_num_blocks, sized.cb_max_batch_tokens) == (32, 250, 256)  # 8 × 1000 tokens
    chosen = ServeOptions("ckpt", device="cpu", cb_num_blocks=4)
    assert with_cpu_cache_sizes(chosen, 1000) == chosen  # a --cb-* flag: the user's sizes, transformers' for the rest
    assert with_cpu_cache_sizes(ServeOptions("ckpt", device="cuda"), 1000).cb_num_blocks is None
    assert with_cpu_cache_sizes(ServeOptions("ckpt", device="cpu", max_model_len=200), 1000).cb_num_blocks == 50


def _serve_on_a_taken_port(checkpoints, capsys) -> tuple[int, str, int]:
    """`angpt serve` on a port already taken: (exit status, its stderr, the port). A refusal that comes before the
    port is bound is the only line; the port's own error comes after it."""
    from modeling_angpt.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(["serve", str(checkpoints / "folded"), "--port", str(port)])
    return status, capsys.readouterr().err.strip(), port


def test_a_newer_transformers_than_checked_is_refused_before_the_port(checkpoints, capsys, monkeypatch):
    """modeling_angpt/dependencies/ledger.py: the server replaces internals of transformers' that a minor release may
    change; a release newer than the ledger's is refused in one line, unless the user asks to try it, and one older
    than its server needs (5.24 has no engine client) always."""
    from modeling_angpt.dependencies import ledger as internals_ledger

    real = internals_ledger.installed_version
    monkeypatch.setattr(internals_ledger, "installed_version",
                        lambda name: "5.99.0" if name == "transformers" else real(name))
    status, error, _ = _serve_on_a_taken_port(checkpoints, capsys)
    assert status == 1 and len(error.splitlines()) == 1, error
    assert error.startswith("angpt serve: error: transformers 5.99.0 is newer than the versions angpt serve was "
                            "checked with (5.25.0)") and "ANGPT_UNTESTED_TRANSFORMERS=1" in error, error
    monkeypatch.setenv("ANGPT_UNTESTED_TRANSFORMERS", "1")
    status, error, port = _serve_on_a_taken_port(checkpoints, capsys)
    assert status == 1 and error.endswith(f"127.0.0.1:{port} is already in use; pick another port"), error
    monkeypatch.setattr(internals_ledger, "installed_version",
                        lambda name: "5.24.0" if name == "transformers" else real(name))
    status, error, _ = _serve_on_a_taken_port(checkpoints, capsys)
    assert status == 1 and error.startswith("angpt serve: error: transformers 5.24.0 is older than angpt serve "
                                            "needs"), error


def test_a_server_internal_gone_is_refused_in_one_line_naming_it(checkpoints, capsys, monkeypatch):
    from transformers.cli.serving import model_manager

    monkeypatch.delattr(model_manager.EngineClient, "_mark_dead")
    status, error, _ = _serve_on_a_taken_port(checkpoints, capsys)
    assert status == 1 and len(error.splitlines()) == 1, error
    assert "has no transformers.cli.serving.model_manager.EngineClient._mark_dead, which modeling_angpt/serving/server.py " \
           "uses" in error, error
