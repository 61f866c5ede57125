"""TRL's SFTTrainer fine-tunes the training form (docs/tools.md, "TRL"): with `packing=True` (TRL's padding-free
packing: sequences share a row, positions restart at each one, no attention mask) the loss goes down on the three
architectures, and `WeightConstraintCallback` (modeling_angpt/training/callbacks.py) keeps anGPT's rows in the unit
ball and nGPT's matrices on the unit sphere (docs/architectures.md, "Weight constraints"); without it anGPT's rows
leave the ball. The loss of TRL's packed batches equals the loss of each sequence alone, and of TRL's padded batches.
The model card (modeling_angpt/export/hub.py) names the callback, and its snippet runs as written. Tiny models, a local
tokenizer, a few lines of local text."""
from __future__ import annotations

import pytest
import torch
from checkpoint_fixtures import write_tokenizer

from modeling_angpt import AnGPTForCausalLM
from modeling_angpt.training import WeightConstraintCallback

pytestmark = pytest.mark.tools  # make test-tools


LINES = ["To be, or not to be, that is the question:", "Whether 'tis nobler in the mind to suffer",
         "The slings and arrows of outrageous fortune,", "Or to take arms against a sea of troubles",
         "And by opposing end them. To die: to sleep;", "No more; and by a sleep to say we end",
         "The heart-ache and the thousand natural shocks", "That flesh is heir to, 'tis a consummation",
         "Devoutly to be wish'd. To die, to sleep;", "To sleep: perchance to dream: ay, there's the rub;",
         "For in that sleep of death what dreams may come", "When we have shuffled off this mortal coil,"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return write_tokenizer(tmp_path_factory.mktemp("trl-tokenizer"))


def _trainer(tmp_path, model, tokenizer, callbacks, packing=True, steps=8):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(output_dir=str(tmp_path / "sft"), packing=packing, max_length=64, max_steps=steps,
                     per_device_train_batch_size=2, learning_rate=0.05, lr_scheduler_type="constant",
                     report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True,
                     seed=0, dataloader_drop_last=False)
    return SFTTrainer(model=model, args=args, train_dataset=Dataset.from_dict({"text": LINES}),
                      processing_class=tokenizer, callbacks=callbacks)


def _mean_token_loss(model, batches) -> float:
    """Cross-entropy per predicted token over whole batches (a batch's mean loss times its predicted tokens)."""
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            tokens = int((batch["labels"][:, 1:] != -100).sum())
            total += float(model(**batch).loss.double()) * tokens
            count += tokens
    return total / count


@torch.no_grad()
def _constraint_violation(model) -> float:
    """How far the constrained matrices are from the architecture's set: anGPT rows above norm 1, nGPT norms along
    d_model away from 1 (rows of matrices reading the stream, columns of o_proj and down_proj)."""
    worst = 0.0
    for weight, residual_output in model.constrained_matrices():
        if model.config.architecture == "angpt":
            worst = max(worst, float(weight.norm(dim=-1).max()) - 1)
        elif model.config.architecture == "ngpt":
            worst = max(worst, float((weight.norm(dim=0 if residual_output else -1) - 1).abs().max()))
    return worst


@pytest.mark.parametrize("architecture", ["gptplus", "ngpt", "angpt"])
def test_sft_trainer_packed_lowers_the_loss_and_keeps_the_constraint(tmp_path, tiny_config, tokenizer, architecture):
    torch.manual_seed(0)
    model = AnGPTForCausalLM(tiny_config(architecture, vocab_size=len(tokenizer)))
    trainer = _trainer(tmp_path, model, tokenizer, [WeightConstraintCallback()])
    batches = list(trainer.get_train_dataloader())
    assert "position_ids" in batches[0] and "attention_mask" not in batches[0]  # TRL's padding-free packing
    before = _mean_token_loss(model.eval(), batches)
    trainer.train()
    after = _mean_token_loss(model.eval(), batches)
    assert after < before - 0.5, (before, after)
    if architecture == "angpt":
        assert _constraint_violation(model) <= 1e-6
    elif architecture == "ngpt":
        assert _constraint_violation(model) <= 1e-5


def test_without_the_callback_angpt_rows_leave_the_unit_ball(tmp_path, tiny_config, tokenizer):
    """The control: SFTTrainer alone knows nothing of the constraint."""
    torch.manual_seed(0)
    model = AnGPTForCausalLM(tiny_config("angpt", vocab_size=len(tokenizer)))
    _trainer(tmp_path, model, tokenizer, []).train()
    assert _constraint_violation(model) > 1e-2


@pytest.mark.parametrize("architecture", ["gptplus", "ngpt", "angpt"])
def test_packed_loss_equals_unpacked(tmp_path, tiny_config, tokenizer, architecture):
    torch.manual_seed(0)
    model = AnGPTForCausalLM(tiny_config(architecture, vocab_size=len(tokenizer))).eval()
    packed = list(_trainer(tmp_path, model, tokenizer, [], packing=True).get_train_dataloader())
    unpacked = _trainer(tmp_path, model, tokenizer, [], packing=False)
    padded = list(unpacked.get_train_dataloader())
    assert "attention_mask" in padded[0] and (padded[0]["attention_mask"] == 0).any()  # some rows are padded
    tokenized = [torch.tensor(row["input_ids"])[None] for row in unpacked.train_dataset]  # as TRL tokenized them
    alone = [{"input_ids": ids, "labels": ids} for ids in tokenized]
    expected = _mean_token_loss(model, alone)
    assert abs(_mean_token_loss(model, packed) - expected) <= 1e-5
    assert abs(_mean_token_loss(model, padded) - expected) <= 1e-5


def _card_snippet(directory) -> str | None:
    text = (directory / "README.md").read_text()
    if "## Fine-tuning" not in text:
        return None
    return text.split("## Fine-tuning", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


def test_model_card_names_the_callback_and_its_snippet_runs(tmp_path, tiny_config, tokenizer):
    from checkpoint_fixtures import save_source
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    from modeling_angpt.export.fold import export_checkpoint

    for architecture in ("gptplus", "ngpt", "angpt"):
        save_source(tmp_path / architecture, tiny_config, architecture, vocab_size=len(tokenizer))
        tokenizer.save_pretrained(tmp_path / architecture)
    export_checkpoint(tmp_path / "angpt", tmp_path / "folded")
    assert _card_snippet(tmp_path / "gptplus") is None   # no constraint to keep
    assert _card_snippet(tmp_path / "folded") is None    # a folded checkpoint refuses training
    assert "WeightConstraintCallback" in _card_snippet(tmp_path / "ngpt")
    snippet = _card_snippet(tmp_path / "angpt")
    assert "from modeling_angpt.training import WeightConstraintCallback" in snippet
    # the snippet as written, with what a user has around it (SFTTrainer takes the tokenizer saved beside the model)
    model = AnGPTForCausalLM.from_pretrained(tmp_path / "angpt", dtype=torch.float32)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), packing=True, max_length=64, max_steps=4, learning_rate=0.05,
                     per_device_train_batch_size=2, report_to=[], save_strategy="no", disable_tqdm=True, use_cpu=True)
    namespace = {"SFTTrainer": SFTTrainer, "model": model, "args": args,
                 "dataset": Dataset.from_dict({"text": LINES})}
    exec(snippet, namespace)
    namespace["trainer"].train()
    assert _constraint_violation(model) <= 1e-6
