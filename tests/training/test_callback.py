"""transformers.Trainer + WeightConstraintCallback keeps anGPT's rows in the unit ball (docs/architectures.md)."""
import torch
from training_fixtures import max_row_norm, single_thread  # noqa: F401 (fixture)
from transformers import Trainer, TrainerCallback, TrainingArguments

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training import WeightConstraintCallback


class RecordRowNorms(TrainerCallback):
    def __init__(self):
        self.norms = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.norms.append(max_row_norm(model))


def _train(tmp_path, with_constraint: bool) -> list[float]:
    torch.manual_seed(0)
    model = AnGPTForCausalLM(AnGPTConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2,
                                         num_attention_heads=2, max_position_embeddings=32))
    data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 128, (64, 32))]
    args = TrainingArguments(output_dir=str(tmp_path / f"trainer{with_constraint}"), max_steps=6,
                             per_device_train_batch_size=8, learning_rate=0.05, lr_scheduler_type="constant",
                             report_to=[], save_strategy="no", logging_strategy="no", disable_tqdm=True,
                             use_cpu=True, seed=0)
    recorder = RecordRowNorms()
    callbacks = ([WeightConstraintCallback()] if with_constraint else []) + [recorder]
    Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    return recorder.norms


def test_callback_keeps_rows_in_the_unit_ball_during_training(tmp_path):
    with_callback = _train(tmp_path, True)
    assert len(with_callback) == 6 and max(with_callback) <= 1 + 1e-5
    without = _train(tmp_path, False)       # the control: plain Trainer lets rows grow past 1
    assert max(without) > 1.01
