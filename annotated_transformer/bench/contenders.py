"""The three contenders (the reference parts, the fast parts, ``nn.Transformer``) and
one training step of each."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from annotated_transformer.bench.recipe_batches import Lengths, tokens
from annotated_transformer.bench.shapes import Shape
from annotated_transformer.data.vocab import BOS, PAD
from annotated_transformer.model import EncoderDecoder, TransformerConfig
from annotated_transformer.parts import Parts, load_chapter
from annotated_transformer.teacher_forcing import LabelledInputs
from annotated_transformer.train import adam

REFERENCE = Parts.reference()
CONTENDERS = ("reference", "fast", "torch")


class TorchTransformer(nn.Module):
    """``torch.nn.Transformer`` with the course model's embeddings (scaled by
    ``sqrt(d_model)``, plus the sinusoidal table, dropout), tied generator and masks.

    ``forward(src, tgt, src_mask, tgt_mask)`` takes the course's masks (``True`` =
    allowed: ``src_mask [B, 1, 1, Ls]`` padding, ``tgt_mask [B, 1, Lt, Lt]`` or
    ``[Lt, Lt]``) and hands PyTorch its own convention (``True`` = masked): a key padding
    mask for the source, and the target's causal mask with its key padding mask. It also
    has ``encode``, ``decode`` and ``generator``, so that the course's greedy decoding
    runs it."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        c = self.config = config
        self.parts = REFERENCE  # decoding and masks: the reference's chapter 4 and 6
        self.embedding = nn.Embedding(c.src_vocab_size, c.d_model)
        table = load_chapter("solutions", 1).positional_encoding(c.max_len, c.d_model)
        self.register_buffer("pe", table)
        self.dropout = nn.Dropout(c.dropout)
        self.transformer = nn.Transformer(
            c.d_model, c.num_heads, c.num_layers, c.num_layers, c.d_ff, c.dropout,
            activation="relu", batch_first=True, norm_first=c.norm_first)
        self.generator = nn.Linear(c.d_model, c.tgt_vocab_size)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        self.generator.weight = self.embedding.weight

    def embed(self, tokens: Tensor) -> Tensor:
        x = self.embedding(tokens) * math.sqrt(self.config.d_model)
        return self.dropout(x + self.pe[: tokens.size(1)])

    @staticmethod
    def _key_padding(mask: Tensor | None) -> Tensor | None:
        """``[B, 1, 1, L]`` allowed -> ``[B, L]`` masked (PyTorch's convention)."""
        return None if mask is None else ~mask.reshape(mask.size(0), mask.size(-1))

    @staticmethod
    def _target(mask: Tensor | None) -> tuple[Tensor | None, Tensor | None]:
        """The course's target mask -> ``(causal [Lt, Lt], key padding [B, Lt])``, masked =
        True. A ``[B, 1, Lt, Lt]`` target mask is causal & padding: its last row is the
        padding of the keys (the last query sees every earlier key)."""
        if mask is None:
            return None, None
        length = mask.size(-1)
        causal = ~torch.ones(length, length, dtype=torch.bool, device=mask.device).tril()
        if mask.dim() == 2:
            return causal, None
        return causal, ~mask[:, 0, -1, :]

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        return self.transformer.encoder(self.embed(src),
                                        src_key_padding_mask=self._key_padding(src_mask))

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        causal, padding = self._target(tgt_mask)
        return self.transformer.decoder(
            self.embed(tgt), memory, tgt_mask=causal, tgt_key_padding_mask=padding,
            memory_key_padding_mask=self._key_padding(src_mask), tgt_is_causal=True)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        return self.generator(self.features(src, tgt, src_mask, tgt_mask))

    def features(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                 tgt_mask: Tensor | None = None) -> Tensor:
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    # Trained and decoded the way the course's encoder-decoder is: the same batches, loss
    # and decoding (from the reference's parts).
    teacher_forcing = EncoderDecoder.teacher_forcing
    loss = EncoderDecoder.loss
    generate = EncoderDecoder.generate
    check_decoding = EncoderDecoder.check_decoding


def build(contender: str, config: TransformerConfig, device: torch.device
          ) -> tuple[nn.Module, Callable[[Tensor, Tensor], Tensor]]:
    """A contender's model (on ``device``) and its loss function."""
    if contender == "torch":
        model = TorchTransformer(config)

        def loss_fn(logits: Tensor, target: Tensor) -> Tensor:
            return F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=0.1)
    else:
        parts = REFERENCE if contender == "reference" else Parts("fast")
        model = EncoderDecoder(config, parts=parts)
        loss_fn = parts.LabelSmoothingLoss(0.1, ignore_index=PAD)
    return model.to(device), loss_fn


# ---------------------------------------------------------------- training throughput


class Trainer:
    """One contender at one shape: a model, its optimizer and a fixed batch (or, given
    ``lengths``, one batch of random tokens with each such row lengths, padded:
    ``step(i)`` trains on the ``i``-th, modulo their number)."""

    def __init__(self, contender: str, shape: Shape, device: torch.device,
                 precision: str = "fp32", compile: bool = False, seed: int = 0,
                 backend: str = "inductor", lengths: list[Lengths] | None = None) -> None:
        torch.manual_seed(seed)
        if lengths:  # positions for the longest row
            longest = max(max(*s, *t) for s, t in lengths)
            shape = replace(shape, length=max(shape.length, longest))
        self.model, self.loss_fn = build(contender, shape.config(), device)
        # The whole model, its one batch shape: a static graph (the training command
        # compiles the layers for every shape instead, train.compile_model)
        self.net = (torch.compile(self.model, dynamic=False, backend=backend) if compile
                    else self.model)
        self.optimizer = adam(self.model.parameters(), lr=1e-4)  # small: no step diverges
        self.device, self.shape, self.precision = device, shape, precision
        generator = torch.Generator().manual_seed(seed)
        src = torch.randint(3, shape.vocab, (shape.batch, shape.length), generator=generator)
        tgt = torch.randint(3, shape.vocab, (shape.batch, shape.length + 1),
                            generator=generator)
        tgt[:, 0] = BOS
        self.src, self.tgt = src.to(device), tgt.to(device)
        self.batch = REFERENCE.make_batch(self.src, self.tgt, PAD)  # the same masks for all
        batch = self.batch
        self.inputs = LabelledInputs((batch.src, batch.tgt_input, batch.src_mask,
                                      batch.tgt_mask), batch.tgt_labels)
        self.batches = [self.inputs]
        if lengths:
            self.batches = [self.labelled(*tokens(row_lengths, shape.vocab, generator))
                            for row_lengths in lengths]
            self.inputs = self.batches[0]
        self.model.train()
        self.parameters = list(self.model.parameters())

    def labelled(self, src: Tensor, tgt: Tensor) -> LabelledInputs:
        """The batch of ``src`` and ``tgt`` on this trainer's device, with the reference's
        masks (the same for every contender)."""
        batch = REFERENCE.make_batch(src.to(self.device), tgt.to(self.device), PAD)
        return LabelledInputs((batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask),
                              batch.tgt_labels)

    def step(self, index: int | None = None) -> Tensor:
        """One training step (on batch ``index`` of several); returns the loss, left on
        the device (nothing waits for it)."""
        inputs = self.inputs if index is None else self.batches[index % len(self.batches)]
        device = self.device
        autocast = (torch.autocast(device.type, dtype=torch.bfloat16)
                    if self.precision == "bf16" else _nothing())
        with autocast:  # as `train` computes it (the fast parts: the generator in the loss)
            loss = self.model.loss(inputs, self.loss_fn, self.net)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(self.parameters, 1.0, foreach=True)
        self.optimizer.step()
        return loss.detach()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False

