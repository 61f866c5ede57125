"""The width- and depth-stability sweeps run end to end at a smoke size (seconds), so the script cannot rot; they
print their sections (--no-write). (The recipe defaults they motivated are tested with the library:
tests/training/test_width_stability.py.)"""
from __future__ import annotations


def test_width_stability_smoke(experiment, capsys):
    import width_stability

    width_stability.main(["--widths", "64", "--layers", "1", "--steps", "2", "--batch", "2", "--seq", "16",
                          "--variants", "baseline", "width_rule", "--device", "cpu", "--no-write"])
    out = capsys.readouterr().out
    assert "| baseline | fp32 | 64 |" in out and "| width_rule | fp32 | 64 |" in out


def test_width_stability_depth_sweep_smoke(experiment, capsys):
    import width_stability

    width_stability.main(["--depth-alpha", "2:0.05", "3:0.01", "--widths", "64", "--steps", "2", "--batch", "2",
                          "--seq", "16", "--device", "cpu", "--no-write"])
    out = capsys.readouterr().out
    assert "| 64 | 2 | 0.05 | 0.10 |" in out and "| 64 | 3 | 0.01 | 0.03 |" in out
