"""What the tests of `angpt serve` share (tests/tools/test_serve.py, tests/tools/test_serve_guard.py): a tokenizer
whose tokens are whole ASCII text, a server started as a user starts it, and the oracle a served completion must
equal (greedy `generate` on the same prompt)."""
from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from cli_helpers import ENTRY, REPO, cli_env

CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


def ascii_tokenizer(path) -> PreTrainedTokenizerFast:
    """A byte-level BPE learnt without the 256-byte alphabet: every token is whole ASCII text, so a stream's pieces
    decode to the same text as the whole answer (a lone byte of a multi-byte character is held back by a stream)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=80, special_tokens=["<unk>", "<eos>"])
    tokenizer.train_from_iterator(["To be, or not to be, that is the question: user assistant\n"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)
    return fast


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_health(server: subprocess.Popen, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        assert server.poll() is None, f"the server stopped: {server.output.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the server did not answer /health in time"
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if json.load(answer).get("status") == "ok":
                    return
        time.sleep(0.5)


@contextlib.contextmanager
def started_server(checkpoint, port: int, *flags: str, timeout: float = 240, **env):
    """`angpt serve` as a user starts it, its output in a file (`server.output`: a pipe nobody reads would fill and
    stall it); yields the process once /health answers; stops it with Ctrl+C (SIGINT)."""
    command = [sys.executable, "-c", ENTRY, "serve", str(checkpoint), "--port", str(port), "--log-level", "warning",
               *flags]
    with tempfile.TemporaryDirectory() as folder:
        output = Path(folder) / "server.log"
        with output.open("w") as log:
            server = subprocess.Popen(command, cwd=REPO, env=cli_env(**env), stdout=log, stderr=subprocess.STDOUT,
                                      text=True)
        server.output = output
        try:
            wait_for_health(server, port, timeout)
            yield server
        finally:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@contextlib.contextmanager
def running_server(checkpoint, port: int, timeout: float = 240):
    """`started_server`, yielding its base URL."""
    with started_server(checkpoint, port, timeout=timeout):
        yield f"http://127.0.0.1:{port}/v1"


def greedy_text(checkpoint, prompt: str, new_tokens: int) -> str:
    """The oracle: generate() on the same tokens, the model's generation config, the new tokens decoded."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    output = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return tokenizer.decode(output[0, ids.shape[1]:], skip_special_tokens=True)
