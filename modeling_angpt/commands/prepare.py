"""`angpt prepare RECIPE.yaml --output DIR [--num-proc N] [--override KEY=VALUE ...]`: tokenise the recipe's corpus
once into token shards that `angpt train RECIPE --override dataset=DIR` memory-maps (modeling_angpt/data/prepare.py;
docs/training.md, section "Corpora larger than memory")."""
from __future__ import annotations

import argparse
import sys

from . import CommandError, float_at_least, int_at_least

USES_MODELS = False  # cli.py need not register the models with transformers (seconds of imports) for this command

DESCRIPTION = """Tokenise the corpus a training recipe names (its keys dataset, dataset_config, dataset_split,
text_column, streaming, max_corpus_chars, tokenizer or tokenizer_vocab_size, validation_fraction and data_seed) into
token shards and a manifest in DIR, with N worker processes. Then train with: angpt train RECIPE --override
dataset=DIR. An interrupted prepare continues when run again with the same inputs; a finished one does nothing."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.add_argument("recipe", help="training recipe YAML (e.g. configuration/recipes/demo_cpu.yaml)")
    parser.add_argument("--output", required=True, metavar="DIR",
                        help="a new or empty directory (or one this prepare left unfinished)")
    parser.add_argument("--num-proc", type=int_at_least(1), default=1, metavar="N",
                        help="worker processes tokenising in parallel (default 1)")
    parser.add_argument("--unit-mb", type=float_at_least(0.0, strict=True), default=256.0, metavar="MB",
                        help="text per work unit and shard of a local corpus, in MB (default 256); a streamed "
                             "corpus is split by its own files")
    parser.add_argument("--override", "-o", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe key (repeatable), as for angpt train")


def run(args: argparse.Namespace) -> int:
    from ..data.prepare import prepare_corpus
    from ..training.recipe import load_recipe

    try:
        recipe = load_recipe(args.recipe, args.override)
        result = prepare_corpus(recipe, args.output, num_proc=args.num_proc, unit_mb=args.unit_mb)
    except (OSError, ValueError) as error:
        raise CommandError(str(error).strip().replace("\n", " ")) from None
    totals = result.manifest["totals"]
    summary = (f"{totals['train']['tokens']:,} training tokens ({totals['train']['documents']:,} documents), "
               f"{totals['val']['tokens']:,} held out ({totals['val']['documents']:,} documents), "
               f"{len(result.manifest['shards'])} shard files")
    if result.done_already:
        print(f"{result.directory} already holds this corpus prepared ({summary}); nothing to do")
    else:
        print(f"prepared {result.directory} in {result.seconds:.1f} s: {summary}; train with "
              f"--override dataset={result.directory}", file=sys.stdout)
    return 0
