"""Chapter 3: plausible wrong answers and other correct answers."""

from __future__ import annotations

import torch
from torch import nn

from variants import right, wrong

# ------------------------------------------------------------------ 3.1


def _check(x, heads):
    if x.size(-1) % heads:
        raise ValueError(f"d_model={x.size(-1)} is not divisible by num_heads={heads}")


@wrong("3.1", "split_heads", "one view to [B, H, L, d_k], no transpose",
       mistake="3.1/view-without-transpose")
def view_without_transpose(x, num_heads):
    _check(x, num_heads)
    b, length, d = x.shape
    return x.reshape(b, num_heads, length, d // num_heads)


@wrong("3.1", "split_heads", "features split d_k-major: [B, L, d_k, H] then permuted",
       mistake="3.1/d_k-major")
def interleaved_heads(x, num_heads):
    _check(x, num_heads)
    b, length, d = x.shape
    return x.reshape(b, length, d // num_heads, num_heads).permute(0, 3, 1, 2)


@right("3.1", "split_heads", "view(): splitting one axis works whatever the memory layout")
def view_splits_any_layout(x, num_heads):
    _check(x, num_heads)
    b, length, d = x.shape
    return x.view(b, length, num_heads, d // num_heads).transpose(1, 2)


@wrong("3.1", "split_heads", "an indivisible width silently truncated")
def truncates_width(x, num_heads):
    b, length, d = x.shape
    d_k = d // num_heads
    return x[..., :d_k * num_heads].reshape(b, length, num_heads, d_k).transpose(1, 2)


@wrong("3.1", "split_heads", "a torch.zeros [B, H, L, d_k] on x's device, filled head by head: "
       "the default dtype, float32, whatever x's", mistake="3.1/dtype-changed")
def filled_zeros(x, num_heads):
    _check(x, num_heads)
    b, length, d = x.shape
    d_k = d // num_heads
    out = torch.zeros(b, num_heads, length, d_k, device=x.device)
    for h in range(num_heads):
        out[:, h] = x[..., h * d_k:(h + 1) * d_k]
    return out


@wrong("3.1", "split_heads", "through NumPy (x.detach().numpy()): right values, off the graph",
       mistake="3.1/detached")
def through_numpy(x, num_heads):
    _check(x, num_heads)
    b, length, d = x.shape
    array = x.detach().numpy().reshape(b, length, num_heads, d // num_heads)
    return torch.from_numpy(array.transpose(0, 2, 1, 3).copy())


@right("3.1", "split_heads", "chunk and stack")
def chunk_and_stack(x, num_heads):
    _check(x, num_heads)
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


@right("3.1", "split_heads", "unflatten and permute")
def unflatten_permute(x, num_heads):
    if x.shape[-1] % num_heads != 0:
        raise ValueError(f"{x.shape[-1]} features cannot be split into {num_heads} heads")
    return x.unflatten(-1, (num_heads, -1)).permute(0, 2, 1, 3)


# ------------------------------------------------------------------ 3.2


@wrong("3.2", "merge_heads", "one reshape to [B, L, D], no transpose",
       mistake="3.2/reshape-without-transpose")
def reshape_without_transpose(x):
    b, h, length, d_k = x.shape
    return x.reshape(b, length, h * d_k)


@wrong("3.2", "merge_heads", "heads merged in the wrong order (d_k-major)",
       mistake="3.2/d_k-major")
def wrong_order(x):
    b, h, length, d_k = x.shape
    return x.permute(0, 2, 3, 1).reshape(b, length, h * d_k)


@wrong("3.2", "merge_heads", "view() after the transpose (memory is not contiguous)",
       mistake="3.2/view-after-transpose")
def view_after_transpose(x):
    b, h, length, d_k = x.shape
    return x.transpose(1, 2).view(b, length, h * d_k)


@wrong("3.2", "merge_heads", "a torch.zeros [B, L, D] on x's device, filled head by head: the "
       "default dtype, float32, whatever x's", mistake="3.2/dtype-changed")
def merged_into_zeros(x):
    b, h, length, d_k = x.shape
    out = torch.zeros(b, length, h * d_k, device=x.device)
    for head in range(h):
        out[..., head * d_k:(head + 1) * d_k] = x[:, head]
    return out


@wrong("3.2", "merge_heads", "rebuilt with torch.tensor(x.tolist()): right values, off the graph "
       "and on the CPU", mistake="3.2/detached")
def rebuilt_from_lists(x):
    b, h, length, d_k = x.shape
    return torch.tensor(x.transpose(1, 2).tolist(), dtype=x.dtype).reshape(b, length, h * d_k)


@right("3.2", "merge_heads", "unbind and cat")
def unbind_cat(x):
    return torch.cat(x.unbind(dim=1), dim=-1)


@right("3.2", "merge_heads", "contiguous then view")
def contiguous_view(x):
    b, h, length, d_k = x.shape
    return x.transpose(1, 2).contiguous().view(b, length, -1)


# ------------------------------------------------------------------ 3.3


class _Base(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.0, bias=True):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            nn.Linear(d_model, d_model, bias=bias) for _ in range(4))
        self.dropout = nn.Dropout(dropout)
        self.attention_weights = None

    @staticmethod
    def attend(q, k, v, mask, dropout):
        from solutions.ch02_attention import scaled_dot_product_attention

        return scaled_dot_product_attention(q, k, v, mask=mask, dropout=dropout)

    def check(self, mask):
        if mask is not None and mask.dim() not in (2, 4):
            raise ValueError(f"mask of shape {tuple(mask.shape)} is neither 2-D nor 4-D")

    def heads(self, x):
        return x.unflatten(-1, (self.num_heads, -1)).transpose(1, 2)

    def merge(self, x):
        return x.transpose(1, 2).flatten(2)


@wrong("3.3", "MultiHeadAttention", "the output projection left out",
       mistake="3.3/no-out-proj")
class NoOutputProjection(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.merge(out)


@wrong("3.3", "MultiHeadAttention", "heads split with one view, no transpose",
       mistake="3.3/heads-without-transpose")
class ViewWithoutTranspose(_Base):
    def heads(self, x):
        b, length, d = x.shape
        return x.reshape(b, self.num_heads, length, d // self.num_heads)

    def merge(self, x):
        b, h, length, d_k = x.shape
        return x.reshape(b, length, h * d_k)

    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "the key projection applied to the values",
       mistake="3.3/values-by-k-proj")
class KeyProjectionForValues(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.k_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "the key projected by q_proj",
       mistake="3.3/keys-by-q-proj")
class KeysByQueryProjection(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.q_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "one head over all of d_model, scaled by sqrt(d_model)",
       mistake="3.3/one-head")
class OneHead(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        q, k, v = (p(x).unsqueeze(1) for p, x in ((self.q_proj, query), (self.k_proj, key),
                                                   (self.v_proj, value)))
        out, w = self.attend(q, k, v, mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(out.squeeze(1))


@wrong("3.3", "MultiHeadAttention", "heads split right, scores scaled by sqrt(d_model)",
       mistake="3.3/scaled-by-sqrt-d_model")
class ScaledByModelWidth(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        q = self.heads(self.q_proj(query))
        q = q * (q.size(-1) / query.size(-1)) ** 0.5  # 2.2 divides by sqrt(d_k): sqrt(D) in all
        out, w = self.attend(q, self.heads(self.k_proj(key)), self.heads(self.v_proj(value)),
                             mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "heads merged in the reversed order [B, L, d_k, H]",
       mistake="3.3/heads-merged-d_k-major")
class HeadsMergedReversed(_Base):
    def merge(self, x):
        return x.permute(0, 2, 3, 1).flatten(2)

    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "attention weights averaged over heads",
       mistake="3.3/weights-averaged")
class AveragedWeights(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach().mean(1)
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "dropout forgotten",
       mistake="3.3/no-dropout")
class NoDropout(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, None)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "a mask of ones made on the CPU when none is given",
       mistake="3.3/device-not-kept")
class DefaultMaskOnTheCpu(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        if mask is None:
            mask = torch.ones(query.size(1), key.size(1), dtype=torch.bool)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "attention_weights moved to the CPU (for plotting)",
       mistake="3.3/device-not-kept")
class WeightsMovedToTheCpu(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                             self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach().cpu()
        return self.out_proj(self.merge(out))


@wrong("3.3", "MultiHeadAttention", "attention under torch.no_grad(), as its weights are kept "
       "detached: no gradient reaches q_proj, k_proj, v_proj or the inputs",
       mistake="3.3/detached")
class AttentionWithoutGradient(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        with torch.no_grad():
            out, w = self.attend(self.heads(self.q_proj(query)), self.heads(self.k_proj(key)),
                                 self.heads(self.v_proj(value)), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@right("3.3", "MultiHeadAttention", "one packed projection of the three weights")
class PackedProjection(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        bias = (torch.cat([self.q_proj.bias, self.k_proj.bias, self.v_proj.bias])
                if self.q_proj.bias is not None else None)
        d = weight.shape[1]
        q = nn.functional.linear(query, weight[:d], None if bias is None else bias[:d])
        k = nn.functional.linear(key, weight[d:2 * d], None if bias is None else bias[d:2 * d])
        v = nn.functional.linear(value, weight[2 * d:], None if bias is None else bias[2 * d:])
        out, w = self.attend(self.heads(q), self.heads(k), self.heads(v), mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(self.merge(out))


@right("3.3", "MultiHeadAttention", "einsum over heads, reshape + permute")
class EinsumHeads(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        b, lq, d = query.shape
        h = self.num_heads
        q = self.q_proj(query).reshape(b, lq, h, d // h).permute(0, 2, 1, 3)
        k = self.k_proj(key).reshape(b, key.shape[1], h, d // h).permute(0, 2, 1, 3)
        v = self.v_proj(value).reshape(b, key.shape[1], h, d // h).permute(0, 2, 1, 3)
        out, w = self.attend(q, k, v, mask, self.dropout)
        self.attention_weights = w.detach()
        return self.out_proj(torch.einsum("bhld->blhd", out).reshape(b, lq, d))


@wrong("3.3", "MultiHeadAttention", "every projection initialised to zero (a constant output)",
       says="all zeros at initialisation")
class ZeroInitialised(EinsumHeads):
    def __init__(self, d_model, num_heads, dropout=0.0, bias=True):
        super().__init__(d_model, num_heads, dropout=dropout, bias=bias)
        for parameter in self.parameters():
            nn.init.zeros_(parameter)


@wrong("3.3", "MultiHeadAttention", "a skeleton: the four projections, zero-initialised, "
       "uniform weights of the right shape and no attention at all")
class SkeletonWithoutAttention(_Base):
    def __init__(self, d_model, num_heads, dropout=0.0, bias=True):
        super().__init__(d_model, num_heads, dropout=dropout, bias=bias)
        for parameter in self.parameters():
            nn.init.zeros_(parameter)

    def forward(self, query, key, value, mask=None):
        self.check(mask)
        b, lq, d = query.shape
        lk = key.size(1)
        self.attention_weights = torch.full((b, self.num_heads, lq, lk), 1 / lk,
                                            dtype=query.dtype)
        touched = self.q_proj(query).sum() + self.k_proj(key).sum() + self.v_proj(value).sum()
        return self.out_proj(torch.zeros_like(query)) + 0 * touched


@wrong("3.3", "MultiHeadAttention", "PyTorch's attention reached as nn.Transformer(...).encoder."
       "layers[0].self_attn, called with need_weights=True (its slow path)",
       says="may not use PyTorch's aten.")
class TransformersOwnAttention(_Base):
    def forward(self, query, key, value, mask=None):
        self.check(mask)
        d, h = query.size(-1), self.num_heads
        theirs = nn.Transformer(d, h, 1, 1, 4 * d, dropout=self.dropout.p, batch_first=True)
        attention = theirs.encoder.layers[0].self_attn.to(query.dtype)
        with torch.no_grad():
            attention.in_proj_weight.copy_(torch.cat([self.q_proj.weight, self.k_proj.weight,
                                                      self.v_proj.weight]))
            attention.out_proj.weight.copy_(self.out_proj.weight)
        blocked = None if mask is None else ~mask.expand(query.size(0), h, query.size(1),
                                                         key.size(1)).flatten(0, 1)
        output, weights = attention(query, key, value, attn_mask=blocked, need_weights=True,
                                    average_attn_weights=False)
        self.attention_weights = weights.detach()
        return output
