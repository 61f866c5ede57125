"""`angpt serve CHECKPOINT [--host H] [--port P]`: an OpenAI-compatible server (transformers' serving, continuous
batching on), a thin layer over `modeling_angpt.serving.server.serve_checkpoint`."""
from __future__ import annotations

import argparse
import os
import sys

from . import CommandError, float_at_least, int_at_least

API_KEY_VARIABLE = "ANGPT_API_KEY"

DESCRIPTION = """Serve a checkpoint (training form or folded, with its tokenizer beside it) as an OpenAI-compatible
server: transformers' own server (`transformers serve`), the model loaded through this package's Auto classes.
/v1/completions and streaming always; /v1/chat/completions when the tokenizer has a chat template. Requests name the
model as CHECKPOINT is written here. Each request is checked before it reaches the model (a bad one is a 4xx with
one line); a model worker that dies is restarted, up to --max-worker-restarts times, then the server exits with
status 1. Ctrl+C stops it."""


def port_number(text: str) -> int:
    port = int_at_least(1)(text)
    if port > 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {port}")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("checkpoint", help="checkpoint directory with its tokenizer (e.g. runs/demo/folded)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0: all)")
    parser.add_argument("--port", type=port_number, default=8000, help="port to listen on (default 8000)")
    parser.add_argument("--no-continuous-batching", dest="continuous_batching", action="store_false",
                        help="generate request by request with generate() instead of transformers' continuous "
                             "batching (the paged KV cache), e.g. for attention variants it cannot compute")
    parser.add_argument("--device", default="auto", help="device for the model: auto (default), cpu, cuda, cuda:1")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default="auto",
                        help="dtype to run the model in (default auto: the checkpoint's)")
    parser.add_argument("--attn-implementation", default=None,
                        help="attention implementation (default: the checkpoint's; continuous batching takes sdpa, "
                             "eager or a flash kernel)")
    parser.add_argument("--cb-block-size", type=int_at_least(1), default=None,
                        help="continuous batching: tokens per KV-cache block (default: transformers' on a GPU, "
                             "32 on a CPU)")
    parser.add_argument("--cb-num-blocks", type=int_at_least(1), default=None,
                        help="continuous batching: KV-cache blocks (default: sized from a GPU's free memory; on a "
                             "CPU, room for 8 requests of the model's full context length)")
    parser.add_argument("--cb-max-batch-tokens", type=int_at_least(1), default=None,
                        help="continuous batching: tokens per forward (default: sized from a GPU's free memory; "
                             "256 on a CPU)")
    parser.add_argument("--max-model-len", type=int_at_least(2), default=None,
                        help="the longest a request may be, prompt and answer, in tokens (default: the model's "
                             "context, max_position_embeddings)")
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                        help="the server's log level (default info)")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_VARIABLE) or None,
                        help=f"key callers must send as 'Authorization: Bearer KEY' (OpenAI clients' api_key); "
                             f"default: the {API_KEY_VARIABLE} environment variable, else none (anyone may call)")
    parser.add_argument("--max-concurrent-requests", type=int_at_least(1), default=128,
                        help="requests the server holds at once, running or waiting for room in the batch; one "
                             "more is answered 429 at once (default 128)")
    parser.add_argument("--request-timeout", type=float_at_least(0), default=600.0,
                        help="seconds a request may run before it is stopped (504, or an error event ending its "
                             "stream); 0: no limit (default 600)")
    parser.add_argument("--max-request-bytes", type=int_at_least(1), default=8 * 2**20,
                        help="largest request body taken, in bytes; a larger one is answered 413 (default 8 MiB)")
    parser.add_argument("--max-worker-restarts", type=int_at_least(0), default=3,
                        help="times the model's worker is restarted when it dies, in the server's life; once "
                             "spent, the server exits with status 1 for a process supervisor to restart it "
                             "(default 3)")


def validate(args: argparse.Namespace) -> None:
    """Before anything heavy is imported or loaded."""
    if not os.path.isdir(args.checkpoint):
        raise CommandError(f"checkpoint {args.checkpoint}: no such directory")
    if not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        raise CommandError(f"checkpoint {args.checkpoint}: not a checkpoint directory (no config.json)")


def run(args: argparse.Namespace) -> int:
    from ..dependencies.ledger import serving_refusal

    # transformers' server internals this one replaces: checked before they are imported, the port bound or the
    # model loaded (modeling_angpt/dependencies/ledger.py)
    refusal = serving_refusal()
    if refusal is not None:
        print(f"angpt serve: error: {refusal}", file=sys.stderr)
        return 1
    from ..inference.checkpoint_check import CheckpointError
    from ..serving.server import (ServeError, ServeOptions, check_checkpoint_servable, check_port_free,
                           open_to_others_warning, serve_checkpoint)

    options = ServeOptions(**{name: value for name, value in vars(args).items()
                              if name in ServeOptions.__dataclass_fields__})
    options.request_timeout = options.request_timeout or None  # 0: no limit
    try:
        check_port_free(options.host, options.port)
        has_chat_template = check_checkpoint_servable(options)
    except (CheckpointError, ServeError, OSError) as error:
        print(f"angpt serve: error: {error}", file=sys.stderr)
        return 1
    chat = "" if has_chat_template else " (no chat template in its tokenizer: /v1/chat/completions answers an error)"
    print(f"angpt serve: serving {options.checkpoint} at http://{options.host}:{options.port}/v1 as model "
          f"{options.checkpoint!r}{chat}; Ctrl+C stops", file=sys.stderr, flush=True)
    warning = open_to_others_warning(options.host, options.api_key)
    if warning is not None:
        print(warning, file=sys.stderr, flush=True)
    try:
        serve_checkpoint(options)
    except ServeError as error:
        print(f"angpt serve: error: {error}", file=sys.stderr)
        return 1
    return 0
