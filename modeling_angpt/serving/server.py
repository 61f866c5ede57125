"""An OpenAI-compatible server for a checkpoint (training form or folded): transformers' own server (`transformers
serve`: FastAPI and uvicorn; /v1/completions, /v1/chat/completions, streaming, continuous batching), with the model
loaded through the Auto classes of this installed package (docs/tools.md, "transformers serve"). `angpt serve`
(modeling_angpt/commands/serve.py) is a thin layer over `serve_checkpoint`.

Why not `transformers serve CHECKPOINT` itself: in transformers 5.25 its loader looks the model class up as
`getattr(transformers, config.architectures[0])`, which a model outside transformers is not. `AutoModelLoader`
below is its loader with that one step replaced; everything else (the API, the tokenizer, chat templates, the
batching manager) is transformers'.

What a server facing clients needs on top (docs/tools.md, "angpt serve facing clients"): a guard in front of
transformers' FastAPI app (modeling_angpt/serving/guard.py: API key, body size, a bound on requests held, each request's
fields, a time limit), the prompt fitted to the model's context before it reaches the worker (`SupervisedEngineClient`),
and a model worker that dies restarted (`SupervisedEngineClient`), or the process exiting non-zero once its restarts are
spent. They go in where transformers' `Serve.run` looks its parts up, its modules' `ModelLoader`, `EngineClient` and
`build_server` (`serving_parts`), so its server runs otherwise unchanged.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import functools
import ipaddress
import os
import socket
import threading
from dataclasses import dataclass

from transformers.cli.serving import model_manager
from transformers.cli.serving.utils import EngineDeadError, parse_model_id, prompt_length
from transformers.utils import logging

from .guard import GuardOptions, RequestGuard
from .requests import REQUESTED_MAX_TOKENS, RequestError, fit_to_context

logger = logging.get_logger("transformers.cli.serving")


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
    max_model_len: int | None = None
    log_level: str = "info"
    api_key: str | None = None
    max_concurrent_requests: int = 128
    request_timeout: float | None = 600.0
    max_request_bytes: int = 8 * 2**20
    max_worker_restarts: int = 3


class AutoModelLoader(model_manager.ModelLoader):
    """transformers' model loader, loading through AutoModelForCausalLM (this package registers its classes when
    imported, so a training checkpoint without remote code loads too). The server pickles its loader into the
    model's process: there this module is imported, and with it the package's registration."""

    def _load_model(self, model_id: str, tqdm_class=None, progress_callback=None):
        from transformers import AutoModelForCausalLM

        from .. import register_auto_classes

        register_auto_classes()
        repo, revision, _ = parse_model_id(model_id)
        kwargs = dict(revision=revision, attn_implementation=self.attn_implementation, dtype=self.dtype,
                      device_map=self.device, tqdm_class=tqdm_class)
        quantization_config = self.get_quantization_config()
        if quantization_config is not None:
            kwargs["quantization_config"] = quantization_config
        return remember_batching_manager(AutoModelForCausalLM.from_pretrained(repo, **kwargs))


def remember_batching_manager(model):
    """The model keeps the batching manager transformers' worker starts on it (`serving_batching_manager`), for
    /metrics to read its KV cache in the model's process (`guard.batching_state`)."""
    start = model.init_continuous_batching

    def start_and_remember(*args, **kwargs):
        model.serving_batching_manager = start(*args, **kwargs)
        return model.serving_batching_manager

    model.init_continuous_batching = start_and_remember
    return model


class SupervisedEngineClient(model_manager.EngineClient):
    """transformers' client of the model's process, which (1) fits each request's new tokens to the model's context
    before sending it (`fit_to_context`: a 400, never a dead worker) and (2) restarts the model's process when its
    worker dies (the process crashed or was killed, or its continuous-batching thread raised), at most
    `max_restarts` times in the server's life: requests in flight get a 503 naming the cause, later ones wait for
    the new process. Past that it is marked dead as transformers does, and the server stops (exit code 1) for a
    process supervisor to restart it. `supervised_engine_client` sets `max_restarts` per server."""

    max_restarts = 3
    fatal_error_seen: str | None = None  # the death that stopped the server, for the command's last line

    def __init__(self, *args, **kwargs):
        self.restarting, self.restarts = False, 0
        super().__init__(*args, **kwargs)

    async def generate_non_streaming(self, inputs: dict, generation_kwargs: dict):
        self.fit_to_context(inputs, generation_kwargs)
        return await super().generate_non_streaming(inputs, generation_kwargs)

    def generate_streaming(self, inputs: dict, generation_kwargs: dict, *args, **kwargs):
        self.fit_to_context(inputs, generation_kwargs)
        return super().generate_streaming(inputs, generation_kwargs, *args, **kwargs)

    async def _send_request(self, *args, **kwargs):
        while self.restarting:  # the old process is going: wait for the new one rather than write to its queue
            await asyncio.sleep(0.1)
        return await super()._send_request(*args, **kwargs)

    def fit_to_context(self, inputs: dict, generation_kwargs: dict) -> None:
        context = self.generation_state.context_length(self.model_config)
        generation_kwargs["max_new_tokens"] = fit_to_context(
            prompt_length(inputs), generation_kwargs["max_new_tokens"], context, REQUESTED_MAX_TOKENS.get())

    def _mark_dead(self, reason: str) -> None:
        reason = reason.rstrip(".")
        if self.restarting:  # a late report of the death being handled (the old process' last messages)
            return
        if self.externally_managed or self.restarts >= self.max_restarts:
            type(self).fatal_error_seen = reason
            return super()._mark_dead(reason)
        self.restarting, self.restarts = True, self.restarts + 1
        logger.error(f"The model's worker died ({reason}): restarting it (restart {self.restarts} of at most "
                     f"{self.max_restarts}, --max-worker-restarts)")
        self.fail_requests_in_flight(EngineDeadError(f"The model's worker died while answering ({reason}); it is "
                                                     "restarting: retry"))
        threading.Thread(target=self.restart, args=(reason,), name="model-restart", daemon=True).start()

    def fail_requests_in_flight(self, error: Exception) -> None:
        def fail() -> None:  # on the event loop, which owns the futures
            for future, _ in list(self.pending_requests.values()):
                if not future.done():
                    future.set_result(error)

        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fail)

    def restart(self, reason: str) -> None:
        try:
            self.shutdown(f"The model's worker died ({reason}); it is restarting")
            self.start()  # waits for the old process to exit (shutdown holds the lock until then)
        except Exception as error:
            self.restarting = False
            self._mark_dead(f"restarting the model's worker failed: {type(error).__name__}: {error}")
            return
        self.restarting = False
        logger.warning(f"The model's worker is back (restart {self.restarts} of at most {self.max_restarts})")


def supervised_engine_client(max_restarts: int) -> type:
    return type("SupervisedEngineClient", (SupervisedEngineClient,), {"max_restarts": max_restarts})


def guarded_build_server(build_server, guard: GuardOptions, model_manager_, *args, **kwargs):
    """transformers' FastAPI app with the guard outermost, and a request refused inside the app (its prompt does not
    fit the context) answered as the guard answers: OpenAI's error body with the request's status."""
    from starlette.responses import JSONResponse

    app = build_server(model_manager_, *args, **kwargs)

    async def refuse(_request, error: RequestError):
        return JSONResponse(error.body(), status_code=error.status)

    app.add_exception_handler(RequestError, refuse)
    app.add_middleware(RequestGuard, options=guard, model_manager=model_manager_)
    return app


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

    from ..inference.checkpoint_check import check_checkpoint
    from ..paged_angpt import check_paged_support

    config, _ = check_checkpoint(options.checkpoint)
    context = config.max_position_embeddings
    if options.max_model_len is not None and options.max_model_len > context:
        raise ServeError(f"--max-model-len {options.max_model_len}: longer than the model's context ({context} "
                         "tokens), past which its answers are wrong")
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
    """`options` with the CPU's cache sizes filled in (above), unless a --cb-* flag was given or a GPU serves; the
    full length is --max-model-len when given."""
    flags = (options.cb_block_size, options.cb_num_blocks, options.cb_max_batch_tokens)
    if not options.continuous_batching or any(flag is not None for flag in flags) or not runs_on_cpu(options.device):
        return options
    full_length = min(max_position_embeddings, options.max_model_len or max_position_embeddings)
    blocks = -(-CPU_FULL_LENGTH_REQUESTS * full_length // CPU_BLOCK_SIZE)  # ceiling
    return dataclasses.replace(options, cb_block_size=CPU_BLOCK_SIZE, cb_num_blocks=blocks,
                               cb_max_batch_tokens=CPU_MAX_BATCH_TOKENS)


def open_to_others_warning(host: str, api_key: str | None) -> str | None:
    """The one warning line for a server others can reach without a key (None: a key, or loopback only)."""
    if api_key:
        return None
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        if addresses and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses):
            return None
    except (socket.gaierror, ValueError):
        pass
    return (f"angpt serve: warning: listening on {host} without an API key: whoever reaches it can use the model "
            "(--api-key or ANGPT_API_KEY)")


@contextlib.contextmanager
def serving_parts(options: ServeOptions):
    """transformers' `Serve` looks up `ModelLoader`, `EngineClient` and `build_server` in its modules when it runs:
    ours meanwhile (the module docstring says why each)."""
    from transformers.cli.serving import server

    guard = GuardOptions(api_key=options.api_key, max_concurrent_requests=options.max_concurrent_requests,
                         request_timeout=options.request_timeout, max_request_bytes=options.max_request_bytes)
    parts = [(model_manager, "ModelLoader", AutoModelLoader),
             (model_manager, "EngineClient", supervised_engine_client(options.max_worker_restarts)),
             (server, "build_server", functools.partial(guarded_build_server, server.build_server, guard))]
    originals = [(module, name, getattr(module, name)) for module, name, _ in parts]
    for module, name, part in parts:
        setattr(module, name, part)
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


def serve_checkpoint(options: ServeOptions) -> None:
    """Serve until stopped (Ctrl+C, SIGTERM). Requests name the model as `options.checkpoint` (or name none)."""
    from transformers import AutoConfig
    from transformers.cli.serve import Serve

    from .. import register_auto_classes

    if not os.path.isfile(os.path.join(options.checkpoint, "config.json")):
        raise ServeError(f"checkpoint {options.checkpoint}: not a checkpoint directory (no config.json)")
    check_port_free(options.host, options.port)
    register_auto_classes()
    options = with_cpu_cache_sizes(options, AutoConfig.from_pretrained(options.checkpoint).max_position_embeddings)
    with serving_parts(options):
        try:
            Serve(force_model=options.checkpoint, continuous_batching=options.continuous_batching,
                  attn_implementation=options.attn_implementation, device=options.device, dtype=options.dtype,
                  cb_block_size=options.cb_block_size, cb_num_blocks=options.cb_num_blocks,
                  cb_max_batch_tokens=options.cb_max_batch_tokens, max_model_len=options.max_model_len,
                  host=options.host, port=options.port, log_level=options.log_level)
        except RuntimeError:
            died = model_manager.EngineClient.fatal_error_seen
            if died is None:
                raise
            restarts = f"{options.max_worker_restarts} restart{'s' * (options.max_worker_restarts != 1)}"
            raise ServeError(f"the model's worker died again after {restarts} (--max-worker-restarts): {died}; "
                             "stopping") from None
