"""The ledger of other projects' private and internal names this project's code touches (docs/usage.md, "Supported
versions"): for each, the module, the name, why it is used, where, and the versions it was checked with.

A private name (`_x`) or an internal one (transformers' server parts under `transformers.cli.serving`, the continuous
batching manager's cache) carries no promise: any minor release may rename it, and the code using it would fail deep
in a run, or worse, an override of a method that is gone would silently never run. `missing_entries` finds the
entries an installed version lacks; tests/contract/test_internals_ledger.py fails with one line naming each, and
`angpt serve` refuses to start on one (modeling_angpt/commands/serve.py), before it binds a port.

Checked with: the versions `make test` installs (setup.cfg's [dev], Makefile's torch) and the declared minimums
`make test-min-versions` installs. An entry whose project is not installed is not checked (its code does not run).
"""
from __future__ import annotations

import ast
import importlib
import importlib.metadata
import inspect
import os
import textwrap
from dataclasses import dataclass

# The versions each project's entries were checked with: `make test-min-versions` (the floor) and `make test`.
TRANSFORMERS = ("5.24.0", "5.25.0")
# transformers' server before 5.25 has no engine client or model loader to replace: angpt serve needs 5.25 ([tools])
TRANSFORMERS_SERVER = ("5.25.0",)
TORCH = ("2.8.0", "2.13.0")
ACCELERATE = ("1.10.0", "1.16.0")
BITSANDBYTES = ("0.50.2",)
LM_EVAL = ("0.4.13",)

# where the names are used, and the modules of transformers' server and continuous batching
_SERVER = "transformers.cli.serving.model_manager"
SERVING, GUARD = "modeling_angpt/serving/server.py", "modeling_angpt/serving/guard.py"
CONFIG, PRETRAINED = "modeling_angpt/configuration_angpt.py", "modeling_angpt/pretrained_angpt.py"
MODEL_FILES, FLEX = "modeling_angpt/modeling_angpt.py, pretrained_angpt.py", "modeling_angpt/flex_angpt.py"
_CACHE = "transformers.generation.continuous_batching"
PAGED = "modeling_angpt/paged_angpt.py"
# Modules of another project that carry no promise although no part of their name is private: any name imported from
# them belongs in the ledger (tests/contract/test_internals_ledger.py reads this).
INTERNAL_MODULES = ("transformers.cli.serving", "transformers.cli.serve", _CACHE)


@dataclass(frozen=True)
class Entry:
    """`name` is a dotted path inside `module` ("Class.method"); `on_instances`: its last part is an attribute
    transformers sets on instances (`self.x = ...` in the class's own code) rather than a class attribute."""
    distribution: str
    module: str
    name: str
    used_in: str
    why: str
    checked_with: tuple[str, ...]
    on_instances: bool = False
    key: str | None = None  # a key of the registry `name` (an attention function transformers registers)

    def label(self) -> str:
        return f"{self.module}.{self.name}" + ("" if self.key is None else f"[{self.key!r}]")


def _transformers_model(name: str, why: str) -> Entry:
    """A `PreTrainedModel` class attribute or method a model of transformers' own sets or overrides."""
    return Entry("transformers", "transformers", f"PreTrainedModel.{name}", MODEL_FILES, why, TRANSFORMERS)


def _serving(module: str, name: str, used_in: str, why: str, on_instances: bool = False) -> Entry:
    return Entry("transformers", module, name, used_in, why, TRANSFORMERS_SERVER, on_instances)


MODEL_ENTRIES = (
    _transformers_model("_check_and_adjust_attn_implementation",
                        "overridden: the attention backend is checked against the variant where it is chosen"),
    _transformers_model("_init_weights", "overridden: each architecture's initialisation and re-filled buffers"),
    _transformers_model("_keep_in_fp32_modules", "read and set: scales stay float32 under quantization"),
    _transformers_model("_tied_weights_keys", "set: lm_head tied to embed_tokens; read by checkpoint_check.py"),
    _transformers_model("_no_split_modules", "set: device_map keeps a decoder block on one device"),
    _transformers_model("_skip_keys_device_placement", "set: the KV cache is not moved by accelerate's hooks"),
    _transformers_model("_supports_sdpa", "set: sdpa is a backend of ours"),
    _transformers_model("_supports_flash_attn", "set: flash-attn is a backend of ours"),
    _transformers_model("_supports_flex_attn", "set: FlexAttention is a backend of ours"),
    _transformers_model("_supports_attention_backend", "set: registered attention functions are accepted"),
    _transformers_model("_can_record_outputs", "set: hidden states and attentions recorded by hooks"),
    _transformers_model("_can_compile_fullgraph", "set: generate may compile the forward"),
    _transformers_model("_tp_plan", "set: the tensor-parallel plan of lm_head (docs/architectures.md)"),
    _transformers_model("_pp_plan", "set: the pipeline-parallel plan of lm_head (docs/architectures.md)"),
    _transformers_model("_auto_class", "read: a remote-code save writes auto_map for every Auto class"),
    Entry("transformers", "transformers", "PreTrainedConfig._attn_implementation", CONFIG,
          "overridden property: an assignment checks the backend computes the variant", TRANSFORMERS),
    Entry("transformers", "transformers", "PreTrainedConfig._attn_implementation_internal", CONFIG,
          "what the overridden property stores", TRANSFORMERS, on_instances=True),
    Entry("transformers", "transformers.modeling_rope_utils", "RotaryEmbeddingConfigMixin._check_received_keys",
          CONFIG, "a rope type of ours validates its keys as transformers' own do", TRANSFORMERS),
)

SERVING_ENTRIES = (
    _serving(_SERVER, "ModelLoader", SERVING, "replaced while serving: loads through the Auto classes"),
    _serving(_SERVER, "ModelLoader._load_model", SERVING, "overridden: AutoModelForCausalLM, not "
             "getattr(transformers, architectures[0])"),
    _serving(_SERVER, "ModelLoader.get_quantization_config", SERVING, "called by the overridden loader"),
    _serving(_SERVER, "EngineClient", SERVING, "replaced while serving: restarts a dead model worker"),
    _serving(_SERVER, "EngineClient._send_request", SERVING, "overridden: waits while the worker restarts"),
    _serving(_SERVER, "EngineClient._mark_dead", SERVING, "overridden: restarts the worker instead"),
    _serving(_SERVER, "EngineClient._loop", SERVING, "the event loop that owns requests in flight",
             on_instances=True),
    _serving(_SERVER, "EngineClient.pending_requests", SERVING, "requests in flight, failed on a restart",
             on_instances=True),
    _serving(_SERVER, "EngineClient.externally_managed", SERVING, "a worker it does not own is not restarted",
             on_instances=True),
    _serving(_SERVER, "EngineClient.generation_state", SERVING, "the context length a request is fitted to",
             on_instances=True),
    _serving(_SERVER, "EngineClient.shutdown", SERVING, "stops the dead worker before a restart"),
    _serving(_SERVER, "EngineClient.start", SERVING, "starts the new worker"),
    _serving(_SERVER, "EngineClient.submit", GUARD, "runs the /metrics probe in the model's process"),
    _serving(_SERVER, "EngineClient.process_running", GUARD, "/metrics asks a live worker only"),
    _serving(_SERVER, "ModelManager.engines", GUARD, "the workers /health and /metrics report on",
             on_instances=True),
    _serving("transformers.cli.serving.server", "build_server", SERVING,
             "wrapped while serving: the guard goes outermost on its FastAPI app"),
    _serving("transformers.cli.serving.utils", "GenerationState.context_length", SERVING,
             "the context a request's new tokens are fitted to"),
    _serving("transformers.cli.serving.utils", "parse_model_id", SERVING, "the overridden loader's argument"),
    _serving("transformers.cli.serving.utils", "prompt_length", SERVING, "a request's prompt, in tokens"),
    _serving("transformers.cli.serving.utils", "EngineDeadError", SERVING, "the error requests in flight get"),
    _serving("transformers.cli.serve", "Serve", SERVING, "the server itself"),
    _serving(f"{_CACHE}.continuous_api", "ContinuousBatchingManager.batch_processor", GUARD,
             "/metrics: the running batch's cache and scheduler", on_instances=True),
    _serving(f"{_CACHE}.continuous_api", "ContinuousBatchProcessor.cache", GUARD,
             "/metrics: the paged KV cache", on_instances=True),
    _serving(f"{_CACHE}.continuous_api", "ContinuousBatchProcessor.scheduler", GUARD,
             "/metrics: requests running and waiting", on_instances=True),
    _serving(f"{_CACHE}.cache", "PagedAttentionCache.cache_allocators", GUARD,
             "/metrics: each allocator's block ledger", on_instances=True),
    _serving(f"{_CACHE}.cache", "PagedAttentionCache.compute_free_capacity", GUARD,
             "/metrics: free bytes of the KV cache"),
    _serving(f"{_CACHE}.cache", "PagedAttentionCache.num_blocks", GUARD, "/metrics: blocks in all",
             on_instances=True),
    _serving(f"{_CACHE}.cache_allocators.cache_allocator", "CacheAllocator.ledger", GUARD,
             "/metrics: the cache ledger", on_instances=True),
    _serving(f"{_CACHE}.cache_allocators.cache_allocator", "CacheAllocator.bytes_per_block", GUARD,
             "/metrics: bytes to blocks", on_instances=True),
    _serving(f"{_CACHE}.cache_allocators.cache_allocator", "BlockLedger.cached_blocks", GUARD,
             "/metrics: blocks kept for prefix sharing count as free", on_instances=True),
    _serving(f"{_CACHE}.scheduler", "Scheduler.active_requests", GUARD, "/metrics: requests running",
             on_instances=True),
    _serving(f"{_CACHE}.scheduler", "Scheduler.waiting_requests", GUARD, "/metrics: requests waiting",
             on_instances=True),
)

# Continuous batching hands the model its paged cache; attention then runs through transformers' own functions
PAGED_ENTRIES = (
    Entry("transformers", f"{_CACHE}.cache", "PagedAttentionCache", PAGED,
          "the cache the batching manager passes: attention goes to transformers' paged functions when it is one",
          TRANSFORMERS),
    Entry("transformers", f"{_CACHE}.cache", "PagedAttentionCache.update", PAGED,
          "writes a layer's new keys and values to their pages and narrows the manager's keyword arguments to it",
          TRANSFORMERS),
    Entry("transformers", "transformers.modeling_utils", "ALL_ATTENTION_FUNCTIONS", PAGED,
          "the eager attention over pages, which the manager's 'eager' means", TRANSFORMERS, key="paged|eager"),
)

TORCH_ENTRIES = (
    Entry("torch", "torch._dynamo", "mark_static", FLEX,
          "FlexAttention's sizes become constants of its compiled kernel", TORCH),
    Entry("torch", "torch._dynamo", "mark_static_address", "modeling_angpt/attention_layout_angpt.py",
          "the static KV cache's storage is not copied by cudagraphs", TORCH),
    Entry("torch", "torch._dynamo.config", "specialize_float", FLEX,
          "Python floats stay constants of the compiled FlexAttention", TORCH),
    Entry("torch", "torch._dynamo.exc", "BackendCompilerFailed", FLEX,
          "a failed compile falls back to the chunked path", TORCH),
    Entry("torch", "torch.fx.experimental._config", "backed_size_oblivious", FLEX,
          "sizes 1 and equal sizes do not become guards (one compile, not one per shape)", TORCH),
    Entry("torch", "torch.fx.experimental._config", "use_duck_shape", FLEX,
          "equal sizes stay separate symbols", TORCH),
    Entry("torch", "torch", "_foreach_copy_", "modeling_angpt/architectures_angpt.py",
          "the weight constraint writes every group's normalised rows in one call", TORCH),
    Entry("torch", "torch", "_foreach_div_", "modeling_angpt/architectures_angpt.py",
          "the weight constraint's divisions, one call for every group", TORCH),
    Entry("torch", "torch.nn", "Module._forward_hooks", "modeling_angpt/layers_angpt.py",
          "a module with hooks must be called, not read", TORCH, on_instances=True),
    Entry("torch", "torch.nn", "Module._forward_pre_hooks", "modeling_angpt/layers_angpt.py",
          "a module with hooks must be called, not read", TORCH, on_instances=True),
)

OTHER_ENTRIES = (
    Entry("accelerate", "accelerate.state", "PartialState._shared_state", "modeling_angpt/training/distributed.py",
          "FSDP2 on CPU processes: AcceleratorState re-reads the distributed type from it", ACCELERATE),
    Entry("bitsandbytes", "bitsandbytes.functional", "_convert_weight_packed_for_cpu_inverse", PRETRAINED,
          "a 4-bit layer packed for the AVX512-BF16 kernel back to the generic layout (docs/tools.md)",
          BITSANDBYTES),
    Entry("bitsandbytes", "bitsandbytes.nn", "Linear4bit.support_avx512bf16_for_cpu", PRETRAINED,
          "QLoRA on a CPU keeps the 4-bit layers on the generic path", BITSANDBYTES, on_instances=True),
    Entry("bitsandbytes", "bitsandbytes.functional", "_convert_weight_packed_for_cpu", PRETRAINED,
          "packs a layer and sets the QuantState fields packing_format_for_cpu and original_nested read there",
          BITSANDBYTES),
    Entry("transformers", "transformers", "PreTrainedModel._from_config", "bench/throughput.py and others",
          "a model from a config with a chosen attention backend, as transformers' own tests build them", TRANSFORMERS),
    Entry("torch", "torch._dynamo.config", "cache_size_limit", "bench/throughput.py",
          "room for the compiled shapes a benchmark sweeps", TORCH),
    Entry("torch", "torch._dynamo.utils", "counters", "bench/long_context_memory.py",
          "counts the graphs compiled, to show the long forward compiles once", TORCH),
    Entry("lm-eval", "lm_eval.tasks._yaml_loader", "load_yaml", "modeling_angpt/evaluation/selection.py",
          "a task YAML's dataset, with lm-eval's own !function and include handling", LM_EVAL),
)

ENTRIES = MODEL_ENTRIES + SERVING_ENTRIES + PAGED_ENTRIES + TORCH_ENTRIES + OTHER_ENTRIES


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _assigned_on_instances(cls: type, attribute: str) -> bool:
    """Whether the code of `cls` or a class it inherits from sets `self.<attribute>` (or declares it as a field)."""
    for klass in cls.__mro__:
        if attribute in getattr(klass, "__annotations__", {}):
            return True
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):  # a class of C code, or without source
            continue
        for node in ast.walk(ast.parse(source)):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if any(isinstance(target, ast.Attribute) and target.attr == attribute
                   and isinstance(target.value, ast.Name) and target.value.id == "self" for target in targets):
                return True
    return False


def lacks(entry: Entry) -> bool:
    """Whether the installed version lacks the entry's name (a module that does not import lacks it)."""
    try:
        found = importlib.import_module(entry.module)
    except ImportError:
        return True
    parts = entry.name.split(".")
    for position, part in enumerate(parts):
        if hasattr(found, part):
            found = getattr(found, part)
        elif entry.on_instances and position == len(parts) - 1 and isinstance(found, type):
            return not _assigned_on_instances(found, part)
        else:
            return True
    if entry.key is not None:
        try:
            return entry.key not in found
        except TypeError:  # no longer a registry
            return True
    return False


def describe_missing(entry: Entry) -> str:
    """The one line naming an entry the installed version lacks."""
    return (f"{entry.distribution} {installed_version(entry.distribution)} has no {entry.label()}, which "
            f"{entry.used_in} uses ({entry.why}; checked with {entry.distribution} "
            f"{', '.join(entry.checked_with)}; modeling_angpt/dependencies/ledger.py)")


def missing_entries(entries=ENTRIES) -> list[str]:
    """One line for each entry of an installed project that its installed version lacks."""
    return [describe_missing(entry) for entry in entries
            if installed_version(entry.distribution) is not None and lacks(entry)]


UNTESTED_VARIABLE = "ANGPT_UNTESTED_TRANSFORMERS"  # set to 1: `angpt serve` tries a transformers not checked here


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int("".join(character for character in minor if character.isdigit()) or 0)


def serving_refusal() -> str | None:
    """Why `angpt serve` must not start on the installed transformers, in one line; None when it may. It replaces
    and reads internals of transformers' server (SERVING_ENTRIES) that any minor release may change: a release
    newer than those checked is refused unless UNTESTED_VARIABLE=1, and a name any release lacks always is."""
    installed = installed_version("transformers")
    oldest, newest = min(TRANSFORMERS_SERVER, key=_minor), max(TRANSFORMERS_SERVER, key=_minor)
    if installed is not None and _minor(installed) < _minor(oldest):
        return (f"transformers {installed} is older than angpt serve needs: its server has no engine client and "
                f"model loader to replace before {oldest} (modeling_angpt/dependencies/ledger.py); install "
                f"'transformers[serving]>={oldest}' (the [tools] extra)")
    if installed is not None and _minor(installed) > _minor(newest) and os.environ.get(UNTESTED_VARIABLE) != "1":
        return (f"transformers {installed} is newer than the versions angpt serve was checked with "
                f"({', '.join(TRANSFORMERS_SERVER)}): it replaces parts of transformers' server that a minor release "
                f"may change (modeling_angpt/dependencies/ledger.py); install 'transformers<{_minor(newest)[0]}."
                f"{_minor(newest)[1] + 1}', or set {UNTESTED_VARIABLE}=1 to try it")
    missing = missing_entries(SERVING_ENTRIES)
    return missing[0] if missing else None
