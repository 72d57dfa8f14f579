"""Decoding: from a trained model to text, text in and text out.

It is a module of its own because it is the one place that joins both sides: a model
(:mod:`~annotated_transformer.model`) knows token ids only, a task
(:mod:`~annotated_transformer.data`) knows how texts become ids and back. The
``translate`` command, chapter 7 and the tests call :func:`translate`; it sits above both
(layer 3), beside training, which joins them the same way.

Every model decodes with its own ``generate``
(:meth:`~annotated_transformer.model.Model.generate`):

- Encoder-decoder models decode with Chapter 6's ``greedy_decode`` or Chapter 7's
  ``beam_search``, taken from the model's parts (the reference or the learner's).
- Decoder-only models *complete* a prompt
  (:func:`~annotated_transformer.sampling.complete`): greedily, or by sampling with a
  temperature and top-k.

Every function works on the model's device and never assumes one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from annotated_transformer.data.task import Task, pad_rows
from annotated_transformer.sampling import model_device

if TYPE_CHECKING:
    from annotated_transformer.model import Model


def translate(model: Model, task: Task, texts: list[str], beam_size: int | None = None,
              temperature: float = 0.0, top_k: int | None = None, seed: int = 0,
              batch_size: int = 256, top_p: float | None = None) -> list[str]:
    """Decode ``texts`` (unknown characters raise ``VocabularyError``) to output texts with
    the model's ``generate``: greedy, beam search with ``beam_size`` beams (encoder-decoder),
    or sampling with ``temperature``, ``top_k`` and ``top_p`` (decoder-only); an option the
    model does not have raises :class:`~annotated_transformer.model.UnsupportedDecoding`."""
    model.check_decoding(beam_size, temperature, top_k, top_p)
    model.eval()
    device = model_device(model)
    generator = torch.Generator(device=device).manual_seed(seed)
    outputs: list[str] = []
    for start in range(0, len(texts), batch_size):
        chunk = texts[start:start + batch_size]
        src = pad_rows([task.source_ids(t) for t in chunk]).to(device)
        ids = model.generate(src, task.max_target_len, beam_size, temperature, top_k, generator,
                             top_p=top_p)
        outputs.extend(task.vocab.decode(row) for row in ids.tolist())
    return outputs
