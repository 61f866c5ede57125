#!/usr/bin/env python
"""Serving under load: `angpt serve` of an anGPT checkpoint of the demo model's shape against `transformers serve
--continuous-batching` of a transformers Qwen3 of the same shape, at several concurrencies (requests/s, output
tokens/s, p50 and p99 time to first token and latency), then a soak of `angpt serve` with valid requests, every kind
of bad request and clients that leave mid-stream, with the server's RSS before and after and the valid requests that
failed (docs/tools.md, "Serving under load, measured").

    python bench/serve_load.py [--concurrency 1 8 32 64 --prompt 32 --new 32 --soak 2000 --threads 1]

Random-init models, seed 0, float32, d=128, 4 layers, 4 heads, context 1024, a byte-level BPE of 4096 tokens
learnt on the demo corpus; the anGPT checkpoint is exported (folded), the form one serves. Both servers run at once
on 127.0.0.1 with the same paged cache (32-token blocks, room for 8 requests of full context, 256 tokens a batch:
`angpt serve`'s CPU default) and the same torch threads; every concurrency runs on each server in turn, twice,
alternating, and the medians are printed. Each request streams a completion of --new tokens (`stream_options`
gives its token count); time to first token is the first event with text. Last, the two requests that kill
transformers' own continuous-batching worker are sent to `transformers serve` (restarted between them), for the
record of what `angpt serve` guards against.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy

from results_file import help_description, machine_line
from serve_soak import BODY_LIMIT, drain, soak, streamed, upstream_check

REPO = Path(__file__).resolve().parents[1]
KEY = "sk-serve-load"
SHAPE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
             max_position_embeddings=1024, vocab_size=4096)
CACHE_FLAGS = ["--cb-block-size", "32", "--cb-num-blocks", "256", "--cb-max-batch-tokens", "256"]


def build_checkpoints(root: Path) -> tuple[Path, Path, list[str]]:
    """The folded anGPT and the Qwen3 checkpoints with one tokenizer; and lines of the corpus for prompts."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
    from modeling_angpt.export.fold import export_checkpoint
    from modeling_angpt.data.sources import shakespeare_files

    lines = [line.strip() for path in shakespeare_files() for line in path.read_text().splitlines()
             if len(line.strip()) > 30]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(lines[:40000], trainers.BpeTrainer(
        vocab_size=SHAPE["vocab_size"], special_tokens=["<unk>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="<unk>")
    torch.manual_seed(0)
    AnGPTForCausalLM(AnGPTConfig(architecture="angpt", intermediate_size=512, **SHAPE)).save_pretrained(
        root / "angpt-training")
    fast.save_pretrained(root / "angpt-training")
    export_checkpoint(str(root / "angpt-training"), str(root / "angpt"))
    torch.manual_seed(0)
    Qwen3ForCausalLM(Qwen3Config(intermediate_size=512, head_dim=32, **SHAPE)).save_pretrained(root / "qwen3")
    fast.save_pretrained(root / "qwen3")
    return root / "angpt", root / "qwen3", lines


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command: list[str], port: int, threads: int, log: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(REPO)}
    with log.open("w") as output:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=output, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while True:
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"serve_load: the server did not start: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return server
        time.sleep(0.5)


def angpt_serve(path: Path, port: int, threads: int, log: Path, *flags: str) -> subprocess.Popen:
    entry = "import sys, angpt_cli; sys.exit(angpt_cli.main())"
    return start([sys.executable, "-c", entry, "serve", str(path), "--port", str(port), "--log-level", "warning",
                  "--api-key", KEY, *CACHE_FLAGS, *flags], port, threads, log)


def transformers_serve(path: Path, port: int, threads: int, log: Path) -> subprocess.Popen:
    cli = str(Path(sys.executable).with_name("transformers"))
    return start([cli, "serve", str(path), "--continuous-batching", "--host", "127.0.0.1", "--port", str(port),
                  "--log-level", "warning", *CACHE_FLAGS], port, threads, log)


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


async def load(base: str, model: str, prompts: list[str], concurrency: int, requests: int, new: int) -> dict:
    results = []

    async def stream_one(client: httpx.AsyncClient, index: int) -> None:
        body = {"model": model, "prompt": prompts[index % len(prompts)], "max_tokens": new, "temperature": 0}
        results.append(await streamed(client, body))

    wall = await drain(base, KEY, concurrency, 600, list(range(requests)), stream_one)
    done = [result for result in results if result["ok"]]
    ttft = [result["ttft"] for result in done if result["ttft"] is not None]
    latency = [result["latency"] for result in done]
    return {"requests/s": len(done) / wall, "tokens/s": sum(result["tokens"] for result in done) / wall,
            "ttft50": percentile(ttft, 50), "ttft99": percentile(ttft, 99), "lat50": percentile(latency, 50),
            "lat99": percentile(latency, 99), "failed": len(results) - len(done)}


def percentile(values: list[float], q: float) -> float:
    return float(numpy.percentile(values, q)) if values else float("nan")  # linear between ranks


def median_of(runs: list[dict]) -> dict:
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=help_description(__doc__))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--requests", type=int, default=4,
                        help="requests per client in a run (a run: at least 16 requests)")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens, about (corpus lines)")
    parser.add_argument("--new", type=int, default=32, help="new tokens per request")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each concurrency on each server")
    parser.add_argument("--soak", type=int, default=2000, help="requests of the soak (0: none)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each server (OMP_NUM_THREADS)")
    parser.add_argument("--no-upstream-check", dest="upstream_check", action="store_false",
                        help="skip sending transformers serve the two requests that kill its worker")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        angpt_dir, qwen_dir, lines = build_checkpoints(root)
        prompts = make_prompts(angpt_dir, lines, args.prompt)
        ports = {"angpt": free_port(), "qwen3": free_port()}
        servers = {"angpt": angpt_serve(angpt_dir, ports["angpt"], args.threads, root / "angpt.log",
                                        "--max-request-bytes", str(BODY_LIMIT)),
                   "qwen3": transformers_serve(qwen_dir, ports["qwen3"], args.threads, root / "qwen3.log")}
        models = {"angpt": str(angpt_dir), "qwen3": str(qwen_dir)}
        print(f"{machine_line()} Servers: {args.threads} torch thread(s) each, both running.")
        print("| server | concurrency | requests/s | output tokens/s | TTFT p50 (s) | TTFT p99 (s) | latency p50 (s) "
              "| latency p99 (s) | failed |")
        print("|---|---|---|---|---|---|---|---|---|")
        try:
            for concurrency in args.concurrency:
                runs = {"angpt": [], "qwen3": []}
                requests = max(16, args.requests * concurrency)
                for _ in range(args.repeats):
                    for name in runs:
                        runs[name].append(asyncio.run(load(f"http://127.0.0.1:{ports[name]}", models[name], prompts,
                                                           concurrency, requests, args.new)))
                for name, label in (("angpt", "angpt serve (anGPT)"), ("qwen3", "transformers serve (Qwen3)")):
                    m = median_of(runs[name])
                    print(f"| {label} | {concurrency} | {m['requests/s']:.2f} | {m['tokens/s']:.0f} | "
                          f"{m['ttft50']:.3f} | {m['ttft99']:.3f} | {m['lat50']:.3f} | {m['lat99']:.3f} | "
                          f"{m['failed']:.0f} |", flush=True)
                ratio = median_of(runs["angpt"])["tokens/s"] / median_of(runs["qwen3"])["tokens/s"]
                print(f"<!-- concurrency {concurrency}: anGPT / Qwen3 output tokens/s = {ratio:.2f} -->", flush=True)
            stop(servers.pop("qwen3"))
            if args.soak:
                print(soak(f"http://127.0.0.1:{ports['angpt']}", models["angpt"], servers["angpt"], prompts,
                           args.soak, KEY))
        finally:
            for server in servers.values():
                stop(server)
        if args.upstream_check:
            for line in upstream_check(lambda port: transformers_serve(qwen_dir, port, args.threads,
                                                                       root / "upstream.log"),
                                       free_port, stop, str(qwen_dir), SHAPE["max_position_embeddings"]):
                print(line)


def make_prompts(path: Path, lines: list[str], length: int) -> list[str]:
    """Corpus text of about `length` tokens each, the same for both servers."""
    from transformers import AutoTokenizer

    tokenizer, rng, prompts = AutoTokenizer.from_pretrained(path), random.Random(0), []
    while len(prompts) < 256:
        start = rng.randrange(len(lines) - 20)
        ids = tokenizer(" ".join(lines[start:start + 20])).input_ids[:length]
        prompts.append(tokenizer.decode(ids))
    return prompts


if __name__ == "__main__":
    main()
