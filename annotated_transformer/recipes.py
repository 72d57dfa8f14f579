"""The default recipe of each task: the model's size and the training run.

Each was measured on a 2-core CPU; the measurements are in the book (the Performance
page's table of the tasks' recipes, and Chapter 7). After Noam's warmup the rate decays
linearly to zero: on every task measured, Noam's own decay left the accuracy short of 100%.
``python -m annotated_transformer train --task NAME`` uses it unless told otherwise.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from annotated_transformer.data import Task
from annotated_transformer.model import TransformerConfig, model_for
from annotated_transformer.train import TrainConfig


@dataclass(frozen=True)
class Recipe:
    """``model``: changes to :meth:`TransformerConfig.small`; ``train``: the run."""

    model: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)

    def model_config(self, task: Task) -> TransformerConfig:
        """The model for ``task``: its vocabulary, positions for its longest sequence."""
        longest = model_for(task).longest_sequence(task.max_source_len, task.max_target_len)
        return TransformerConfig.small(len(task.vocab), max_len=max(64, longest),
                                       **self.model)

    def train_config(self, **changes) -> TrainConfig:
        return dataclasses.replace(self.train, **{k: v for k, v in changes.items()
                                                  if v is not None})


RECIPES: dict[str, Recipe] = {
    # One layer each way suffices to copy: decoder position i attends to source position i.
    "copy": Recipe(model={"num_layers": 1}, train=TrainConfig()),
    # Reversing needs each source position's distance to the end: two layers each way.
    "reverse": Recipe(model={"num_layers": 2}, train=TrainConfig(steps=1000)),
    # Many formats to one: the small model suffices; 1,500 steps reach every held-out date.
    "dates": Recipe(model={},
                    train=TrainConfig(steps=1500, lr_factor=0.5, warmup_steps=200,
                                      eval_every=250, eval_size=1000)),
    # Writing the sum from its first digit needs the carries ahead: three layers, not two.
    "addition": Recipe(model={"num_layers": 3, "d_model": 128, "d_ff": 512},
                       train=TrainConfig(steps=3000, lr_factor=0.5, warmup_steps=200,
                                         eval_every=500, eval_size=1000)),
    "tsv": Recipe(model={"d_model": 128, "d_ff": 512},
                  train=TrainConfig(steps=2000, lr_factor=1.0, warmup_steps=200,
                                    eval_every=250, eval_size=1000)),
}
