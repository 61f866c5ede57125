"""A fixed tokenizer per semantic-focus task: a `tokenizers` WordLevel model over the task's symbols.

Symbols are written separated by spaces (`"( 3 + - 2 )"`), split on whitespace, one symbol per token.
Ids: `[PAD]` = 0, `[UNK]` = 1, then the task's symbols in the order `tasks.py` lists them, so a saved model's
ids never depend on data or on the order samples were drawn. No BOS/EOS/CLS: the classifier mean-pools every
real token (the paper's `--nocls`). Saved next to the model with `save_pretrained` and loaded with
`AutoTokenizer.from_pretrained`.
"""
from __future__ import annotations

PAD, UNK = "[PAD]", "[UNK]"


def task_vocabulary(task: str) -> dict[str, int]:
    from .tasks import get_task

    symbols = (PAD, UNK) + get_task(task).symbols
    return {symbol: index for index, symbol in enumerate(symbols)}


def build_tokenizer(task: str):
    """`transformers.PreTrainedTokenizerFast` for one task (deterministic; nothing is trained)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    from .tasks import get_task

    core = Tokenizer(WordLevel(task_vocabulary(task), unk_token=UNK))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, unk_token=UNK,
                                   model_max_length=get_task(task).length, padding_side="right")
