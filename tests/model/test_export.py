"""`angpt export`: folded checkpoints that check themselves, dtypes, refusals, model cards, broken checkpoints."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.inference.checkpoint_check import CheckpointError, check_checkpoint
from modeling_angpt.cli import main as angpt
from modeling_angpt.export.fold import ExportError, export_checkpoint

from checkpoint_fixtures import save_source, write_tokenizer
from conftest import ARCHITECTURES


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_export_cli(tmp_path, tiny_config, architecture, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = save_source(src, tiny_config, architecture)
    assert angpt(["export", str(src), str(dst)]) == 0
    assert "self-check" in capsys.readouterr().out
    config = json.loads((dst / "config.json").read_text())
    assert config["folded"] is True and config["architecture"] == architecture
    reloaded = AutoModelForCausalLM.from_pretrained(dst)
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        expected = model(ids).logits
        assert (reloaded(ids).logits - expected).abs().max() <= 1e-5 * max(1.0, expected.abs().max().item())
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dst")]  # no partial directory left


@pytest.mark.parametrize("dtype,tol", [("bfloat16", 5e-2), ("float16", 1e-2)])
def test_export_dtype(tmp_path, tiny_config, dtype, tol):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = save_source(src, tiny_config, "angpt")
    assert angpt(["export", str(src), str(dst), "--dtype", dtype]) == 0
    reloaded = AutoModelForCausalLM.from_pretrained(dst)
    assert next(reloaded.parameters()).dtype == getattr(torch, dtype)
    assert json.loads((dst / "config.json").read_text())["dtype"] == dtype
    ids = torch.randint(0, 101, (2, 12))
    with torch.no_grad():
        expected = model(ids).logits
        assert (reloaded(ids).logits.float() - expected).abs().max() <= tol * max(1.0, expected.abs().max().item())


def test_export_self_check_failure_writes_nothing(tmp_path, tiny_config):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_source(src, tiny_config)

    def broken_fold(model):
        folded = model.fold()
        with torch.no_grad():
            folded.model.layers[0].mlp.down_proj.weight.mul_(1.01)
        return folded

    with pytest.raises(ExportError, match="self-check failed"):
        export_checkpoint(src, dst, fold=broken_fold)
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_export_refuses_division_by_zero(tmp_path, tiny_config, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    model = AnGPTForCausalLM(tiny_config("angpt", hidden_size=16, alpha_init=0.5))
    with torch.no_grad():  # stored 0.5 · (0.5 / 0.25) = α = 1 exactly: 1 − α = 0
        model.model.layers[0].attn_residual.alpha.weight[3] = 0.5
    model.save_pretrained(src)
    assert angpt(["export", str(src), str(dst)]) == 1
    assert "layer 0 attention (model.layers.0.attn_residual)" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_export_refuses_existing_destination(tmp_path, tiny_config):
    src, dst = tmp_path / "src", tmp_path / "dst"
    save_source(src, tiny_config)
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    with pytest.raises(ExportError, match="not empty"):
        export_checkpoint(src, dst)
    assert (dst / "keep.txt").exists()
    export_checkpoint(src, tmp_path / "a")
    with pytest.raises(ExportError, match="already folded"):
        export_checkpoint(tmp_path / "a", tmp_path / "b")


def test_model_card_metadata_and_snippet(tmp_path, tiny_config):
    from huggingface_hub import ModelCard

    src, dst = tmp_path / "src", tmp_path / "dst"
    save_source(src, tiny_config, "angpt", rope_parameters={"rope_type": "none"}, vocab_size=300)
    write_tokenizer(src)
    export_checkpoint(src, dst)
    for directory, folded in ((src, False), (dst, True)):
        card = ModelCard.load(directory / "README.md")
        data = card.data.to_dict()
        assert data["library_name"] == "transformers" and data["license"] == "apache-2.0"
        assert data["datasets"] == ["shakespeare"]
        assert data["angpt"]["architecture"] == "angpt" and data["angpt"]["folded"] is folded
        assert data["angpt"]["attention"]["rope_type"] == "none" and data["angpt"]["train_tokens"] == 123456
        assert data["model-index"][0]["results"][0]["metrics"][0]["value"] == 4.56
        assert {"angpt", "rope-none", "attention-none"} <= set(data["tags"])
    # the usage snippet of the exported card runs as written (tokenizer copied next to the weights)
    snippet = re.search(r"```python\n(.*?)```", (dst / "README.md").read_text(), re.S).group(1)
    assert "AutoTokenizer" in snippet and "'dst'" in snippet and str(tmp_path) not in snippet  # no absolute path
    result = subprocess.run([sys.executable, "-c", snippet], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "To be" in result.stdout


def test_generate_command(tmp_path, tiny_config, capsys):
    src = tmp_path / "src"
    save_source(src, tiny_config, "angpt", vocab_size=300)
    write_tokenizer(src)
    assert angpt(["generate", str(src), "--prompt", "To be", "--max-new-tokens", "5"]) == 0
    assert capsys.readouterr().out.startswith("To be")


# --- broken checkpoints: a clear error, never a half-loaded model --------------------------------------------------
def test_truncated_safetensors(tmp_path, tiny_config, capsys):
    src = tmp_path / "src"
    save_source(src, tiny_config)
    weights = src / "model.safetensors"
    data = weights.read_bytes()
    for cut in (len(data) // 2, len(data) - 1, 6):
        weights.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"model\.safetensors: corrupted or truncated"):
            check_checkpoint(src)
        with pytest.raises(OSError, match="corrupted or truncated"):  # the loader refuses too, naming the checkpoint
            AutoModelForCausalLM.from_pretrained(src)
    assert angpt(["export", str(src), str(tmp_path / "dst")]) == 1
    assert "model.safetensors: corrupted or truncated" in capsys.readouterr().err
    assert not (tmp_path / "dst").exists()


def test_config_weights_mismatch(tmp_path, tiny_config):
    src = tmp_path / "src"
    save_source(src, tiny_config)
    config = json.loads((src / "config.json").read_text())
    config["intermediate_size"] = 4 * 48
    config["hidden_size"] = 48
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"weights do not match config\.json.*model\.layers\.0\.mlp"):
        check_checkpoint(src)
    with pytest.raises(ValueError, match="does not match its config"):
        AutoModelForCausalLM.from_pretrained(src)
    config.update(hidden_size=32, intermediate_size=128, num_hidden_layers=3)  # a layer the weights do not have
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"model\.layers\.2\.self_attn\.q_proj\.weight: missing"):
        check_checkpoint(src)
    with pytest.raises(ValueError, match="missing from the checkpoint"):
        AutoModelForCausalLM.from_pretrained(src)


def test_exported_tokenizer_batches_and_the_report_reads_as_a_pass(tmp_path, tiny_config, capsys):
    """A source tokenizer without a pad token: the export's tokenizer pads with EOS on the left, and
    pipeline(batch_size=2) works out of the box; the self-check line says it passed."""
    from transformers import AutoTokenizer, pipeline

    src, dst = tmp_path / "src", tmp_path / "dst"
    save_source(src, tiny_config, "angpt", vocab_size=300)
    assert write_tokenizer(src).pad_token is None
    assert angpt(["export", str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "self-check passed: the reloaded logits differ from the source's by at most " in out
    assert "(allowed: " in out and "tolerance" not in out
    tokenizer = AutoTokenizer.from_pretrained(dst)
    assert tokenizer.pad_token == "<eos>" and tokenizer.padding_side == "left"
    generate = pipeline("text-generation", model=str(dst), batch_size=2)
    outputs = generate(["To be", "or not to be, that is the"], max_new_tokens=3, do_sample=False)
    assert [o[0]["generated_text"][:5] for o in outputs] == ["To be", "or no"]
    # --overwrite replaces the earlier export (and only an export)
    assert angpt(["export", str(src), str(dst), "--overwrite"]) == 0
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".dst")]
