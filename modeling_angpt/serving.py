"""An OpenAI-compatible server for a checkpoint (training form or folded): transformers' own server (`transformers
serve`: FastAPI and uvicorn; /v1/completions, /v1/chat/completions, streaming, continuous batching), with the model
loaded through the Auto classes of this installed package (docs/tools.md, "transformers serve"). `angpt serve`
(modeling_angpt/commands/serve.py) is a thin layer over `serve_checkpoint`.

Why not `transformers serve CHECKPOINT` itself: in transformers 5.25 its loader looks the model class up as
`getattr(transformers, config.architectures[0])`, which a model outside transformers is not. `AutoModelLoader`
below is its loader with that one step replaced; everything else (the API, the tokenizer, chat templates, the
batching manager) is transformers'.
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import socket
from dataclasses import dataclass

from transformers.cli.serving import model_manager
from transformers.cli.serving.utils import parse_model_id


class ServeError(ValueError):
    """An argument or checkpoint the server cannot use; reported in one line, nothing started."""


@dataclass
class ServeOptions:
    """`cb_*`: the paged KV cache's block size, number of blocks and tokens per batch; None: transformers' sizes
    from the device's free memory on a GPU, `with_cpu_cache_sizes` on a CPU."""
    checkpoint: str
    host: str = "127.0.0.1"
    port: int = 8000
    continuous_batching: bool = True
    device: str = "auto"
    dtype: str = "auto"
    attn_implementation: str | None = None
    cb_block_size: int | None = None
    cb_num_blocks: int | None = None
    cb_max_batch_tokens: int | None = None
    log_level: str = "info"


class AutoModelLoader(model_manager.ModelLoader):
    """transformers' model loader, loading through AutoModelForCausalLM (this package registers its classes when
    imported, so a training checkpoint without remote code loads too). The server pickles its loader into the
    model's process: there this module is imported, and with it the package's registration."""

    def _load_model(self, model_id: str, tqdm_class=None, progress_callback=None):
        from transformers import AutoModelForCausalLM

        from . import register_auto_classes

        register_auto_classes()
        repo, revision, _ = parse_model_id(model_id)
        kwargs = dict(revision=revision, attn_implementation=self.attn_implementation, dtype=self.dtype,
                      device_map=self.device, tqdm_class=tqdm_class)
        quantization_config = self.get_quantization_config()
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        return AutoModelForCausalLM.from_pretrained(repo, **kwargs)


def check_port_free(host: str, port: int) -> None:
    """One line before anything loads when the server could not listen there (uvicorn would fail after the model
    has loaded, with a traceback)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ServeError(f"--host {host}: not an address to listen on ({error.strerror})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise ServeError(f"--port {port}: {host}:{port} is already in use; pick another port") from None
            raise ServeError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None


def check_checkpoint_servable(options: ServeOptions) -> bool:
    """The checkpoint's config and weights match, and continuous batching computes its attention; returns whether
    its tokenizer has a chat template (/v1/chat/completions needs one)."""
    from transformers import AutoTokenizer

    from .checkpoint_check import check_checkpoint
    from .paged_angpt import check_paged_support

    config, _ = check_checkpoint(options.checkpoint)
    if options.continuous_batching:
        try:
            check_paged_support(config)
        except ValueError as error:
            raise ServeError(f"{error} (or serve without it: --no-continuous-batching)") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(options.checkpoint)
    except (OSError, ValueError) as error:
        raise ServeError(f"{options.checkpoint}: no usable tokenizer beside the checkpoint ({error})") from None
    return tokenizer.chat_template is not None


# transformers sizes the paged KV cache and its batches from the device's free memory; on a CPU that is RAM: a d=32
# test model took 14.8 GB and 2.5 minutes before its first request (docs/tools.md, "transformers serve"). A server
# on a CPU without --cb-* flags gets room for this many requests of full context length instead.
CPU_FULL_LENGTH_REQUESTS, CPU_BLOCK_SIZE, CPU_MAX_BATCH_TOKENS = 8, 32, 256


def runs_on_cpu(device: str) -> bool:
    import torch

    return device == "cpu" or (device == "auto" and not torch.cuda.is_available()
                               and not torch.backends.mps.is_available())


def with_cpu_cache_sizes(options: ServeOptions, max_position_embeddings: int) -> ServeOptions:
    """`options` with the CPU's cache sizes filled in (above), unless a --cb-* flag was given or a GPU serves."""
    flags = (options.cb_block_size, options.cb_num_blocks, options.cb_max_batch_tokens)
    if not options.continuous_batching or any(flag is not None for flag in flags) or not runs_on_cpu(options.device):
        return options
    blocks = -(-CPU_FULL_LENGTH_REQUESTS * max_position_embeddings // CPU_BLOCK_SIZE)  # ceiling
    return dataclasses.replace(options, cb_block_size=CPU_BLOCK_SIZE, cb_num_blocks=blocks,
                               cb_max_batch_tokens=CPU_MAX_BATCH_TOKENS)


@contextlib.contextmanager
def loading_through_auto_classes():
    """transformers' `Serve` builds its `ModelLoader` from the module's name when constructed: ours meanwhile."""
    original = model_manager.ModelLoader
    model_manager.ModelLoader = AutoModelLoader
    try:
        yield
    finally:
        model_manager.ModelLoader = original


def serve_checkpoint(options: ServeOptions) -> None:
    """Serve until stopped (Ctrl+C, SIGTERM). Requests name the model as `options.checkpoint` (or name none)."""
    from transformers import AutoConfig
    from transformers.cli.serve import Serve

    from . import register_auto_classes

    if not os.path.isfile(os.path.join(options.checkpoint, "config.json")):
        raise ServeError(f"checkpoint {options.checkpoint}: not a checkpoint directory (no config.json)")
    check_port_free(options.host, options.port)
    register_auto_classes()
    options = with_cpu_cache_sizes(options, AutoConfig.from_pretrained(options.checkpoint).max_position_embeddings)
    with loading_through_auto_classes():
        Serve(force_model=options.checkpoint, continuous_batching=options.continuous_batching,
              attn_implementation=options.attn_implementation, device=options.device, dtype=options.dtype,
              cb_block_size=options.cb_block_size, cb_num_blocks=options.cb_num_blocks,
              cb_max_batch_tokens=options.cb_max_batch_tokens, host=options.host, port=options.port,
              log_level=options.log_level)
