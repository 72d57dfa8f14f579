"""Chapter 8: plausible wrong answers and other correct answers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from annotated_transformer.parts import active_parts

from variants import right, wrong


def _check(temperature, top_k, top_p):
    if temperature < 0:
        raise ValueError(f"temperature must be at least 0, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


def _greedy(logits):
    return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)


def _top_k(logits, top_k, keep_kth=True):
    if top_k is None or top_k >= logits.size(-1):
        return logits
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    drop = logits < kth if keep_kth else logits <= kth
    return logits.masked_fill(drop, float("-inf"))


def _nucleus(probs, top_p, inclusive=False):
    """Keep a token when the more probable tokens (``inclusive``: and itself and its ties)
    add up to less than ``top_p``; renormalise."""
    if top_p is None or top_p >= 1:
        return probs
    above = torch.stack([((probs >= p[..., None]) if inclusive else (probs > p[..., None]))
                         .mul(probs).sum(-1) for p in probs.unbind(-1)], -1)
    kept = probs.masked_fill(above >= top_p, 0.0)
    total = kept.sum(-1, keepdim=True)
    return torch.where(total > 0, kept / total, kept)


# ------------------------------------------------------------------ 8.1


@wrong("8.1", "next_token_distribution", "the temperature divides the probabilities after the "
       "softmax (and they are renormalised: the temperature does nothing)",
       mistake="8.1/temperature-after-softmax")
def temperature_after_softmax(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = torch.softmax(_top_k(logits, top_k), dim=-1) / temperature
    return _nucleus(probs / probs.sum(-1, keepdim=True), top_p)


@wrong("8.1", "next_token_distribution", "softmax(logits * T)",
       mistake="8.1/temperature-multiplied")
def temperature_multiplied(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    return _nucleus(torch.softmax(_top_k(logits * temperature, top_k), dim=-1), top_p)


@wrong("8.1", "next_token_distribution", "top-k removes the k-th too (<= kth): keeps k - 1",
       mistake="8.1/top-k-keeps-k-minus-1")
def top_k_minus_one(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = torch.softmax(_top_k(logits / temperature, top_k, keep_kth=False), dim=-1)
    return _nucleus(probs, top_p)


@wrong("8.1", "next_token_distribution", "top-k zeroes the others after the softmax, without "
       "renormalising", mistake="8.1/not-renormalised")
def top_k_not_renormalised(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = torch.softmax(logits / temperature, dim=-1)
    kept = _top_k(logits / temperature, top_k).isfinite()
    return _nucleus(probs * kept, top_p)


@wrong("8.1", "next_token_distribution", "the nucleus stops before the token that crosses p",
       mistake="8.1/top-p-excludes-crossing")
def top_p_excludes_crossing(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = torch.softmax(_top_k(logits / temperature, top_k), dim=-1)
    return _nucleus(probs, top_p, inclusive=True)


@wrong("8.1", "next_token_distribution", "top-k by index: exactly k tokens, a tie with the "
       "k-th left out by its place in the vocabulary")
def top_k_by_index(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    logits = logits / temperature
    if top_k is not None and top_k < logits.size(-1):
        index = logits.topk(top_k, dim=-1).indices
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter_(-1, index, True)
        logits = logits.masked_fill(~keep, float("-inf"))
    return _nucleus(torch.softmax(logits, dim=-1), top_p)


@wrong("8.1", "next_token_distribution", "temperature 0 divides by zero (NaN or inf)",
       mistake="8.1/temperature-zero-divides")
def zero_temperature_divides(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    with torch.no_grad():
        scaled = logits / temperature if temperature else logits * float("inf")
    return _nucleus(torch.softmax(_top_k(scaled, top_k), dim=-1), top_p)


@wrong("8.1", "next_token_distribution", "top-p over the whole distribution, then top-k",
       mistake="8.1/top-p-before-top-k")
def top_p_before_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = _nucleus(torch.softmax(logits / temperature, dim=-1), top_p)
    return torch.softmax(_top_k(probs.log(), top_k), dim=-1)


@wrong("8.1", "next_token_distribution", "top-k, then top-p on the probabilities from before "
       "top-k renormalised them (the right order)", mistake="8.1/top-p-before-top-k")
def nucleus_of_unrenormalised_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = torch.softmax(logits / temperature, dim=-1)
    kept = _top_k(logits / temperature, top_k).isfinite()
    return _renormalised(_nucleus(probs * kept, top_p))


def _renormalised(probs):
    return probs / probs.sum(-1, keepdim=True)


@wrong("8.1", "next_token_distribution", "top-p skipped when top-k is given (if/elif)",
       mistake="8.1/top-p-skipped-with-top-k")
def top_p_skipped_with_top_k(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    probs = torch.softmax(_top_k(logits / temperature, top_k), dim=-1)
    return probs if top_k is not None else _nucleus(probs, top_p)


@wrong("8.1", "next_token_distribution", "no check of the arguments")
def unchecked(logits, temperature=1.0, top_k=None, top_p=None):
    if temperature <= 0:
        return _greedy(logits)
    top_k = None if top_k is not None and top_k < 1 else top_k
    top_p = None if top_p is not None and not 0 < top_p < 1 else top_p
    return _nucleus(torch.softmax(_top_k(logits / temperature, top_k), dim=-1), top_p)


@wrong("8.1", "next_token_distribution", "temperature 0's one-hot made with "
       "torch.zeros(logits.shape, device=logits.device): float32 for float64 logits",
       mistake="8.1/dtype-changed")
def greedy_in_the_default_dtype(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return torch.zeros(logits.shape, device=logits.device).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0)
    return _nucleus(torch.softmax(_top_k(logits / temperature, top_k), dim=-1), top_p)


@wrong("8.1", "next_token_distribution", "temperature 0's one-hot made with "
       "torch.zeros(logits.shape, dtype=logits.dtype): on the CPU", mistake="8.1/device-not-kept")
def greedy_on_the_cpu(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return torch.zeros(logits.shape, dtype=logits.dtype).scatter_(
            -1, logits.argmax(-1, keepdim=True), 1.0)
    return _nucleus(torch.softmax(_top_k(logits / temperature, top_k), dim=-1), top_p)


@right("8.1", "next_token_distribution", "every step on probabilities, the nucleus by "
       "comparing each token with every other")
def pairwise(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    return _nucleus(torch.softmax(_top_k(logits / temperature, top_k), dim=-1), top_p)


@right("8.1", "next_token_distribution", "the chapter 2 softmax, thresholds from sorted "
       "values, -inf before a second softmax")
def sorted_thresholds(logits, temperature=1.0, top_k=None, top_p=None):
    _check(temperature, top_k, top_p)
    if temperature == 0:
        return _greedy(logits)
    softmax = active_parts().softmax
    scaled = logits / temperature
    if top_k is not None and top_k < scaled.size(-1):
        kth = scaled.sort(dim=-1, descending=True).values[..., top_k - 1:top_k]
        scaled = torch.where(scaled >= kth, scaled, torch.full_like(scaled, float("-inf")))
    probs = softmax(scaled, dim=-1)
    if top_p is not None and top_p < 1:
        ordered = probs.sort(dim=-1, descending=True).values
        before = ordered.cumsum(-1) - ordered  # the mass before each sorted position
        # the smallest kept probability: the last sorted position whose mass before is < p
        last = (before < top_p).sum(-1, keepdim=True) - 1
        threshold = ordered.gather(-1, last)
        scaled = torch.where(probs >= threshold, scaled, torch.full_like(scaled, float("-inf")))
        probs = softmax(scaled, dim=-1)
    return probs


# ------------------------------------------------------------------ 8.2


@wrong("8.2", "sample_next", "draws with the global generator, not the one passed in",
       mistake="8.2/generator-unused")
def global_generator(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = active_parts().next_token_distribution(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(-1)
    return torch.multinomial(probs, 1).squeeze(-1)


@wrong("8.2", "sample_next", "draws at temperature 0 too (the argmax of a one-hot row is what "
       "it draws), moving the generator", mistake="8.2/draws-at-temperature-zero")
def draws_at_temperature_zero(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = active_parts().next_token_distribution(logits, temperature, top_k, top_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@wrong("8.2", "sample_next", "the argmax of the distribution at every temperature",
       mistake="8.2/always-greedy")
def always_greedy(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    return active_parts().next_token_distribution(logits, temperature, top_k, top_p).argmax(-1)


@wrong("8.2", "sample_next", "samples from the logits' softmax: top-k and top-p ignored")
def unfiltered(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    active_parts().next_token_distribution(logits[..., :1], 1.0, top_k, top_p)  # the checks
    if temperature == 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@wrong("8.2", "sample_next", "inverse transform by torch.searchsorted(..., out_int32=True): "
       "int32 ids", mistake="8.2/not-int64")
def int32_ids(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = active_parts().next_token_distribution(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(-1).int()
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, dtype=probs.dtype,
                   device=probs.device)
    cumulative = probs.cumsum(-1)
    ids = torch.searchsorted(cumulative, u * cumulative[..., -1:], right=True, out_int32=True)
    return ids.squeeze(-1)


@wrong("8.2", "sample_next", "temperature 0's argmax taken row by row into torch.tensor([...]): "
       "on the CPU", mistake="8.2/device-not-kept")
def argmax_row_by_row(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = active_parts().next_token_distribution(logits, temperature, top_k, top_p)
    if temperature == 0:
        return torch.tensor([int(row.argmax()) for row in probs])
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@right("8.2", "sample_next", "inverse transform: one uniform number per row against the "
       "cumulative distribution")
def inverse_transform(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = active_parts().next_token_distribution(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(-1)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, dtype=probs.dtype,
                   device=probs.device)
    cumulative = probs.cumsum(-1)
    return (cumulative <= u * cumulative[..., -1:]).sum(-1)  # the first token past u


@right("8.2", "sample_next", "Gumbel-max: the argmax of log p plus Gumbel noise")
def gumbel_max(logits, temperature=1.0, top_k=None, top_p=None, generator=None):
    probs = active_parts().next_token_distribution(logits, temperature, top_k, top_p)
    if temperature == 0:
        return probs.argmax(-1)
    u = torch.rand(probs.shape, generator=generator, dtype=probs.dtype,
                   device=probs.device).clamp(1e-12, 1.0)
    return (probs.log() - (-u.log()).log()).argmax(-1)


# ------------------------------------------------------------------ 8.3


def _project(attn, x):
    parts = active_parts()
    return (parts.split_heads(attn.q_proj(x), attn.num_heads),
            parts.split_heads(attn.k_proj(x), attn.num_heads),
            parts.split_heads(attn.v_proj(x), attn.num_heads))


def _finish(attn, q, k, v):
    heads, _ = attn.attention(q, k, v, mask=None, dropout=attn.dropout)
    return attn.out_proj(active_parts().merge_heads(heads))


def _one_position(x):
    if x.dim() != 3 or x.size(1) != 1:
        raise ValueError(f"x must be [B, 1, D], got {tuple(x.shape)}")


@wrong("8.3", "attention_step", "the query attends to the new position alone",
       mistake="8.3/cache-ignored")
def cache_ignored(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    output = _finish(attn, q, k, v)
    if cache is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    return output, (k, v)


@wrong("8.3", "attention_step", "the heads merged without the output projection",
       mistake="8.3/no-out-proj")
def no_out_proj(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    heads, _ = attn.attention(q, k, v, mask=None, dropout=attn.dropout)
    return active_parts().merge_heads(heads), (k, v)


@wrong("8.3", "attention_step", "the new key and value put before the cached ones",
       mistake="8.3/new-position-first")
def new_position_first(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is not None:
        k, v = torch.cat([k, cache[0]], 2), torch.cat([v, cache[1]], 2)
    return _finish(attn, q, k, v), (k, v)


@wrong("8.3", "attention_step", "the cache passed in returned unchanged",
       mistake="8.3/cache-not-extended")
def cache_not_extended(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is None:
        return _finish(attn, q, k, v), (k, v)
    full_k, full_v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    return _finish(attn, q, full_k, full_v), cache


@wrong("8.3", "attention_step", "keys and values appended along the heads' axis (dim 1)")
def appended_on_heads(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is not None:
        k, v = torch.cat([cache[0], k], 1), torch.cat([cache[1], v], 1)
    return _finish(attn, q, k, v), (k, v)


@wrong("8.3", "attention_step", "PyTorch's fused attention instead of chapter 2's",
       says="may not use PyTorch's aten.")
def fused_attention(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    heads = F.scaled_dot_product_attention(q, k, v)
    return attn.out_proj(active_parts().merge_heads(heads)), (k, v)


@wrong("8.3", "attention_step", "the cache kept in float64 for precision (.double())",
       mistake="8.3/dtype-changed")
def cache_in_float64(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is not None:
        k, v = torch.cat([cache[0].to(k.dtype), k], 2), torch.cat([cache[1].to(v.dtype), v], 2)
    return _finish(attn, q, k, v), (k.double(), v.double())


@wrong("8.3", "attention_step", "the step under torch.no_grad(), as generation needs no "
       "gradient: no gradient reaches x or the projections", mistake="8.3/detached")
@torch.no_grad()
def step_without_gradient(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is not None:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    return _finish(attn, q, k, v), (k, v)


@wrong("8.3", "attention_step", "an empty cache made with torch.zeros(B, H, 0, d_k) when none is "
       "given: on the CPU", mistake="8.3/device-not-kept")
def empty_cache_on_the_cpu(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is None:
        cache = (torch.zeros(k.size(0), k.size(1), 0, k.size(3)),) * 2
    k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
    return _finish(attn, q, k, v), (k, v)


@right("8.3", "attention_step", "the cache kept merged [B, t, D]: keys and values "
       "projected, appended, then split")
def merged_cache(attn, x, cache=None):
    _one_position(x)
    parts = active_parts()
    q = parts.split_heads(attn.q_proj(x), attn.num_heads)
    k, v = parts.merge_heads(parts.split_heads(attn.k_proj(x), attn.num_heads)), \
        parts.merge_heads(parts.split_heads(attn.v_proj(x), attn.num_heads))
    if cache is not None:
        k = torch.cat([parts.merge_heads(cache[0]), k], dim=1)
        v = torch.cat([parts.merge_heads(cache[1]), v], dim=1)
    k, v = parts.split_heads(k, attn.num_heads), parts.split_heads(v, attn.num_heads)
    return _finish(attn, q, k, v), (k, v)


@right("8.3", "attention_step", "an empty cache [B, H, 0, d_k] instead of None")
def empty_cache(attn, x, cache=None):
    _one_position(x)
    q, k, v = _project(attn, x)
    if cache is None:
        cache = (k[:, :, :0], v[:, :, :0])
    k, v = torch.cat([cache[0], k], dim=-2), torch.cat([cache[1], v], dim=-2)
    return _finish(attn, q, k, v), (k, v)


# ------------------------------------------------------------------ 8.4


def _shapes(logits, tokens):
    if logits.dim() != 3 or tokens.shape != logits.shape[:2] or tokens.size(1) < 2:
        raise ValueError(f"logits [B, L, V] and tokens [B, L] with L >= 2; got shape "
                         f"{tuple(logits.shape)} and {tuple(tokens.shape)}")


def _loss(logits, targets, pad_id):
    return active_parts().LabelSmoothingLoss(0.0, ignore_index=pad_id)(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


@wrong("8.4", "language_model_loss", "each position scored against its own token",
       mistake="8.4/not-shifted")
def not_shifted(logits, tokens, pad_id):
    _shapes(logits, tokens)
    return _loss(logits, tokens, pad_id)


@wrong("8.4", "language_model_loss", "logits[:, 1:] against tokens[:, :-1]",
       mistake="8.4/shifted-backwards")
def shifted_backwards(logits, tokens, pad_id):
    _shapes(logits, tokens)
    return _loss(logits[:, 1:], tokens[:, :-1], pad_id)


@wrong("8.4", "language_model_loss", "padding scored like any token",
       mistake="8.4/padding-counted")
def padding_counted(logits, tokens, pad_id):
    _shapes(logits, tokens)
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), tokens[:, 1:].reshape(-1))


@wrong("8.4", "language_model_loss", "the mean of each row's mean",
       mistake="8.4/mean-of-row-means")
def mean_of_row_means(logits, tokens, pad_id):
    _shapes(logits, tokens)
    rows = [_loss(lg[None], tg[None], pad_id) for lg, tg in zip(logits[:, :-1], tokens[:, 1:],
                                                                 strict=True)
            if bool((tg != pad_id).any())]
    return torch.stack(rows).mean()


@wrong("8.4", "language_model_loss", "the log-probabilities taken in float64 for precision, "
       "never converted back", mistake="8.4/dtype-changed")
def loss_in_float64(logits, tokens, pad_id):
    _shapes(logits, tokens)
    return F.cross_entropy(logits[:, :-1].double().transpose(1, 2), tokens[:, 1:],
                           ignore_index=pad_id)


@wrong("8.4", "language_model_loss", "the loss rebuilt from its value, torch.tensor(float(...)): "
       "off the graph", mistake="8.4/detached")
def loss_rebuilt_from_its_value(logits, tokens, pad_id):
    _shapes(logits, tokens)
    return torch.tensor(float(_loss(logits[:, :-1], tokens[:, 1:], pad_id)), dtype=logits.dtype)


@right("8.4", "language_model_loss", "log_softmax and gather, a sum divided by the count")
def gathered(logits, tokens, pad_id):
    _shapes(logits, tokens)
    log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
    targets = tokens[:, 1:]
    keep = targets != pad_id
    picked = log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return -(picked * keep).sum() / keep.sum().clamp(min=1)


@right("8.4", "language_model_loss", "F.cross_entropy with ignore_index on [B, V, L]")
def cross_entropy_channels(logits, tokens, pad_id):
    _shapes(logits, tokens)
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], ignore_index=pad_id)


# ------------------------------------------------------------------ 8.5 the decoder-only model


class _LanguageModel(nn.Module):
    """The model's modules, initialised and tied as the contract says; the variant's forward
    uses them, or builds them otherwise."""

    TIE = True
    XAVIER = True
    EMBEDDING_DROPOUT = STACK_DROPOUT = True  # False: that part built with dropout 0

    def __init__(self, vocab_size, d_model, num_heads, d_ff, num_layers, dropout=0.0,
                 norm_first=False, tie_embeddings=True, max_len=5000):
        super().__init__()
        parts = active_parts()
        self.p, self.tied = dropout, tie_embeddings  # for a variant's own use (called as
        # the package calls it: every argument by position)
        self.embed = parts.embeddings(vocab_size, d_model, max_len,
                                      dropout if self.EMBEDDING_DROPOUT else 0.0)
        self.decoder = parts.Encoder(d_model, num_heads, d_ff, num_layers,
                                     dropout if self.STACK_DROPOUT else 0.0, norm_first)
        self.generator = nn.Linear(d_model, vocab_size)
        if self.XAVIER:
            for parameter in self.parameters():
                if parameter.dim() > 1:
                    nn.init.xavier_uniform_(parameter)
        if tie_embeddings and self.TIE:
            self.generator.weight = self.embed.tokens.embedding.weight

    def forward(self, tokens, mask):
        return self.generator(self.decoder(self.embed(tokens), mask))


@wrong("8.5", "DecoderOnlyTransformer", "log-probabilities from forward",
       mistake="8.5/log-probabilities")
class LanguageModelLogProbabilities(_LanguageModel):
    def forward(self, tokens, mask):
        return torch.log_softmax(self.generator(self.decoder(self.embed(tokens), mask)), -1)


@wrong("8.5", "DecoderOnlyTransformer", "the mask not passed to the stack",
       mistake="8.5/mask-not-passed")
class LanguageModelUnmasked(_LanguageModel):
    def forward(self, tokens, mask):
        return self.generator(self.decoder(self.embed(tokens)))


@wrong("8.5", "DecoderOnlyTransformer", "the generator given a copy of the embedding",
       mistake="8.5/not-tied")
class LanguageModelTiedByCopy(_LanguageModel):
    TIE = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.tied:
            self.generator.weight = nn.Parameter(self.embed.tokens.embedding.weight.clone())


@wrong("8.5", "DecoderOnlyTransformer", "tie_embeddings ignored: the generator's own matrix",
       mistake="8.5/not-tied")
class LanguageModelNeverTied(_LanguageModel):
    TIE = False


@wrong("8.5", "DecoderOnlyTransformer", "PyTorch's default initialisation kept",
       mistake="8.5/not-xavier")
class LanguageModelDefaultInitialisation(_LanguageModel):
    XAVIER = False


@wrong("8.5", "DecoderOnlyTransformer", "the embedding without its positions",
       mistake="8.5/positions-skipped")
class LanguageModelWithoutPositions(_LanguageModel):
    def forward(self, tokens, mask):
        return self.generator(self.decoder(self.embed.tokens(tokens), mask))


@wrong("8.5", "DecoderOnlyTransformer", "the stack built without the model's dropout",
       mistake="8.5/dropout-not-passed-on")
class LanguageModelStackWithoutDropout(_LanguageModel):
    STACK_DROPOUT = False


@wrong("8.5", "DecoderOnlyTransformer", "the embedding built without the model's dropout",
       mistake="8.5/dropout-not-passed-on")
class LanguageModelEmbeddingWithoutDropout(_LanguageModel):
    EMBEDDING_DROPOUT = False


@wrong("8.5", "DecoderOnlyTransformer", "the generator applied twice",
       mistake="8.5/generator-twice")
class LanguageModelGeneratorTwice(_LanguageModel):
    def forward(self, tokens, mask):
        logits = self.generator(self.decoder(self.embed(tokens), mask))
        return self.generator(logits)


@wrong("8.5", "DecoderOnlyTransformer", "the logits returned in float32 (.float()), whatever the "
       "model's dtype", mistake="8.5/dtype-changed")
class LanguageModelFloat32Logits(_LanguageModel):
    def forward(self, tokens, mask):
        return self.generator(self.decoder(self.embed(tokens), mask)).float()


@wrong("8.5", "DecoderOnlyTransformer", "the stack's output detached before the generator: only "
       "the generator learns", mistake="8.5/detached")
class LanguageModelDetachedStack(_LanguageModel):
    def forward(self, tokens, mask):
        return self.generator(self.decoder(self.embed(tokens), mask).detach())


@wrong("8.5", "DecoderOnlyTransformer", "the positions added in forward from a table made there "
       "(Chapter 1's positional_encoding): on the CPU", mistake="8.5/device-not-kept")
class LanguageModelTableInForward(_LanguageModel):
    def forward(self, tokens, mask):
        x = self.embed.tokens(tokens)
        table = active_parts().positional_encoding(tokens.size(1), x.size(-1))
        return self.generator(self.decoder(self.embed.positions.dropout(x + table), mask))


@right("8.5", "DecoderOnlyTransformer", "the embedding's dropout applied in forward with "
       "F.dropout(..., training=self.training)")
class LanguageModelFunctionalDropout(_LanguageModel):
    EMBEDDING_DROPOUT = False

    def forward(self, tokens, mask):
        x = torch.nn.functional.dropout(self.embed(tokens), p=self.p, training=self.training)
        return self.generator(self.decoder(x, mask=mask))


@right("8.5", "DecoderOnlyTransformer", "the stack's layers run one by one, then its norm")
class LanguageModelLayerByLayer(_LanguageModel):
    def forward(self, tokens, mask):
        x = self.embed(tokens)
        for layer in self.decoder.layers:
            x = layer(x, mask)
        return self.generator(self.decoder.norm(x))
