"""`angpt serve CHECKPOINT [--host H] [--port P]`: an OpenAI-compatible server (transformers' serving, continuous
batching on), a thin layer over `modeling_angpt.serving.serve_checkpoint`."""
from __future__ import annotations

import argparse
import os
import sys

from . import CommandError, int_at_least

DESCRIPTION = """Serve a checkpoint (training form or folded, with its tokenizer beside it) as an OpenAI-compatible
server: transformers' own server (`transformers serve`), the model loaded through this package's Auto classes.
/v1/completions and streaming always; /v1/chat/completions when the tokenizer has a chat template. Requests name the
model as CHECKPOINT is written here. Ctrl+C stops it."""


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
    parser.add_argument("--log-level", choices=("debug", "info", "warning", "error"), default="info",
                        help="the server's log level (default info)")


def validate(args: argparse.Namespace) -> None:
    """Before anything heavy is imported or loaded."""
    if not os.path.isdir(args.checkpoint):
        raise CommandError(f"checkpoint {args.checkpoint}: no such directory")
    if not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        raise CommandError(f"checkpoint {args.checkpoint}: not a checkpoint directory (no config.json)")


def run(args: argparse.Namespace) -> int:
    from ..checkpoint_check import CheckpointError
    from ..serving import ServeError, ServeOptions, check_checkpoint_servable, check_port_free, serve_checkpoint

    options = ServeOptions(**{name: value for name, value in vars(args).items()
                              if name in ServeOptions.__dataclass_fields__})
    try:
        check_port_free(options.host, options.port)
        has_chat_template = check_checkpoint_servable(options)
    except (CheckpointError, ServeError, OSError) as error:
        print(f"angpt serve: error: {error}", file=sys.stderr)
        return 1
    chat = "" if has_chat_template else " (no chat template in its tokenizer: /v1/chat/completions answers an error)"
    print(f"angpt serve: serving {options.checkpoint} at http://{options.host}:{options.port}/v1 as model "
          f"{options.checkpoint!r}{chat}; Ctrl+C stops", file=sys.stderr, flush=True)
    try:
        serve_checkpoint(options)
    except ServeError as error:
        print(f"angpt serve: error: {error}", file=sys.stderr)
        return 1
    return 0
