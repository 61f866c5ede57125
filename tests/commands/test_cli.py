"""The `angpt` command line as a newcomer meets it: one-line errors without tracebacks, validated before anything
is loaded; fast and complete help; --version."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
import torch
from cli_helpers import ENTRY, REPO, angpt, assert_one_line_error, cli_env, snapshot


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny training-form checkpoint with a tokenizer (no pad token: an old-style checkpoint)."""
    from checkpoint_fixtures import save_source, write_tokenizer

    from modeling_angpt import AnGPTConfig

    path = tmp_path_factory.mktemp("cli") / "ckpt"
    torch.manual_seed(0)
    config = lambda arch, **kw: AnGPTConfig(**{**dict(vocab_size=300, hidden_size=32, num_hidden_layers=2,  # noqa: E731
                                                    num_attention_heads=4, max_position_embeddings=64,
                                                    architecture=arch), **kw})
    save_source(path, config, "angpt")
    write_tokenizer(path)
    return path


@pytest.mark.parametrize("args, expected", [
    ((), ["angpt: error:", "COMMAND"]),
    (("fit",), ["angpt: error:", "invalid choice: 'fit'"]),
    (("generate", "{ckpt}", "--max-new-tokens", "-5"), ["--max-new-tokens", "expected an integer >= 1, got -5"]),
    (("generate", "{ckpt}", "--max-new-tokens", "0"), ["--max-new-tokens", "expected an integer >= 1, got 0"]),
    (("generate", "{ckpt}", "--temperature", "-1"), ["--temperature", "expected a number >= 0, got -1"]),
    (("generate", "{ckpt}", "--top-k", "3"), ["--top-k applies to sampling only"]),
    (("generate", "{tmp}/missing"), ["checkpoint", "missing: no such directory"]),
    (("export", "{tmp}/missing", "{tmp}/out"), ["SRC", "missing: no such checkpoint directory"]),
    (("export", "{ckpt}", "{tmp}/out", "--tolerance", "0"), ["--tolerance", "expected a number > 0"]),
    (("export", "{ckpt}", "{tmp}/notes"), ["DST", "notes exists and is not empty", "--overwrite"]),
    (("export", "{ckpt}", "{tmp}/notes", "--overwrite"), ["DST", "is not a checkpoint (no config.json)"]),
    (("export", "{ckpt}", "{ckpt}/.."), ["DST", "is the source checkpoint or contains it"]),
    (("train", "{tmp}/nope.yaml"), ["angpt train: error: recipe file not found:", "nope.yaml"]),
    (("train", "{recipe}", "--resume", "--overwrite"), ["--overwrite: not allowed with argument --resume"]),
    (("train", "{recipe}", "-o", "learning_rat=1"), ["unknown recipe key 'learning_rat'", "learning_rate"]),
])
def test_cli_errors_are_one_line_before_any_work(args, expected, checkpoint, tmp_path):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "mine.txt").write_text("keep me")
    (tmp_path / "recipe.yaml").write_text(f"output_dir: {tmp_path / 'run'}\n")
    args = [a.format(ckpt=checkpoint, tmp=tmp_path, recipe=tmp_path / "recipe.yaml") for a in args]
    before, source_before = snapshot(tmp_path), snapshot(checkpoint)
    started = time.perf_counter()
    proc = angpt(*args)
    assert_one_line_error(proc, *expected)
    assert snapshot(tmp_path) == before and snapshot(checkpoint) == source_before   # nothing created or deleted
    assert time.perf_counter() - started < 30   # rejected before loading a model


HELP_SCRIPT = """
import os, sys, angpt_cli
for argv in (['--help'], ['train', '--help'], ['export', '--help'], ['generate', '--help'], ['eval', '--help'],
             ['semantic-focus', '--help']):
    try:
        angpt_cli.main(argv)
    except SystemExit as e:
        assert e.code == 0
package = sys.modules['modeling_angpt']
print('HEAVY', sorted(m for m in ('torch', 'transformers', 'accelerate', 'numpy') if m in sys.modules))
# the package's own __init__ ran (no stand-in module), with its registration deferred, and the deferral ended
print('PACKAGE', package.__file__.endswith('__init__.py'), package._registered,
      os.environ.get('ANGPT_DEFER_REGISTRATION'))
"""


def test_help_is_fast_complete_and_imports_nothing_heavy():
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", HELP_SCRIPT], capture_output=True, text=True, timeout=120,
                          cwd=REPO, env=cli_env())
    elapsed = time.perf_counter() - started
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "HEAVY []" in proc.stdout          # --help imports neither torch nor transformers
    assert "PACKAGE True False None" in proc.stdout
    assert elapsed < 10, elapsed               # about 0.2 s; the package import alone takes seconds
    out = proc.stdout
    assert out.startswith("usage: angpt") and "Train, export, evaluate and sample" in out
    assert "thin dispatcher" not in out       # no internal docstring in the user's help
    # train --help lists every recipe key with its default and meaning, from the Recipe's field definitions
    from modeling_angpt.training.recipe import ARCHITECTURE_DEFAULTS, Recipe
    import dataclasses
    for field in dataclasses.fields(Recipe):
        assert f"    {field.name} (" in out and field.metadata["help"] in out, field.name
    assert "learning_rate (0.001): peak learning rate" in out
    assert "eval_steps (100): validation loss every N steps and at the end; 0 = never" in out
    assert 'report_to (["tensorboard", "jsonl"]): jsonl (metrics.jsonl), none, all, or any of Accelerate' in out
    assert "  data:\n    dataset (\"shakespeare\"):" in out
    for architecture in ARCHITECTURE_DEFAULTS:   # the values unset optimiser keys take
        assert re.search(rf"^  {architecture}: optim=adamw? ", out, re.M), architecture
    assert "lr_width_rule=inverse_width lr_base_width=128" in out


IMPORT_SCRIPT = """
import sys
import modeling_angpt
print("HEAVY", "torch" in sys.modules, modeling_angpt._registered)
from transformers import AutoConfig, AutoModelForCausalLM
config = AutoConfig.for_model("angpt", vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
print("AUTO", type(config).__name__, type(AutoModelForCausalLM.from_config(config)).__name__)
"""
FIRST_USE_SCRIPT = """
from transformers import AutoModelForCausalLM
import modeling_angpt
config = modeling_angpt.AnGPTConfig(vocab_size=40, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
print("FIRST USE", modeling_angpt._registered, type(AutoModelForCausalLM.from_config(config)).__name__)
"""


@pytest.mark.parametrize("deferred", [False, True])
def test_import_registers_the_auto_classes_unless_deferred(deferred):
    """`import modeling_angpt` registers the Auto classes (the model card's promise, hub.LOADING_NOTE), in a fresh
    interpreter; with ANGPT_DEFER_REGISTRATION=1 (the console script's import) it imports nothing heavy, and the
    first use of one of the package's names registers."""
    env = cli_env(ANGPT_DEFER_REGISTRATION="1") if deferred else cli_env()
    proc = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT], capture_output=True, text=True, timeout=300,
                          cwd=REPO, env=env)
    if deferred:
        assert "HEAVY False False" in proc.stdout
        assert proc.returncode != 0 and "Unrecognized model" in proc.stderr   # nothing registered yet
        proc = subprocess.run([sys.executable, "-c", FIRST_USE_SCRIPT], capture_output=True, text=True, timeout=300,
                              cwd=REPO, env=env)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "FIRST USE True AnGPTForCausalLM" in proc.stdout
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "HEAVY True True" in proc.stdout and "AUTO AnGPTConfig AnGPTForCausalLM" in proc.stdout


def _imports(path) -> set[str]:
    """The modeling_angpt modules a file imports (absolute, or relative resolved against its package)."""
    import ast

    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.startswith("modeling_angpt")}


def test_layers_point_one_way():
    """Commands above training and evaluation, both above the model: training never imports evaluation (what both
    need is in modeling_angpt/tasks), evaluation never imports the commands; the services over a checkpoint
    (serving, export, inference, conversion) import no training, evaluation or command; the data path no service
    but inference's padding rule, and of training only the recipe, its input; the tasks, the ledger and the model
    files nothing of the library around them."""
    root = REPO / "modeling_angpt"
    commands = ("modeling_angpt.commands", "modeling_angpt.cli")
    services = ("modeling_angpt.serving", "modeling_angpt.export", "modeling_angpt.inference",
                "modeling_angpt.conversion")
    above_services = ("modeling_angpt.training", "modeling_angpt.evaluation", *commands)
    layers = {"training": ("modeling_angpt.evaluation", *commands),
              "evaluation": commands,
              "serving": above_services, "export": above_services,
              "conversion": (*above_services, "modeling_angpt.serving", "modeling_angpt.export",
                             "modeling_angpt.inference", "modeling_angpt.data"),
              "data": (*above_services, "modeling_angpt.serving", "modeling_angpt.export", "modeling_angpt.conversion"),
              "inference": (*above_services, "modeling_angpt.serving", "modeling_angpt.export",
                            "modeling_angpt.conversion", "modeling_angpt.data"),
              "tasks": (*above_services, *services, "modeling_angpt.data"),
              "dependencies": ("modeling_angpt.",)}
    allowed = {"modeling_angpt.training.recipe"}  # the data path's input: prepare's workers rebuild a recipe
    wrong = [f"{path.relative_to(REPO)} imports {name}"
             for folder, forbidden in layers.items() for path in sorted((root / folder).rglob("*.py"))
             for name in _imports(path) if name.startswith(forbidden) and name.rpartition(".")[0] not in allowed
             and name not in allowed]
    model_files = sorted(root.glob("*_angpt.py"))
    assert len(model_files) >= 10
    library = tuple(f"modeling_angpt.{name}" for name in ("training", "evaluation", "commands", "cli", "tasks", "data",
                                                           "serving", "export", "inference", "conversion",
                                                           "dependencies"))
    wrong += [f"{path.relative_to(REPO)} imports {name}" for path in model_files for name in _imports(path)
              if name.startswith(library)]
    assert not wrong, wrong


@pytest.mark.parametrize("command", ["train", "export", "onnx", "generate", "serve", "eval", "semantic-focus"])
def test_every_option_has_help_text(command):
    from modeling_angpt.cli import build_parser

    parser = build_parser(command)
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict)).choices[command]
    missing = [a.dest for a in sub._actions if not a.help]
    assert not missing, f"angpt {command}: options without help: {missing}"
    assert all(a.help for a in parser._actions if a.dest != "command")


def test_version():
    proc = subprocess.run([sys.executable, "-c", ENTRY, "--version"], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env=cli_env())
    assert proc.returncode == 0 and re.fullmatch(r"angpt \S+.*\n", proc.stdout), proc.stdout + proc.stderr
