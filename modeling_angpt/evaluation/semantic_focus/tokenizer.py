"""A fixed tokenizer per semantic-focus task: a `tokenizers` WordLevel model over the task's symbols.

Symbols are written separated by spaces (`"( 3 + - 2 )"`), split on whitespace, one symbol per token. Ids: `[PAD]` =
0, `[UNK]` = 1, then the task's symbols in the order its definition lists them (`Task.symbols`,
task_definitions.py), so a saved model's ids never depend on data or on the order samples were drawn. No
BOS/EOS/CLS: the classifier mean-pools every real token (the paper's `--nocls`). Saved next to the model with
`save_pretrained` and loaded with `AutoTokenizer.from_pretrained`.
"""
from __future__ import annotations

PAD, UNK = "[PAD]", "[UNK]"


def task_vocabulary(task) -> dict[str, int]:
    """Token ids of a `Task` (task_definitions.py): the special tokens, then its symbols."""
    symbols = (PAD, UNK) + task.symbols
    return {symbol: index for index, symbol in enumerate(symbols)}


def build_tokenizer(task):
    """`transformers.PreTrainedTokenizerFast` for the `Task` given (task_definitions.get_task(name) gives one by
    name); deterministic: nothing is trained."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(WordLevel(task_vocabulary(task), unk_token=UNK))
    core.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, unk_token=UNK,
                                   model_max_length=task.length, padding_side="right")
