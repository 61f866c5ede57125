"""The residual-ν(α)-depth experiment runs end to end at a smoke size, so the script cannot rot: ν(α) on and off
side by side, the stream's norm per layer, overflowing runs, later seeds alone, and its GPU size. Outputs go under
tmp_path, never into the study folder."""
from __future__ import annotations

import json

import pytest


def residual_nu_depth_args(experiment, tmp_path, steps: int, pair: str) -> list[str]:
    """A smoke-size residual_nu_depth command line: a tiny model, `steps` steps, one LAYERS:ALPHA pair."""
    out, _, corpus, recipe = experiment
    return ["--hidden", "32", "--heads", "2", "--vocab", "300", "--threads", "1", "--block", "32", "--batch", "4",
            "--steps", str(steps), "--eval-steps", str(steps // 2), "--eval-batches", "1", "--pairs", pair,
            "--jobs", "1", "--dataset", str(corpus), "--recipe", str(recipe),
            "--output-dir", str(tmp_path / "runs"), *out]


def test_residual_nu_depth_smoke(experiment, tmp_path, monkeypatch):
    """ν(α) on and off at each depth, side by side; without ν(α) the stream leaves every LERP shorter by about
    √((1 − α)² + α²) (docs/architectures.md), which the per-layer norms of the trained models show."""
    _, results, _, _ = experiment
    import residual_nu_depth

    alpha = 0.2  # large (α·L at the 0.4 limit), so that the shrinkage stands clear of what 4 steps change
    args = residual_nu_depth_args(experiment, tmp_path, steps=4, pair=f"2:{alpha}")
    residual_nu_depth.main(args)
    text = results.read_text()
    assert "<!-- residual_nu_depth:start -->" in text and "| 2 | 0.2 | 0.40 | on |" in text
    assert "| 2 | 0.2 | 0.40 | off |" in text and "not run yet" not in text
    runs = {p.parent.name: json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*/result.json")}
    on, off = runs["angpt-L2-a0.2-lr0.008-s0"]["stream_norms"], runs["angpt-L2-a0.2-lr0.008-s0-no_nu"]["stream_norms"]
    assert len(on) == len(off) == 3  # the embedding, then each layer's output
    per_update = ((1 - alpha) ** 2 + alpha ** 2) ** 0.5  # two residual updates per layer
    for layer in (1, 2):
        assert off[layer] / off[layer - 1] == pytest.approx(per_update ** 2, rel=0.1)
        assert on[layer] / on[layer - 1] == pytest.approx(1.0, rel=0.1)
    assert (tmp_path / "plots" / "residual_nu_depth.png").is_file()
    # a run that overflows is reported with the step it stopped at, not as a loss
    residual_nu_depth.main(args + ["--lr", "1e30", "--output-dir", str(tmp_path / "runs-overflow")])
    assert "| on | 1/1 (step " in results.read_text() or "| off | 1/1 (step " in results.read_text()
    # a folder holding runs of other settings is refused in one line, not resumed from
    with pytest.raises(SystemExit, match=r"--output-dir .*runs holds runs made with other settings \(steps 4, not 5\)"):
        residual_nu_depth.main(args + ["--steps", "5"])
    # a rerun finds both runs finished and trains nothing
    import convergence

    monkeypatch.setattr(convergence, "run_one", lambda spec, cfg: pytest.fail(f"retrained {spec}"))
    residual_nu_depth.main(args)
    assert "| 2 | 0.2 | 0.40 | off |" in results.read_text()


def test_residual_nu_depth_first_seed(experiment, tmp_path, capsys):
    """--first-seed runs a later seed alone (a long setting one seed at a time), and the section names that seed."""
    _, results, _, _ = experiment
    import residual_nu_depth

    args = residual_nu_depth_args(experiment, tmp_path, steps=2, pair="2:0.1")
    residual_nu_depth.main(args + ["--first-seed", "2"])
    assert sorted(p.name for p in (tmp_path / "runs").glob("angpt-*")) == [
        "angpt-L2-a0.1-lr0.008-s2", "angpt-L2-a0.1-lr0.008-s2-no_nu"]
    assert "training tokens per run, seed 2, " in results.read_text()
    with pytest.raises(SystemExit):
        residual_nu_depth.main(args + ["--seeds", "0"])
    assert "--seeds must be at least 1 and --first-seed at least 0, got 0 and 0" in capsys.readouterr().err


def test_residual_nu_depth_device_size(experiment):
    """--device takes the convergence experiment's GPU size and half its CPU-size rate, as the convergence sweep's
    centre does; flags given on the command line still win."""
    import residual_nu_depth  # puts the convergence experiment's folder on the path
    import convergence

    cpu = residual_nu_depth.parse_config([])
    assert cpu["hidden"] == convergence.SIZES["default"]["hidden"] and cpu["lr"] == residual_nu_depth.BEST_4_LAYER_LR
    for flags in (["--device"], ["--size", "device"]):
        gpu = residual_nu_depth.parse_config(flags)
        size = convergence.SIZES["device"]
        assert (gpu["hidden"], gpu["block"], gpu["steps"]) == (size["hidden"], size["block"], size["steps"])
        assert gpu["lr"] == pytest.approx(cpu["lr"] / 2)
    wide = residual_nu_depth.parse_config(["--device", "--hidden", "1024", "--heads", "16", "--lr", "0.001"])
    assert (wide["hidden"], wide["heads"], wide["lr"], wide["vocab"]) == (1024, 16, 0.001, size["vocab"])


def test_residual_nu_depth_default_alpha(experiment, capsys):
    """LAYERS:default is the α init a config that sets none gets at that depth (the papers' 0.05 at 2 layers, 0.10 /
    layers deeper), and the section marks it as the default; another word is refused in one line."""
    import residual_nu_depth
    from modeling_angpt import AnGPTConfig

    cfg = residual_nu_depth.parse_config(["--pairs", "2:default", "24:default", "24:0.0167"])
    unset = [AnGPTConfig(architecture="angpt", num_hidden_layers=n).alpha_init for n in (2, 24)]
    assert cfg["pairs"] == [(2, unset[0]), (24, unset[1]), (24, 0.0167)] and unset == [0.05, pytest.approx(0.1 / 24)]
    cfg.update(machine="Machine: test.", plot_link="plot.png")
    text = residual_nu_depth.section([], cfg, "command")
    assert "| 24 | 0.00416667 (default) | 0.10 | on | not run yet" in text and "| 2 | 0.05 (default) | 0.10 |" in text
    assert "| 24 | 0.0167 | 0.40 | on |" in text
    with pytest.raises(SystemExit):
        residual_nu_depth.parse_config(["--pairs", "24:paper"])
    assert "expected LAYERS:ALPHA such as 24:0.05 or 24:default, got '24:paper'" in capsys.readouterr().err
