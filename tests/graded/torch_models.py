"""Trusted models for the graded tests, built only from PyTorch's own modules.

The grader never runs the code under test in its own process (see the grading plugin,
:mod:`annotated_transformer.course.grading.plugin`): a test that needs a whole model's output
(greedy decoding, the capstone) gets the *weights* from the worker and evaluates them here,
in :class:`TorchEncoderDecoder`, a Transformer made of ``nn.Embedding``,
``nn.TransformerEncoderLayer``, ``nn.TransformerDecoderLayer``, ``nn.LayerNorm`` and
``nn.Linear``, with the course's interface and masks. Its
:meth:`~TorchEncoderDecoder.load_course_state_dict` reads the state dict of the course's
``annotated_transformer.model.EncoderDecoder``, whose names the syllabus fixes. Nothing
here imports the course's parts, the reference solutions or the exercises.

:func:`greedy_decode` is a plain greedy decoder (one row at a time, the whole prefix re-run
at each step) following the contract of exercise 6.4, for expected values.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["TorchEncoderDecoder", "TorchLanguageModel", "greedy_decode", "sinusoidal_table"]


def sinusoidal_table(max_len: int, d_model: int) -> Tensor:
    """``PE[pos, 2i] = sin(pos / 10000^(2i/d))``, ``PE[pos, 2i+1] = cos(...)``, float32."""
    position = torch.arange(max_len, dtype=torch.float64)[:, None]
    inv_freq = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    table = torch.zeros(max_len, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table.float()


def blocked(mask: Tensor | None, batch: int, heads: int, queries: int,
            keys: int) -> Tensor | None:
    """A course mask (bool, ``True`` = allowed, broadcastable to ``[B, H, Lq, Lk]``) as
    PyTorch's attention mask: bool, ``True`` = blocked, ``[B * H, Lq, Lk]``."""
    if mask is None:
        return None
    mask = torch.as_tensor(mask).bool()
    return (~mask).expand(batch, heads, queries, keys).reshape(batch * heads, queries, keys)


class TorchEncoderDecoder(nn.Module):
    """The course's encoder-decoder (``annotated_transformer.model.EncoderDecoder``) made of
    PyTorch's own modules: ``encode(src, src_mask)``, ``decode(memory, src_mask, tgt,
    tgt_mask)``, ``generator(hidden)`` (log-probabilities) and ``forward``.

    ``config`` is a ``TransformerConfig`` or anything with its fields (``src_vocab_size``,
    ``tgt_vocab_size``, ``num_layers``, ``d_model``, ``d_ff``, ``num_heads``, ``dropout``,
    ``max_len``, ``norm_first``, ``tie_embeddings``). Masks follow the course: bool, ``True``
    = attention allowed, broadcastable to ``[B, H, Lq, Lk]``, or ``None``. (A query whose
    keys are all masked gets NaN here where the course's attention gives zeros; the course's
    padding and target masks never make one.)
    """

    def __init__(self, config) -> None:
        super().__init__()
        c = self.config = config
        self.d_model, self.num_heads = c.d_model, c.num_heads
        self.src_embed = nn.Embedding(c.src_vocab_size, c.d_model)
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.register_buffer("pe", sinusoidal_table(c.max_len, c.d_model), persistent=False)
        self.embed_dropout = nn.Dropout(c.dropout)
        layer = dict(d_model=c.d_model, nhead=c.num_heads, dim_feedforward=c.d_ff,
                     dropout=c.dropout, activation="relu", batch_first=True,
                     norm_first=c.norm_first)
        self.encoder_layers = nn.ModuleList(
            [nn.TransformerEncoderLayer(**layer) for _ in range(c.num_layers)])
        self.decoder_layers = nn.ModuleList(
            [nn.TransformerDecoderLayer(**layer) for _ in range(c.num_layers)])
        # Pre-LN leaves the residual stream unnormalised: one LayerNorm at each stack's end.
        self.encoder_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.decoder_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.projection = nn.Linear(c.d_model, c.tgt_vocab_size)
        if c.tie_embeddings:
            self.tgt_embed.weight = self.src_embed.weight
            self.projection.weight = self.src_embed.weight

    def _embed(self, embedding: nn.Embedding, tokens: Tensor) -> Tensor:
        x = embedding(tokens) * math.sqrt(self.d_model)
        return self.embed_dropout(x + self.pe[: tokens.size(1)].to(x.dtype))

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """``src [B, Ls]`` -> ``memory [B, Ls, D]``."""
        x = self._embed(self.src_embed, src)
        batch, length = src.shape
        mask = blocked(src_mask, batch, self.num_heads, length, length)
        for layer in self.encoder_layers:
            x = layer(x, src_mask=mask)
        return self.encoder_norm(x)

    def decode(self, memory: Tensor, src_mask: Tensor | None, tgt: Tensor,
               tgt_mask: Tensor | None) -> Tensor:
        """``memory [B, Ls, D]``, ``tgt [B, Lt]`` -> ``hidden [B, Lt, D]``."""
        x = self._embed(self.tgt_embed, tgt)
        batch, length = tgt.shape
        self_mask = blocked(tgt_mask, batch, self.num_heads, length, length)
        cross_mask = blocked(src_mask, batch, self.num_heads, length, memory.size(1))
        for layer in self.decoder_layers:
            x = layer(x, memory, tgt_mask=self_mask, memory_mask=cross_mask)
        return self.decoder_norm(x)

    def generator(self, hidden: Tensor) -> Tensor:
        """``hidden [..., D]`` -> log-probabilities ``[..., V]``."""
        return F.log_softmax(self.projection(hidden), dim=-1)

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None,
                tgt_mask: Tensor | None = None) -> Tensor:
        """``src [B, Ls]``, ``tgt [B, Lt]`` -> log-probabilities ``[B, Lt, V]``."""
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))

    # ------------------------------------------------------------ the course's names

    def load_course_state_dict(self, state_dict: Mapping[str, Tensor]) -> None:
        """Load the state dict of the course's ``EncoderDecoder`` (names of the syllabus).

        The positional tables (``*.positions.pe``) are not taken: this model computes its
        own from the formula. Raises ``KeyError`` naming every key it does not know, every
        parameter the state dict lacks and every weight whose shape is not this model's,
        before anything is copied (the shapes are this model's, never the state dict's).
        """
        mine: dict[str, Tensor] = {}
        unknown = []
        qkv: dict[str, dict[str, Tensor]] = {}  # "prefix.kind" -> {"q": ..., "k": ..., "v": ...}
        for key, value in state_dict.items():
            target = self._course_name(key)
            if target is None:
                unknown.append(key)
            elif target == "":
                continue  # a positional table
            elif target.startswith("qkv:"):
                prefix, part = target[4:].rsplit(":", 1)
                qkv.setdefault(prefix, {})[part] = value
            else:
                mine[target] = value
        if unknown:
            raise KeyError(
                f"the state dict has keys that the course's EncoderDecoder does not have "
                f"(the syllabus fixes its names): {', '.join(unknown)}")
        shapes = {name: tuple(value.shape) for name, value in self.state_dict().items()}
        wrong = []
        for prefix, parts in qkv.items():  # "...self_attn.in_proj_weight": [q; k; v]
            missing = [f"{p}_proj" for p in "qkv" if p not in parts]
            if missing:
                raise KeyError(f"the state dict has no {', '.join(missing)} for {prefix}")
            rows, *rest = shapes.get(prefix, (0,))
            wrong += [f"{prefix} ({p}_proj)" for p in "qkv"
                      if not _shaped(parts[p], (rows // 3, *rest))]
            if not wrong:
                mine[prefix] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
        wrong += [name for name, value in mine.items()
                  if name not in shapes or not _shaped(value, shapes[name])]
        if wrong:
            raise KeyError(f"these weights are not the model's or do not have its shapes "
                           f"(PyTorch's names): {', '.join(sorted(wrong)[:6])}")
        lacking = sorted(set(shapes) - set(mine))
        if lacking:
            raise KeyError(f"the state dict lacks these weights of the model (PyTorch's "
                           f"names): {', '.join(lacking)}")
        self.load_state_dict(mine, strict=True)

    _LAYER = re.compile(
        r"^(?P<stack>encoder|decoder)\.layers\.(?P<i>\d+)\.(?P<rest>.+)$")
    _ATTN = re.compile(r"^(?P<attn>self_attn|cross_attn)\.(?P<p>[qkv]|out)_proj\."
                       r"(?P<kind>weight|bias)$")
    _FIXED = {
        "src_embed.tokens.embedding.weight": "src_embed.weight",
        "tgt_embed.tokens.embedding.weight": "tgt_embed.weight",
        "src_embed.positions.pe": "",
        "tgt_embed.positions.pe": "",
        "encoder.norm.weight": "encoder_norm.weight",
        "encoder.norm.bias": "encoder_norm.bias",
        "decoder.norm.weight": "decoder_norm.weight",
        "decoder.norm.bias": "decoder_norm.bias",
        "generator.weight": "projection.weight",
        "generator.bias": "projection.bias",
    }

    def _course_name(self, key: str) -> str | None:
        """The name of ``key`` here; ``""`` for a table not taken; ``"qkv:..."`` for one
        third of an input projection; ``None`` for a key the course's model lacks."""
        if key in self._FIXED:
            if key.startswith(("encoder.norm", "decoder.norm")) and not self.config.norm_first:
                return None
            return self._FIXED[key]
        match = self._LAYER.match(key)
        if not match:
            return None
        stack, i, rest = match["stack"], int(match["i"]), match["rest"]
        if i >= self.config.num_layers:
            return None
        prefix = f"{stack}_layers.{i}"
        attn = self._ATTN.match(rest)
        if attn:
            if attn["attn"] == "cross_attn" and stack == "encoder":
                return None
            mha = "self_attn" if attn["attn"] == "self_attn" else "multihead_attn"
            if attn["p"] == "out":
                return f"{prefix}.{mha}.out_proj.{attn['kind']}"
            return f"qkv:{prefix}.{mha}.in_proj_{attn['kind']}:{attn['p']}"
        ff = re.fullmatch(r"feed_forward\.(linear[12])\.(weight|bias)", rest)
        if ff:
            return f"{prefix}.{ff[1]}.{ff[2]}"
        norm = re.fullmatch(r"residuals\.(\d)\.norm\.(weight|bias)", rest)
        if norm and int(norm[1]) < (2 if stack == "encoder" else 3):
            return f"{prefix}.norm{int(norm[1]) + 1}.{norm[2]}"
        return None


def _shaped(value: object, shape: tuple[int, ...]) -> bool:
    """Whether ``value`` is a tensor of shape ``shape``."""
    return isinstance(value, Tensor) and tuple(value.shape) == tuple(shape)


class TorchLanguageModel(TorchEncoderDecoder):
    """The course's decoder-only model (``annotated_transformer.model.DecoderOnlyTransformer``)
    made of PyTorch's own modules: its layers are encoder layers run with the causal mask.
    ``forward(tokens [B, L], mask)`` -> logits ``[B, L, V]``, as the course's model returns.
    :meth:`load_course_state_dict` reads the course model's state dict (``embed.*``,
    ``decoder.layers.*``, ``decoder.norm.*``, ``generator.*``: its stack is chapter 5's
    ``Encoder``)."""

    def __init__(self, config) -> None:
        nn.Module.__init__(self)
        c = self.config = config
        self.d_model, self.num_heads = c.d_model, c.num_heads
        self.src_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.register_buffer("pe", sinusoidal_table(c.max_len, c.d_model), persistent=False)
        self.embed_dropout = nn.Dropout(c.dropout)
        self.encoder_layers = nn.ModuleList([nn.TransformerEncoderLayer(
            d_model=c.d_model, nhead=c.num_heads, dim_feedforward=c.d_ff, dropout=c.dropout,
            activation="relu", batch_first=True, norm_first=c.norm_first)
            for _ in range(c.num_layers)])
        self.encoder_norm = nn.LayerNorm(c.d_model) if c.norm_first else nn.Identity()
        self.projection = nn.Linear(c.d_model, c.tgt_vocab_size)
        if c.tie_embeddings:
            self.projection.weight = self.src_embed.weight

    def forward(self, tokens: Tensor, mask: Tensor | None) -> Tensor:
        return self.projection(self.encode(tokens, mask))

    _RENAMED = (("embed.", "src_embed."), ("decoder.layers.", "encoder.layers."),
                ("decoder.norm.", "encoder.norm."))

    def load_course_state_dict(self, state_dict: Mapping[str, Tensor]) -> None:
        """Load the course's ``DecoderOnlyTransformer`` state dict (names of the syllabus);
        ``KeyError`` as :meth:`TorchEncoderDecoder.load_course_state_dict`."""
        renamed = {}
        for key, value in state_dict.items():
            for course, here in self._RENAMED:
                if key.startswith(course):
                    key = here + key[len(course):]
                    break
            else:
                if not key.startswith("generator."):
                    key = "unknown:" + key
            renamed[key] = value
        super().load_course_state_dict(renamed)


@torch.no_grad()
def complete_greedily(model, prompts: Tensor, new_tokens: int) -> Tensor:
    """A decoder-only model's greedy continuation of ``prompts [B, Lp]`` (no padding):
    ``new_tokens`` more tokens, the whole prefix re-run at each step."""
    ys = prompts
    for _ in range(new_tokens):
        causal = torch.ones(ys.size(1), ys.size(1), dtype=torch.bool).tril()
        ys = torch.cat([ys, model(ys, causal)[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ys[:, prompts.size(1):]

def greedy_decode(model, src: Tensor, src_mask: Tensor | None, max_len: int, bos_id: int,
                  eos_id: int, pad_id: int) -> Tensor:
    """Greedy decoding, one row at a time, the whole prefix re-run at each step.

    The contract of exercise 6.4: ``[B, <= max_len]`` long, the first column BOS
    (``max_len`` counts it); a row stops at its EOS; the output stops once every row has
    produced EOS or has ``max_len`` columns; ``pad_id`` after a row's EOS.
    """
    if src_mask is not None:  # [B, 1, 1, Ls] (or anything that broadcasts to it), per row
        src_mask = torch.as_tensor(src_mask)
        src_mask = src_mask.reshape((1,) * (4 - src_mask.dim()) + tuple(src_mask.shape))
        src_mask = src_mask.expand(src.size(0), *src_mask.shape[1:])
    rows = []
    with torch.no_grad():
        for b in range(src.size(0)):
            row_mask = None if src_mask is None else src_mask[b:b + 1]
            memory = model.encode(src[b:b + 1], row_mask)
            ys = [bos_id]
            while len(ys) < max_len and ys[-1] != eos_id:
                tgt = torch.tensor([ys], device=src.device)
                causal = torch.ones(len(ys), len(ys), dtype=torch.bool,
                                    device=src.device).tril()
                hidden = model.decode(memory, row_mask, tgt, causal)
                ys.append(int(model.generator(hidden[0, -1]).argmax()))
            rows.append(ys)
    width = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
