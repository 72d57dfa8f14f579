"""Checkpoints: everything a run needs to evaluate, decode or resume, in one file.

A checkpoint holds the model's kind, config and weights, the parts it was built from,
the task (its spec and vocabulary), the training recipe, the step, the optimizer's and the
schedule's state, the random states (the global torch one and the data generator's) and
the history so far. It is written atomically: to a temporary file in the same folder,
then renamed over the old one, so an interrupted save never leaves a broken checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path

import torch

from annotated_transformer.data import Task, make_task, vocabulary_from_dict
from annotated_transformer.model import MODELS, Model, TransformerConfig
from annotated_transformer.parts import Parts

FILE_NAME = "checkpoint.pt"
FORMAT = 1
REQUIRED = ("format", "kind", "model_config", "model", "task", "vocab", "parts", "step")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, and why."""


def save(path: Path, state: dict) -> None:
    """``torch.save`` to a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(state, file)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def save_training(path: Path, model: Model, task: Task, config, step: int, optimizer,
                  scheduler, generator: torch.Generator, history=None) -> None:
    """Save a run at ``step``: enough to evaluate the model and to resume training."""
    save(path, {
        "format": FORMAT,
        "kind": model.kind,
        "model_config": dataclasses.asdict(model.config),
        "model": model.state_dict(),
        "parts": {"default": model.parts.default, "chapters": dict(model.parts.chapters)},
        "task": task.spec(),
        "vocab": task.vocab.to_dict(),
        "train_config": dataclasses.asdict(config),
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {"torch": torch.get_rng_state(), "data": generator.get_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "history": dataclasses.asdict(history) if history is not None else {},
    })


WEIGHTS = ("float32", "float16", "int8")


def export(state: dict, path: Path, weights: str = "float32") -> None:
    """A checkpoint without what only resuming needs (optimizer, schedule, random states):
    a third of the size, enough to evaluate, decode and draw attention.

    ``weights``: how the parameters are stored (buffers such as the positional table stay
    as they are; a model built from the file computes in float32 as usual):
    ``float16`` halves the size, each weight rounded to 11 significant bits; ``int8``
    quarters it: each row ``w`` of a matrix becomes ``round(w / s)`` in ``[-127, 127]``
    with its scale ``s = max|w| / 127`` (an error of at most ``s / 2`` per weight), and
    vectors (biases, norms) go to float16. A tied matrix stays one tensor."""
    if weights not in WEIGHTS:
        raise CheckpointError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    kept = {k: v for k, v in state.items() if k not in ("optimizer", "scheduler", "rng")}
    if weights != "float32":
        kept["model"], kept["scales"] = compress(kept["model"], parameter_names(state),
                                                 weights)
    save(path, kept)


def parameter_names(state: dict) -> set[str]:
    """The state dict's names that are parameters (tied ones under every name)."""
    with torch.device("meta"):
        model = MODELS[state["kind"]](TransformerConfig(**state["model_config"]),
                                      parts=Parts.reference())
    return {name for name, _ in model.named_parameters(remove_duplicate=False)}


def compress(weights: dict, parameters: set[str], stored_as: str
             ) -> tuple[dict, dict[str, torch.Tensor]]:
    """``weights`` with its parameters stored as ``stored_as`` (see :func:`export`), and the
    int8 matrices' row scales by name."""
    stored, scales, first = {}, {}, {}
    for name, tensor in weights.items():
        if name not in parameters:
            stored[name] = tensor
            continue
        seen = first.setdefault(tensor.data_ptr(), name)
        if seen != name:  # tied: the same stored tensor under this name too
            stored[name] = stored[seen]
            if seen in scales:
                scales[name] = scales[seen]
        elif stored_as == "int8" and tensor.dim() == 2:
            scale = tensor.abs().amax(dim=1).float().clamp_min(1e-30) / 127  # [rows]
            stored[name] = torch.round(tensor / scale[:, None]).to(torch.int8)
            scales[name] = scale
        else:
            stored[name] = tensor.to(torch.float16)
    return stored, scales


def model_weights(state: dict) -> dict:
    """The state dict of the checkpoint's model, int8 matrices multiplied back by their
    row scales (float16 ones are cast when loaded)."""
    scales = state.get("scales") or {}
    return {name: tensor.float() * scales[name][:, None] if name in scales else tensor
            for name, tensor in state["model"].items()}


# The state-dict prefixes of each kind of model before its stacks were chapter 5's Encoder
# and Decoder (the committed checkpoints of the chapters among them), and theirs now.
FORMER_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "encoder-decoder": (("encoder_layers.", "encoder.layers."), ("encoder_norm.", "encoder.norm."),
                        ("decoder_layers.", "decoder.layers."), ("decoder_norm.", "decoder.norm.")),
    "decoder-only": (("layers.", "decoder.layers."), ("norm.", "decoder.norm.")),
}


def load(path: Path | str, map_location: str | torch.device = "cpu") -> dict:
    """Read a checkpoint; a missing, truncated or foreign file raises :class:`CheckpointError`."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint file")
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as error:  # torch raises many kinds for a corrupted file
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error)
        raise CheckpointError(f"{path}: not a readable checkpoint ({first_line})") from None
    missing = [k for k in REQUIRED if not isinstance(state, dict) or k not in state]
    if missing:
        raise CheckpointError(f"{path}: not a checkpoint of this package (missing "
                              f"{', '.join(missing)})")
    if state["format"] != FORMAT or state["kind"] not in MODELS:
        raise CheckpointError(f"{path}: unsupported checkpoint (format {state['format']}, "
                              f"kind {state['kind']!r})")
    vocab = state["vocab"]
    if isinstance(vocab, dict) and "kind" in vocab and "level" not in vocab:
        # written before a subword vocabulary's level had that name (the committed
        # translators among them): read as every newer file says it
        state["vocab"] = {("level" if key == "kind" else key): value
                          for key, value in vocab.items()}
    for former, now in FORMER_NAMES[state["kind"]]:  # written before chapter 5's stacks
        for part in ("model", "scales"):  # the weights, and the row scales of int8 ones
            if isinstance(state.get(part), dict):
                state[part] = {now + key[len(former):] if key.startswith(former) else key: value
                               for key, value in state[part].items()}
    return state


def build_task(state: dict, data: str | None = None) -> Task:
    """The checkpoint's task, with the vocabulary it was trained with."""
    spec = dict(state["task"])
    if data is not None and "path" in spec:
        spec["path"] = data
    # The translation task: its corpus (--data) and its subword vocabulary (saved inside).
    if data is not None and "dataset" in spec:
        spec["dataset"] = data
    if spec["task"] == "translation" and "tokenizer" not in state["vocab"]:
        raise CheckpointError("this translation checkpoint holds no subword tokenizer (its "
                              "vocabulary has no 'tokenizer'): it cannot encode or decode text")
    task = make_task(**spec)
    vocab = vocabulary_from_dict(state["vocab"])
    object.__setattr__(task, "vocab", vocab)
    return task


def build_model(state: dict, parts: Parts | None = None,
                device: str | torch.device = "cpu") -> Model:
    """The checkpoint's model with its weights, from ``parts`` (default: those it was
    trained with), in eval mode on ``device``."""
    config = TransformerConfig(**state["model_config"])
    if parts is None:
        parts = Parts(state["parts"]["default"],
                      {int(c): s for c, s in state["parts"]["chapters"].items()})
    model = MODELS[state["kind"]](config, parts=parts)
    try:
        model.load_state_dict(model_weights(state))
    except RuntimeError as error:
        raise CheckpointError(f"the checkpoint's weights do not fit the model built from "
                              f"{parts.describe()}: {str(error).splitlines()[0]}") from None
    return model.to(device).eval()


def check_compatible(state: dict, model: Model, task: Task) -> None:
    """Resuming needs the same kind of model, the same config and the same task."""
    if state["kind"] != model.kind:
        raise CheckpointError(f"the checkpoint holds a {state['kind']} model, not "
                              f"{model.kind}")
    config = dataclasses.asdict(model.config)
    if state["model_config"] != config:
        changed = sorted(k for k in config if state["model_config"].get(k) != config[k])
        raise CheckpointError(f"the checkpoint's model config differs in {', '.join(changed)}")
    if state["task"] != task.spec():
        raise CheckpointError(f"the checkpoint was trained on {state['task']}, not "
                              f"{task.spec()}")


def restore_training(state: dict, model: Model, optimizer, scheduler,
                     generator: torch.Generator) -> int:
    """Load weights, optimizer, schedule and random states; return the checkpoint's step."""
    if "optimizer" not in state:
        raise CheckpointError("this checkpoint was exported without its optimizer state: it "
                              "can be evaluated, not resumed")
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["torch"].cpu())
    generator.set_state(state["rng"]["data"].cpu())
    if state["rng"]["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["rng"]["cuda"]])
    return int(state["step"])
