"""Run by tests/tools/test_deepspeed.py: transformers' Trainer with DeepSpeed ZeRO (stage 2 or 3) on the processes
torchrun starts (DS_ACCELERATOR=cpu), or with no DeepSpeed in one process (the oracle); anGPT trains a few AdamW steps
at a learning rate that pushes its weight rows out of the unit ball, with or without WeightConstraintCallback
(docs/tools.md, "DeepSpeed").

    python training_deepspeed_driver.py OUT STAGE CALLBACK      (STAGE 0: no DeepSpeed; CALLBACK 0 or 1)

Rank 0 writes OUT/report.json: each step's loss, the worst row norm of the trained matrices (gathered whole under
ZeRO-3), the logits of a probe batch; the model is saved to OUT/model (under ZeRO-3 gathered from the partitions).
The global batch is the same in every run: 4 windows a step, in order (each process reads its own 4/N of them)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.utils.data import Dataset, SequentialSampler
from transformers import Trainer, TrainingArguments

from modeling_angpt import AnGPTConfig, AnGPTForCausalLM
from modeling_angpt.training.callbacks import WeightConstraintCallback

STEPS, GLOBAL_BATCH, LENGTH, LEARNING_RATE = 8, 4, 16, 0.05


class Windows(Dataset):
    """Fixed token windows: sample i is the same in every run."""

    def __init__(self, count: int, vocab_size: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab_size, (count, LENGTH), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


class InOrder(Trainer):
    """The windows in order: with N processes, Accelerate hands process r the batches r, r + N, ..., so each
    global batch holds the same windows as one process's batch of GLOBAL_BATCH."""

    def _get_train_sampler(self, *args, **kwargs):
        return SequentialSampler(self.train_dataset)


def zero_config(stage: int) -> dict:
    config = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto",
              "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "zero_allow_untested_optimizer": True}
    if stage == 3:  # every parameter partitioned, however small; save_model gathers the whole weights
        config["zero_optimization"].update(stage3_param_persistence_threshold=0,
                                           stage3_gather_16bit_weights_on_model_save=True)
    return config


def worst_row_norm(model) -> float:
    """The largest row norm over the matrices the constraint covers, each whole (gathered under ZeRO-3)."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())), torch.no_grad():
        return max(weight.norm(dim=-1).max().item() for weight, _ in model.constrained_matrices())


def main() -> None:
    out, stage, with_callback = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
    torch.manual_seed(0)
    config = AnGPTConfig(architecture="angpt", vocab_size=101, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=4, max_position_embeddings=64)
    model = AnGPTForCausalLM(config)
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    args = TrainingArguments(output_dir=str(out / "trainer"), max_steps=STEPS, learning_rate=LEARNING_RATE,
                             per_device_train_batch_size=GLOBAL_BATCH // processes, lr_scheduler_type="constant",
                             warmup_steps=0, weight_decay=0.0, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, disable_tqdm=True, seed=0, data_seed=0,
                             deepspeed=zero_config(stage) if stage else None)
    trainer = InOrder(model=model, args=args, train_dataset=Windows(STEPS * GLOBAL_BATCH, config.vocab_size),
                      callbacks=[WeightConstraintCallback()] if with_callback else [])
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    norm = worst_row_norm(trainer.model)
    trainer.save_model(str(out / "model"))
    probe = Windows(2, config.vocab_size).ids
    model = trainer.model
    import deepspeed  # its gather does nothing to parameters it does not partition

    with deepspeed.zero.GatheredParameters(list(model.parameters())), torch.no_grad():
        logits = model.eval()(probe).logits
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(logits, out / "logits.pt")
        (out / "report.json").write_text(json.dumps({"losses": losses, "worst_row_norm": norm,
                                                     "processes": processes}))


if __name__ == "__main__":
    main()
