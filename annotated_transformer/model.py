"""The encoder-decoder Transformer, assembled from the parts of each chapter.

A tensor's way through it (Vaswani et al. 2017, Figure 1):

    src tokens [B, Ls] -> embedding * sqrt(D) + PE (ch. 1) -> the encoder: N encoder
        layers, a last norm for pre-LN (ch. 5's Encoder) -> memory [B, Ls, D]
    tgt tokens [B, Lt] -> embedding * sqrt(D) + PE -> the decoder: N decoder layers
        (self-attention with the target mask, cross-attention to the memory), a last norm
        (ch. 5's Decoder) -> hidden [B, Lt, D]
        -> generator (a linear layer) -> logits [B, Lt, V] -> loss (ch. 6)

The decoder-only ("generative") Transformer is the decoder without cross-attention:
    tokens [B, L] -> embedding * sqrt(D) + PE -> N layers of causal self-attention and
        feed-forward (chapter 5's Encoder, given the causal mask) -> logits [B, L, V]

State-dict names follow ``nn.Transformer``'s (``encoder.layers.0...``, ``encoder.norm``);
:func:`annotated_transformer.checkpoint.load` reads files written before the stacks were an
exercise (``encoder_layers.0...``) under these names.

Which implementation each part comes from is a :class:`~annotated_transformer.parts.Parts`.

Two classes of each name, one inside the other. Each kind of model has a *network* and a
*model* of the same name, because they are one Transformer seen from two sides:

- The network is the exercise: ``parts.EncoderDecoder(src_vocab_size, tgt_vocab_size,
  d_model, num_heads, d_ff, num_layers, dropout, norm_first, tie_embeddings, max_len)``
  (exercise 5.8) and ``parts.DecoderOnlyTransformer(vocab_size, d_model, ...)`` (exercise
  8.5), in ``solutions/`` or the learner's ``exercises/``: a plain ``nn.Module`` with the
  paper's sizes as its arguments, which computes logits and knows nothing of tasks,
  batches, decoding or checkpoints. Chapters 5 and 8 build it where they teach it, and
  the graded tests of 5.8 and 8.5 call it.
- The model is this module's :class:`EncoderDecoder` ``(config, parts=None)`` and
  :class:`DecoderOnlyTransformer` ``(config, parts=None)``: from a
  :class:`TransformerConfig` (the sizes a checkpoint saves and the command line sets) and
  a ``Parts`` (whose code), it builds ``parts``' network of its name, makes the network's
  modules its own (:func:`adopt`: the same objects under the same names, so its state dict
  is the network's) and adds what training, decoding, checkpoints and the command line ask
  of every kind (:class:`Model`). Chapters 6 to 8 train with it; ``checkpoint.load`` and
  the commands build it.

The model's ``forward`` is its network's, and its weights are the network's: built from
the learner's parts, the model *is* the learner's Transformer, with the package's
training and decoding around it. The network inside a model is ``model.network``; a class
of ``parts`` (``parts.EncoderDecoder``) is always the network, one of this module
(``model.EncoderDecoder``) always the model.

Each kind of model owns what differs between the kinds (:class:`Model`): how a batch is
taught (``teacher_forcing``, then ``loss``), how it decodes (``generate``), which decoding
options it accepts, and which attention it has to show. Training, decoding, checkpoints
and the command line ask the model, never which kind it is; :data:`MODELS` names the kinds
as checkpoints save them, and :func:`model_for` picks the kind a task's data is laid out for.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from annotated_transformer.data.task import Task
from annotated_transformer.data.vocab import BOS, EOS, PAD
from annotated_transformer.incremental import cached
from annotated_transformer.parts import Parts, active_parts
from annotated_transformer.sampling import complete
from annotated_transformer.teacher_forcing import LabelledInputs, language_model_batch


def adopt(model: nn.Module, network: nn.Module) -> None:
    """Make ``network``'s submodules and parameters ``model``'s own, under their names (the
    same objects: a state dict, ``.to()``, DDP and optimisers see each once), and keep
    ``network`` as ``model.network``, outside ``model``'s submodules, to call its methods
    (:meth:`Model.train` sets its mode too). A buffer of the network's own (not of a
    submodule) would be copied, not shared, by ``.to()``: refused, saying so."""
    if network._buffers:
        raise TypeError(f"{type(network).__name__} keeps buffers of its own "
                        f"({', '.join(network._buffers)}); keep them in a submodule")
    for name, module in network.named_children():
        model.add_module(name, module)
    for name, parameter in network.named_parameters(recurse=False):
        model.register_parameter(name, parameter)
    object.__setattr__(model, "network", network)  # not a submodule: its modules are model's


@dataclass
class TransformerConfig:
    """The shape of an encoder-decoder. The defaults are the paper's base model (Table 3)."""

    src_vocab_size: int
    tgt_vocab_size: int
    num_layers: int = 6
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    dropout: float = 0.1
    max_len: int = 512
    norm_first: bool = False  # post-LN, as in the paper
    tie_embeddings: bool = True  # one matrix for both embeddings and the generator

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by "
                             f"num_heads={self.num_heads}")
        if self.tie_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"tie_embeddings needs one shared vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} and tgt_vocab_size={self.tgt_vocab_size}; "
                f"pass tie_embeddings=False for separate vocabularies")

    @classmethod
    def base(cls, vocab_size: int = 37000, **changes) -> TransformerConfig:
        """The paper's base model with a shared vocabulary (about 63 M parameters at 37,000)."""
        return cls(vocab_size, vocab_size, **changes)

    @classmethod
    def small(cls, vocab_size: int, **changes) -> TransformerConfig:
        """A model for the small tasks of the course, trained in seconds on a CPU."""
        size = dict(num_layers=2, d_model=64, d_ff=256, num_heads=4, dropout=0.0,
                    norm_first=True)
        return cls(vocab_size, vocab_size, **{**size, **changes})


class UnsupportedDecoding(ValueError):
    """A decoding option that this kind of model does not have (beam search on a
    decoder-only model, sampling on an encoder-decoder)."""


class Model(nn.Module, metaclass=ABCMeta):
    """What every kind of model owns, so that nothing outside it asks which kind it is.

    - ``kind``: its name in checkpoints; ``decoder_only``: it reads a task's prompt and
      answer as one sequence (the layout of a task with ``decoder_only = True``).
    - :meth:`teacher_forcing` turns ``(src, tgt)`` into the arguments of its forward pass
      and the labels; :meth:`loss` runs the forward pass and scores the logits.
    - :meth:`generate` decodes; :meth:`check_decoding` refuses an option it does not have.
    - :meth:`read_attention` runs the forward pass that fills every attention's weights.
    """

    kind: ClassVar[str]
    decoder_only: ClassVar[bool]
    config: TransformerConfig
    parts: Parts
    network: nn.Module  # the parts' own model, whose modules are this one's (adopt)

    def train(self, mode: bool = True) -> Model:
        super().train(mode)
        self.network.training = mode  # its modules are ours: only its own flag is left
        return self

    @staticmethod
    @abstractmethod
    def longest_sequence(max_source_len: int, max_target_len: int) -> int:
        """The most positions a sequence of this kind needs, for a task's longest pair."""

    @abstractmethod
    def teacher_forcing(self, src: Tensor, tgt: Tensor) -> LabelledInputs:
        """``src [B, Ls]`` and ``tgt [B, Lt]`` of a task (on their device) as this model
        reads them in training: its forward pass's arguments and the labels."""

    def loss(self, batch: LabelledInputs, loss_fn: nn.Module, net: nn.Module | None = None
             ) -> Tensor:
        """The mean of ``loss_fn`` over the scored labels of ``batch`` (a scalar on its
        device): logits ``[B, L, V]`` against labels ``[B, L]``, flattened to ``[B*L, V]``
        and ``[B*L]``. ``net`` runs the forward pass: this model (the default) or its
        ``DistributedDataParallel`` wrapper, which must see the call to average the
        gradients. How many labels are scored is ``batch.num_tokens()``."""
        net = self if net is None else net
        model_loss = getattr(loss_fn, "model_loss", None)
        if model_loss is not None and net is self:  # the fast parts: the generator inside
            return model_loss(self, batch)  # the loss, only the scored positions computed
        logits = net(*batch.args)  # [B, L, V]
        return loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))

    def features(self, *args: Tensor) -> Tensor:
        """What the generator reads, ``[B, L, D]``: the forward pass without its last
        layer (``forward(*args) == generator(features(*args))``)."""
        raise NotImplementedError

    @abstractmethod
    def check_decoding(self, beam_size: int | None = None, temperature: float = 0.0,
                       top_k: int | None = None, top_p: float | None = None) -> None:
        """Raise :class:`UnsupportedDecoding`, saying why, for an option this kind lacks."""

    @abstractmethod
    def generate(self, src: Tensor, max_len: int, beam_size: int | None = None,
                 temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None,
                 length_penalty: float = 0.6, top_p: float | None = None) -> Tensor:
        """The model's outputs ``[B, <= max_len]`` for the inputs ``src [B, Ls]`` of a task."""

    @abstractmethod
    def read_attention(self, src: Tensor, output: Tensor
                       ) -> tuple[list[int], list[int], dict[str, list[Tensor]]]:
        """Run the forward pass on one input ``src [1, Ls]`` and its decoded ``output
        [1, Lt]``; return the ids along the source axis, those along the output axis, and
        every attention's weights, by attention (``"encoder"``, ``"decoder"``, ``"cross"``) a
        list of ``[H, queries, keys]`` per layer, on the CPU."""


class EncoderDecoder(Model):
    """The Transformer: chapter 5's ``EncoderDecoder`` of ``parts`` (the network, exercise
    5.8, built from ``config``'s sizes), with what the package asks of every model
    (:class:`Model`). Two classes, one name: the module's docstring says which is which.

    The network (embeddings, stacks, generator, its initialisation and tied weights) is the
    parts' own (exercise 5.8): ``forward(src, tgt_input, src_mask, tgt_mask)`` runs its
    ``forward`` and returns logits ``[B, Lt, V]``; masks are boolean, ``True`` = attention
    allowed (Chapter 4's ``padding_mask`` for the source, ``target_mask`` for the target).
    Its modules are this model's own (:func:`adopt`), under the same names, so a checkpoint
    is the network's state dict; :meth:`decode` adds the cache while :meth:`generate` runs.
    """

    def __init__(self, config: TransformerConfig, parts: Parts | None = None) -> None:
        super().__init__()
        self.config = config
        self.parts = parts = parts or active_parts()
        c = config
        adopt(self, parts.EncoderDecoder(
            c.src_vocab_size, c.tgt_vocab_size, c.d_model, c.num_heads, c.d_ff, c.num_layers,
            c.dropout, c.norm_first, c.tie_embeddings, c.max_len))
        self.decoder_cache = None  # set while generate decodes incrementally

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``src [B, Ls]`` -> ``memory [B, Ls, D]``: the network's ``encode``."""
        return self.network.encode(src, src_mask)  # [B, Ls, D]

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        """``memory [B, Ls, D]``, ``tgt [B, Lt]`` -> ``hidden [B, Lt, D]``: the decoder on
        the whole target (:meth:`full_decode`), or, while :meth:`generate` decodes with
        a cache, only its new positions (:mod:`~annotated_transformer.incremental`)."""
        if self.decoder_cache is not None:
            return self.decoder_cache.decode(memory, src_mask, tgt, tgt_mask)
        return self.full_decode(memory, src_mask, tgt, tgt_mask)

    def incremental_parts(self) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
        """What a :class:`~annotated_transformer.incremental.DecoderCache` computes with:
        the target's embedding, the decoder's layers, its last norm."""
        return self.tgt_embed, self.decoder.layers, self.decoder.norm

    def full_decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
                    tgt_mask: Tensor | None) -> Tensor:
        """The decoder on every position of ``tgt``: the network's ``decode``."""
        return self.network.decode(memory, src_mask, tgt, tgt_mask)  # [B, Lt, D]

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``src [B, Ls]``, ``tgt [B, Lt]`` -> logits ``[B, Lt, V]``: the network's own."""
        return self.network(src, tgt, src_mask, tgt_mask)

    def features(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                 tgt_mask: Tensor | None = None) -> Tensor:
        """The decoder's output ``[B, Lt, D]``, which the generator projects."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    kind = "encoder-decoder"
    decoder_only = False

    @staticmethod
    def longest_sequence(max_source_len: int, max_target_len: int) -> int:
        """The source and the target have positions of their own: the longer of the two."""
        return max(max_source_len, max_target_len)

    def teacher_forcing(self, src: Tensor, tgt: Tensor) -> LabelledInputs:
        """Chapter 6's ``make_batch`` of this model's parts: ``args = (src, tgt_input,
        src_mask, tgt_mask)``, ``labels = tgt_labels`` (the target shifted by one)."""
        parts = self.parts
        batch = parts.make_batch(src, tgt, PAD)
        return LabelledInputs((batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask),
                          batch.tgt_labels)

    def check_decoding(self, beam_size: int | None = None, temperature: float = 0.0,
                       top_k: int | None = None, top_p: float | None = None) -> None:
        """Greedy or beam search; sampling is for decoder-only models."""
        if temperature or top_k is not None or top_p is not None:
            raise UnsupportedDecoding(
                "sampling (--temperature, --top-k, --top-p) is for decoder-only models; this "
                "one is an encoder-decoder (decode greedily, or with --beam)")

    @torch.no_grad()
    def generate(self, src: Tensor, max_len: int, beam_size: int | None = None,
                 temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None,
                 length_penalty: float = 0.6, cache: bool = True,
                 top_p: float | None = None) -> Tensor:
        """``src [B, Ls]`` -> outputs ``[B, <= max_len]`` starting with BOS: chapter 6's
        ``greedy_decode``, or chapter 7's ``beam_search`` with ``beam_size`` beams and
        ``length_penalty`` (the paper's alpha), from this model's parts; with ``cache``,
        each layer's keys and values are kept between steps (the same tokens, faster:
        :mod:`~annotated_transformer.incremental`)."""
        self.check_decoding(beam_size, temperature, top_k, top_p)
        parts = self.parts
        src_mask = parts.padding_mask(src, PAD)
        with cached(self, cache):
            if beam_size is None:
                return parts.greedy_decode(self, src, src_mask, max_len, BOS, EOS, PAD)
            return parts.beam_search(self, src, src_mask, max_len, BOS, EOS, PAD,
                                     beam_size=beam_size, length_penalty=length_penalty)

    @torch.no_grad()
    def read_attention(self, src: Tensor, output: Tensor
                       ) -> tuple[list[int], list[int], dict[str, list[Tensor]]]:
        """Encoder self-attention (source over source), decoder self-attention (output over
        output) and cross-attention (output over source)."""
        parts = self.parts
        src_mask = parts.padding_mask(src, PAD)
        memory = self.encode(src, src_mask)
        self.decode(memory, src_mask, output,
                    parts.causal_mask(output.size(1), device=output.device))
        def weights(layers, name: str) -> list[Tensor]:
            return [getattr(layer, name).attention_weights[0].cpu() for layer in layers]
        return src[0].tolist(), output[0].tolist(), {
            "encoder": weights(self.encoder.layers, "self_attn"),
            "decoder": weights(self.decoder.layers, "self_attn"),
            "cross": weights(self.decoder.layers, "cross_attn")}


class DecoderOnlyTransformer(Model):
    """A language model: chapter 8's ``DecoderOnlyTransformer`` of ``parts`` (the network,
    exercise 8.5, built from ``config``'s sizes), with what the package asks of every model
    (:class:`Model`). Two classes, one name: the module's docstring says which is which.

    A decoder layer without its cross-attention is self-attention and a feed-forward
    network, which is what chapter 5's ``EncoderLayer`` computes: its stack (``decoder``)
    is chapter 5's ``Encoder``; with Chapter 4's ``target_mask`` (padding and causality)
    every position sees only the ones before it. ``forward(tokens [B, L], mask [B, 1, L,
    L])`` runs the network's ``forward`` and returns logits ``[B, L, V]``; its modules are
    this model's own (:func:`adopt`). The config's ``src_vocab_size`` and
    ``tgt_vocab_size`` are the same vocabulary.
    """

    def __init__(self, config: TransformerConfig, parts: Parts | None = None) -> None:
        super().__init__()
        if config.src_vocab_size != config.tgt_vocab_size:
            raise ValueError("a decoder-only model has one vocabulary: src_vocab_size and "
                             "tgt_vocab_size must be equal")
        self.config = config
        self.parts = parts = parts or active_parts()
        c = config
        adopt(self, parts.DecoderOnlyTransformer(
            c.tgt_vocab_size, c.d_model, c.num_heads, c.d_ff, c.num_layers, c.dropout,
            c.norm_first, c.tie_embeddings, c.max_len))

    def forward(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """``tokens [B, L]``, ``mask`` (causal, ``True`` = allowed) -> logits ``[B, L, V]``:
        the network's own."""
        return self.network(tokens, mask)

    def features(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        """The last layer's output, normalised, ``[B, L, D]``, which the generator projects."""
        return self.decoder(self.embed(tokens), mask)

    kind = "decoder-only"
    decoder_only = True

    def incremental_parts(self) -> tuple[nn.Module, nn.ModuleList, nn.Module]:
        """The embedding, the layers and the last norm (no cross-attention)."""
        return self.embed, self.decoder.layers, self.decoder.norm

    @staticmethod
    def longest_sequence(max_source_len: int, max_target_len: int) -> int:
        """The prompt and the answer are one sequence: their lengths add up."""
        return max_source_len + max_target_len

    def teacher_forcing(self, src: Tensor, tgt: Tensor) -> LabelledInputs:
        """The prompt ``src`` and the answer ``tgt`` joined
        (:func:`~annotated_transformer.teacher_forcing.language_model_batch`): ``args =
        (tokens, mask)`` with chapter 4's ``target_mask``, ``labels`` the next tokens with
        the prompt's set to PAD (only the answer is scored)."""
        parts = self.parts
        inputs, labels = language_model_batch(src, tgt)
        return LabelledInputs((inputs, parts.target_mask(inputs, PAD)), labels)

    def check_decoding(self, beam_size: int | None = None, temperature: float = 0.0,
                       top_k: int | None = None, top_p: float | None = None) -> None:
        """Greedy completion or sampling; beam search is for encoder-decoder models."""
        if beam_size is not None:
            raise UnsupportedDecoding(
                "beam search (--beam) is for encoder-decoder models; this one is "
                "decoder-only (use --temperature, --top-k and --top-p to sample)")

    def generate(self, src: Tensor, max_len: int, beam_size: int | None = None,
                 temperature: float = 0.0, top_k: int | None = None,
                 generator: torch.Generator | None = None,
                 length_penalty: float = 0.6, cache: bool = True,
                 top_p: float | None = None) -> Tensor:
        """The continuations ``[B, <= max_len]`` of the prompts ``src [B, Lp]``, EOS
        included (:func:`~annotated_transformer.sampling.complete`): greedy when
        ``temperature`` is 0, otherwise sampled with the parts' ``sample_next`` (chapter
        8) over the ``top_k`` likeliest tokens and the ``top_p`` nucleus
        (``length_penalty`` scores beams, which this kind refuses); ``cache``: keys and
        values kept between steps (:mod:`~annotated_transformer.incremental`)."""
        self.check_decoding(beam_size, temperature, top_k, top_p)
        return complete(self, src, max_len, temperature, top_k, generator, cache=cache,
                        top_p=top_p)

    @torch.no_grad()
    def read_attention(self, src: Tensor, output: Tensor
                       ) -> tuple[list[int], list[int], dict[str, list[Tensor]]]:
        """Causal self-attention over the prompt followed by the output, on both axes."""
        sequence = torch.cat([src, output.to(src.dtype)], dim=1)  # [1, Lp + Lt]
        parts = self.parts
        self(sequence, parts.causal_mask(sequence.size(1), device=sequence.device))
        ids = sequence[0].tolist()
        return ids, ids, {"decoder": [layer.self_attn.attention_weights[0].cpu()
                                      for layer in self.decoder.layers]}


MODELS: dict[str, type[Model]] = {m.kind: m for m in (EncoderDecoder, DecoderOnlyTransformer)}


def model_for(task: Task) -> type[Model]:
    """The kind of model that reads ``task``'s data: the one laid out like it (a prompt and
    an answer as one sequence, or a source and a target)."""
    return next(m for m in MODELS.values() if m.decoder_only == task.decoder_only)


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (a tied matrix counts once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
