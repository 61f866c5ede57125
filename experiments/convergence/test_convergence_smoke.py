"""The convergence experiment runs end to end at a smoke size, so its scripts cannot rot; its planning and tables
are checked on made-up runs. Outputs go under tmp_path, never into the study folder."""
from __future__ import annotations

import math

import pytest
from experiments.smoke_arguments import TINY


def test_convergence_smoke(experiment, tmp_path):
    out, results, corpus, recipe = experiment
    import convergence

    convergence.main([*TINY, "--block", "32", "--batch", "4", "--steps", "4", "--eval-steps", "2",
                      "--eval-batches", "1", "--grid-points", "1", "--max-extend", "1", "--seeds", "2",
                      "--archs", "gptplus", "angpt", "--jobs", "1", "--dataset", str(corpus), "--recipe", str(recipe),
                      "--output-dir", str(tmp_path / "runs"), *out])
    text = results.read_text()
    assert "<!-- convergence:start -->" in text and "| angpt |" in text and "no ν(α)" in text
    assert "best at the edge" in text  # one rate, one extension: the edge is reported
    assert "; float32; validation every" in text  # the smoke recipe's precision, named from the runs
    assert (tmp_path / "plots" / "convergence.png").is_file()
    # --report-only rewrites the section from the cached runs without training
    convergence.main(["--report-only", "--output-dir", str(tmp_path / "runs"), *out])


def test_convergence_second_section(experiment, tmp_path):
    """--section and --title give a second setting a section and plot of its own, which --report-only keeps
    rewriting; a folder holding runs of other settings is refused in one line, not resumed from."""
    out, results, corpus, recipe = experiment
    import convergence

    args = [*TINY, "--block", "32", "--batch", "4", "--steps", "2", "--eval-steps", "1", "--eval-batches", "1",
            "--grid-points", "1", "--max-extend", "0", "--seeds", "1", "--no-ablations", "--archs", "gptplus",
            "--jobs", "1", "--dataset", str(corpus), "--recipe", str(recipe), "--output-dir", str(tmp_path / "runs")]
    convergence.main([*args, "--section", "convergence_long", "--title", ", two steps", *out])
    text = results.read_text()
    assert "<!-- convergence_long:start -->\n## Convergence, two steps: tokens to GPT+'s" in text
    assert "<!-- convergence:start -->" not in text
    assert "](plots/convergence_long.png)" in text
    import matplotlib.image

    # two panels (curves, sweep) at 5 inches × 110 dpi each: no empty ablation panel for a run without ablations
    assert matplotlib.image.imread(tmp_path / "plots" / "convergence_long.png").shape[1] == 2 * 5 * 110
    assert "Settings that differ from `--size default`: " in text and "steps 2 (default 500)" in text
    assert "At the best rate, 1 seed (median" in text and " 1 run in parallel, " in text  # counts in the right number
    results.write_text("# Benchmark results\n")
    convergence.main(["--report-only", "--output-dir", str(tmp_path / "runs"), *out])
    assert "<!-- convergence_long:start -->" in results.read_text()
    with pytest.raises(SystemExit, match=r"convergence.py: --output-dir .*runs holds runs made with other settings "
                                         r"\(steps 2, not 3\); pick another --output-dir"):
        convergence.main([*args, "--steps", "3", *out])


def test_convergence_ablation_seeds(experiment, capsys):
    """--ablation-seeds N runs every ablation at seeds 0 to N−1 (seed 0 for all first) and compares each with anGPT's
    run of the same seed; the table gives median (range) over seeds and counts the seeds that diverged."""
    import convergence

    cfg = convergence.parse_config(["--grid-points", "1", "--max-extend", "0", "--seeds", "3", "--ablation-seeds",
                                    "2", "--archs", "gptplus", "angpt"])

    def run(arch, seed, final, ablation=None, diverged=False):
        curve = [(0, 6.0), (100, final)]
        return {"arch": arch, "lr": cfg["centre"][arch], "seed": seed, "final": math.inf if diverged else final,
                "diverged": diverged, "curve": curve, **({"ablation": ablation} if ablation else {})}

    swept = [run("gptplus", 0, 4.5), run("angpt", 0, 4.0)]
    planned = [(s["seed"], s.get("ablation")) for s in convergence.needed_runs(swept, cfg)]
    names = list(convergence.ABLATIONS)
    assert planned[planned.index((0, names[0])):] == [(0, n) for n in names] + [(1, n) for n in names]
    assert {(1, None), (2, None)} <= set(planned) and not any(s == 2 for s, a in planned if a)
    # the extra seeds seed-major too: every architecture's seed 1 before any seed 2 (the speed-up pairs seeds)
    assert [(s["seed"], s["arch"]) for s in convergence.needed_runs(swept, cfg) if s["seed"] and "ablation" not in s] \
        == [(1, "gptplus"), (1, "angpt"), (2, "gptplus"), (2, "angpt")]

    results = swept + [run("gptplus", 1, 4.6), run("angpt", 1, 4.1),
                       run("angpt", 0, 4.2, "alpha0.01"), run("angpt", 1, 4.4, "alpha0.01"),
                       run("angpt", 0, 3.9, "no_nu"), run("angpt", 1, 0, "no_nu", diverged=True),
                       run("angpt", 2, 3.0, "warmup")]  # no baseline of seed 2 yet: not counted
    table = "\n".join(convergence.ablation_table(convergence.summarise(results, cfg), cfg["ablation_seeds"]))
    assert "seeds 0–1 (baseline: " in table and "final loss 4.050 (4.000–4.100)" in table
    assert "| α init 0.01 | 2/2 | 4.300 (4.200–4.400) | +0.250 (+0.200 to +0.300) | not reached |" in table
    # 6.0 → 3.9 over 100 tokens crosses the baseline's 4.0 at 100 × 2.0 / 2.1
    assert "| no ν(α) on the residual | 2/2 | 3.900 (1 seed); diverged in 1 seed | -0.100 (1 seed) | 95 (1 seed) |" \
        in table
    assert "| 5 % linear warm-up | not run yet | | | |" in table

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import convergence_plot

    _, axis = plt.subplots()  # the ablation panel: Δ against the same seed's anGPT, median and range over seeds
    convergence_plot.plot_ablations(axis, convergence.summarise(results, cfg))
    lines = {line.get_label(): list(line.get_ydata()) for line in axis.get_lines()}
    assert lines["α init 0.01 (2 seeds)"] == pytest.approx([0.0, 0.25])  # seeds' Δ +0.2, +0.3 at the last point
    assert lines["no ν(α) on the residual (1 seed; diverged in 1)"] == pytest.approx([0.0, -0.1])
    assert lines["anGPT (same seed)"] == [0, 0] and len(lines) == 3  # warm-up: no baseline of its seed yet
    assert len(axis.collections) == 1  # a range only where there are two seeds
    plt.close("all")
    with pytest.raises(SystemExit):
        convergence.parse_config(["--seeds", "2", "--ablation-seeds", "3"])
    assert "--ablation-seeds must be between 1 and --seeds (2)" in capsys.readouterr().err


def test_convergence_ablation_panel_is_scaled_to_the_medians_not_to_one_seeds_spike(experiment):
    """One seed's brief validation spike (nats, in a run that recovers) must not squash the ablations' effects
    (hundredths) onto the zero line: the panel's limits follow the medians, and a note says the ranges are clipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import convergence_plot

    def ablation_runs(spike: float) -> dict:
        deltas = [[0.1] * 8, [0.1] * 8, [0.1] * 5 + [spike] + [0.1] * 2]
        return {seed: {"curve": [(t, 4.0) for t in range(8)], "diverged": False,
                       "delta_curve": [(t, d) for t, d in enumerate(ds)]} for seed, ds in enumerate(deltas)}

    for spike, clipped in ((20.0, True), (0.12, False)):
        _, axis = plt.subplots()
        convergence_plot.plot_ablations(axis, {"ablations": {"alpha0.01": ablation_runs(spike)}})
        assert axis.get_ylim() == pytest.approx((-0.08, 0.18))  # medians 0 (the baseline) to 0.1, padded
        notes = [text.get_text() for text in axis.texts]
        assert notes == (["seed ranges clipped: they reach +0.00 to +20.00"] if clipped else [])
    plt.close("all")


