"""`custom_dataset` functions of the angpt_offline tasks (lm-eval imports this file through --include_path).

The data are built by the installed library (modeling_angpt.evaluation.offline_data) from local held-out text,
deterministically for a corpus and a seed, and cached. lm-eval passes the task metadata, `--metadata` and the
model_args as keyword arguments; `corpus` (default "demo": the validation split of the demo recipe; a recipe
YAML: its validation split; any other path: a text file) and `data_seed` (default 1234) choose the data:

    lm_eval ... --include_path eval/tasks --tasks angpt_offline --metadata '{"corpus": "my_heldout.txt"}'
"""
from modeling_angpt.evaluation.offline_data import load_task


def cloze(**kwargs):
    return load_task("angpt_cloze", **kwargs)


def lastword(**kwargs):
    return load_task("angpt_lastword", **kwargs)


def rolling_perplexity(**kwargs):
    return load_task("angpt_rolling_perplexity", **kwargs)
