"""Every experiment script runs from the command line (`python experiments/<study>/<script>.py`), with a --help that
opens with whole sentences that stand alone (the checks bench/'s scripts pass too: tests/script_checks.py)."""
from __future__ import annotations

from pathlib import Path

from script_checks import check_help_descriptions, check_run_from_the_command_line, scripts

EXPERIMENTS = Path(__file__).resolve().parent


def test_experiment_help_opens_with_whole_sentences_that_stand_alone(experiment):
    found = scripts(EXPERIMENTS)
    assert len(found) >= 9
    check_help_descriptions(found)


def test_experiment_scripts_run_from_the_command_line():
    check_run_from_the_command_line(scripts(EXPERIMENTS))
