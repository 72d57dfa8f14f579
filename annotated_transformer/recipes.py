"""The default recipe of each task: the model's size and the training run.

Each toy task's was measured on a 2-core CPU; the measurements are in the book (the
Performance page's table of the tasks' recipes, and Chapter 7). After Noam's warmup the rate
decays linearly to zero: on every task measured, Noam's own decay left the accuracy short of
100%. ``python -m annotated_transformer train --task NAME`` uses it unless told otherwise.
``--model small|cpu|base|big`` replaces the recipe's model by one of :data:`MODEL_SIZES` (base
and big: the paper's Table 3, with its label smoothing; for translation, ``cpu`` is a whole
run, :data:`CPU_TRANSLATION`), and ``--layers``, ``--d-model``, ``--heads``, ``--d-ff`` and
``--dropout`` change any of its sizes (:meth:`Recipe.resized`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from annotated_transformer.data import TASKS, Task
from annotated_transformer.model import TransformerConfig
from annotated_transformer.train import COPY_MODEL, TrainConfig, model_config


@dataclass(frozen=True)
class Recipe:
    """``model``: changes to :meth:`TransformerConfig.small`; ``train``: the run."""

    model: dict = field(default_factory=dict)
    train: TrainConfig = field(default_factory=TrainConfig)
    parts: str | None = None  # the parts it trains with unless told (None: the reference)

    def model_config(self, task: Task) -> TransformerConfig:
        """The model for ``task``: its vocabulary, positions for its longest sequence."""
        return model_config(task, **self.model)

    def train_config(self, **changes) -> TrainConfig:
        """The recipe's run with ``changes`` (``None``: keep the recipe's). A batch size
        given without ``max_tokens`` replaces a recipe's batches by token budget."""
        kept = {k: v for k, v in changes.items() if v is not None}
        if "batch_size" in kept and "max_tokens" not in kept:
            kept["max_tokens"] = None
        return dataclasses.replace(self.train, **kept)

    def with_model(self, size: str) -> Recipe:
        """This recipe with the model of ``MODEL_SIZES[size]`` (and, for the paper's
        sizes, its label smoothing of 0.1)."""
        if size not in MODEL_SIZES:
            raise ValueError(f"unknown model size {size!r}: choose one of "
                             f"{', '.join(MODEL_SIZES)}")
        train = self.train
        if size in ("base", "big"):
            train = dataclasses.replace(train, label_smoothing=PAPER_LABEL_SMOOTHING)
        return dataclasses.replace(self, model=dict(MODEL_SIZES[size]), train=train)

    def resized(self, **sizes) -> Recipe:
        """This recipe with some of its model's sizes replaced (``num_layers``,
        ``d_model``, ``num_heads``, ``d_ff``, ``dropout``; ``None``: keep the recipe's).
        ``ValueError`` naming the size for an unknown name, a size below 1, a dropout
        outside ``[0, 1)`` or ``d_model`` not divisible by ``num_heads``."""
        unknown = set(sizes) - set(SIZE_NAMES)
        if unknown:
            raise ValueError(f"unknown model size(s) {', '.join(sorted(unknown))}: choose "
                             f"among {', '.join(SIZE_NAMES)}")
        given = {name: value for name, value in sizes.items() if value is not None}
        for name, value in given.items():
            if name == "dropout":
                if not 0.0 <= value < 1.0:
                    raise ValueError(f"dropout must be in [0, 1), got {value}")
            elif value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        model = {**self.model, **given}
        TransformerConfig.small(1, **model)  # d_model must be divisible by num_heads
        return dataclasses.replace(self, model=model)


# The paper's Table 3: N, d_model, d_ff, h, P_drop; post-LN. Label smoothing 0.1 for both.
PAPER_LABEL_SMOOTHING = 0.1
SIZE_NAMES = ("num_layers", "d_model", "num_heads", "d_ff", "dropout")
MODEL_SIZES: dict[str, dict] = {
    "small": {},  # TransformerConfig.small: 2 layers, d_model 64, d_ff 256, 4 heads, pre-LN
    # Between small and base: what a 2-core CPU trains on Multi30k in half an hour. Dropout
    # 0.05: in 28 minutes 0.1 learnt more slowly and 0 overfitted (the Performance page).
    "cpu": dict(num_layers=3, d_model=256, d_ff=1024, num_heads=4, dropout=0.05,
                norm_first=True),
    "base": dict(num_layers=6, d_model=512, d_ff=2048, num_heads=8, dropout=0.1,
                 norm_first=False),
    "big": dict(num_layers=6, d_model=1024, d_ff=4096, num_heads=16, dropout=0.3,
                norm_first=False),
}


@dataclass(frozen=True)
class TranslationRecipe(Recipe):
    """Positions for the longest source the task keeps and for decoding past it: an
    output may run ``extra_len`` tokens beyond its input (section 6.1: input length + 50)."""

    extra_len: int = 50
    vocab_size: int = 8000  # the shared BPE vocabulary's tokens

    def with_model(self, size: str) -> Recipe:
        """``cpu``: the whole CPU run (:data:`CPU_TRANSLATION`), not only its model."""
        return CPU_TRANSLATION if size == "cpu" else super().with_model(size)

    def model_config(self, task) -> TransformerConfig:
        return TransformerConfig.small(len(task.vocab),
                                       max_len=task.max_length + self.extra_len + 2,
                                       **self.model)


@dataclass(frozen=True)
class TextRecipe(Recipe):
    """A language model of text reads ``BOS`` and a window's first ``context - 1``
    characters: ``max_len`` is the task's ``context``, the positions it is trained on, and
    the context window it writes with (:func:`~annotated_transformer.sampling.crop`)."""

    def model_config(self, task) -> TransformerConfig:
        return TransformerConfig.small(len(task.vocab), max_len=task.context, **self.model)


# Multi30k on a CPU in 30 minutes on any machine (measured: the book's Performance page):
# 28 minutes of training, however many steps fit (3,110 on the 2-core AMD machine of the
# final run: BLEU 40.16, again 40.09; at dropout 0.1, 40.34 and 39.98), and two for
# `evaluate` (20 s; 2 min 55 s for a barely trained model on one thread of a loaded
# machine, whose translations run long). Batches of 2,048 tokens a side make twice the
# updates of 4,096 in the same time (+2.0 BLEU at the same rate); the peak rate
# 0.35 / sqrt(256 * 400), lower than 4,096's 0.5 for batches half as large, added 1.1
# more; batches of 1,024 fell behind.
CPU_TRANSLATION = TranslationRecipe(
    model=dict(MODEL_SIZES["cpu"]),
    train=TrainConfig(steps=1500, lr_factor=0.35, warmup_steps=400, decay="linear",
                      label_smoothing=PAPER_LABEL_SMOOTHING, max_tokens=2048,
                      eval_every=100, eval_size=100, time_budget=28 * 60,
                      length_penalty=1.0),  # beam 4's best on the validation split
    vocab_size=8000, parts="fast")  # the reference's function on fused kernels


@dataclass(frozen=True)
class Rung:
    """One model of a ladder (``train --model auto``, :mod:`~annotated_transformer.
    recipe_fit`): trained when the budget fits at least ``min_steps`` of its steps on this
    machine; below that, the next rung down (the comment on :data:`CPU_LADDER` says where
    each figure comes from)."""

    name: str
    recipe: Recipe
    min_steps: int = 0


def _cpu_translation(**sizes) -> TranslationRecipe:
    return dataclasses.replace(CPU_TRANSLATION, model={**CPU_TRANSLATION.model, **sizes})


# `--model auto`: the CPU recipe's run, on the largest of these models that its 28 minutes
# train enough steps of on the machine at hand (the Performance page: BLEU against a
# machine's speed). 2 + 2 layers of 192 scored at least as well as the recipe's model on
# every machine measured: on one CPU at 65% of its time, 1,946 steps, BLEU 38.21, against
# 1,030 steps and 31.15 (3 + 3 layers of 192: 1,480 steps, 35.00); on both CPUs, 5,358
# steps, 40.81, against 3,110 and 40.16 on a machine as fast. The recipe's model is kept
# for a machine that trains 4,000 of its steps in the budget, 30% more than the fastest
# measured, where its lower held-out loss (2.852 at 3,110 steps, against 2.880 at 5,358)
# has room to tell.
CPU_LADDER = (
    Rung("3 + 3 layers of 256", CPU_TRANSLATION, min_steps=4000),
    Rung("2 + 2 layers of 192", _cpu_translation(num_layers=2, d_model=192, d_ff=768)),
)

RECIPES: dict[str, Recipe] = {
    # The chapter 6 capstone's run (train.train_copy_task): one layer each way.
    "copy": Recipe(model=dict(COPY_MODEL), train=TrainConfig()),
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
    # Characters of a text file (Tiny Shakespeare: chapters/data/tiny-shakespeare): windows
    # of 64 (the task's default), four layers of 128, on the fast parts (the reference's
    # function on fused kernels: --parts exercises trains yours). No label smoothing: the
    # held-out loss is the cross-entropy, and its exp the perplexity.
    "text": TextRecipe(model={"num_layers": 4, "d_model": 128, "d_ff": 512},
                       train=TrainConfig(steps=2000, batch_size=32, lr_factor=0.5,
                                         warmup_steps=200, eval_every=500, eval_size=200),
                       parts="fast"),
    # For a GPU: the paper's base model, its label smoothing, Noam's schedule (factor 1,
    # the paper's formula) and batches of at most 4,096 padded source and target tokens.
    # Multi30k's 29,000 training pairs make about 120 such batches, so 5,000 steps are
    # about 40 passes; a warmup of 2,000 instead of 4,000 for so short a run. A starting
    # point, not tuned (see the README's "Translation").
    "translation": TranslationRecipe(
        model=dict(MODEL_SIZES["base"]),
        train=TrainConfig(steps=5000, lr_factor=1.0, warmup_steps=2000, decay="noam",
                          label_smoothing=PAPER_LABEL_SMOOTHING, max_tokens=4096,
                          eval_every=500, eval_size=1014)),
}


def recipe_for(task: str) -> Recipe:
    """The default run of the task called ``task``: :data:`RECIPES` holds one for each task
    of ``data.REGISTRY``, keyed by its name (``tests/library/test_train.py`` checks both
    ways); a ``ValueError`` that names the task otherwise."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}: choose one of {', '.join(TASKS)}")
    if task not in RECIPES:
        raise ValueError(f"task {task!r} has no recipe: add its default run to RECIPES in "
                         f"annotated_transformer/recipes.py")
    return RECIPES[task]
