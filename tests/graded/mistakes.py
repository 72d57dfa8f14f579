"""The plausible mistakes the graded tests recognise: a stable id and what a learner reads.

One table for the course. A graded test that recognises a mistake (its result equals what
that mistake computes) fails with :func:`named`: the message names the mistake and its fix,
and ends with the id in a tag sealed by the grader's process (``grading.messages.mistake_tag``),
which the grader takes out of the message into every report's ``mistake`` field and
``regrade`` counts over a class; text the learner's code writes can never name one.
A wrong variant in ``tests/variants/`` declares the id it makes (``mistake=``); the suite
checks that the grader names it. Ids never change once released: a class summary compares
them across years.
"""

from __future__ import annotations

import re

import torch

from annotated_transformer.course.grading.messages import mistake_tag
from annotated_transformer.course.grading.outcomes import LearnerRaised


def _device_not_kept(inputs: str, fix: str) -> str:
    """The message of an exercise's ``X.Y/device-not-kept``, one pattern for the course:
    with ``inputs`` on the meta device, the learner's code made or moved a tensor on the CPU
    (a clash PyTorch raised, or a result there); ``fix`` says how to keep theirs."""
    return (f"With {inputs} on the meta device (a stand-in for a GPU), a tensor your code made "
            f"is on the CPU, PyTorch's default device, or was moved there: {fix}")


def _float_mask(what: str, fix: str) -> str:
    """The message of ``4.X/float-mask``: a mask of numbers where a bool one is due."""
    return (f"{what} is made of numbers ({{dtype}}), not a torch.bool mask: a mask is True "
            f"where attention is allowed and False elsewhere, and &, | and ~ combine bool "
            f"masks. {fix}")


MISTAKES = {
    # 1.1 positional_encoding
    "1.1/sine-cosine-swapped": "This is the table with sine and cosine swapped: the even "
    "columns (0, 2, ...) take the sine, the odd ones the cosine, so that PE[0] = [0, 1, 0, 1, "
    "...].",
    "1.1/exponent-i-over-d_model": "This is the table with the exponent i/d_model: the pair i "
    "(columns 2i and 2i + 1) has the angle pos / 10000^(2i/d_model), so the exponent is "
    "2i/d_model.",
    "1.1/exponent-by-column": "This is the table with the exponent 2j/d_model where j is the "
    "column: i counts the (sin, cos) pairs, so columns 2i and 2i + 1 share the angle "
    "pos / 10000^(2i/d_model).",
    "1.1/positions-from-1": "This is the table with positions counted from 1: the first "
    "position is 0 (torch.arange(max_len)), whose row is [0, 1, 0, 1, ...].",
    "1.1/sines-then-cosines": "This is the table with all sines first and all cosines after "
    "(concatenated): interleave them, sine at column 2i, cosine at column 2i + 1 "
    "(pe[:, 0::2] = sin, pe[:, 1::2] = cos).",
    "1.1/not-float32": "Its values are right, but the table is {got}: it is float32, the "
    "dtype of the embeddings it is added to (NumPy computes in float64, and torch.tensor or "
    "torch.from_numpy of its arrays keeps that). Build it with dtype=torch.float32, or "
    "convert the finished table with .float().",
    # 1.2 PositionalEncoding
    "1.2/table-learned": "The table is an nn.Parameter, so the optimiser would change it: the "
    "sinusoids are fixed. Register it with self.register_buffer('pe', table).",
    "1.2/not-a-buffer": "The module has no buffer pe: a plain attribute (self.pe = table) is "
    "neither saved in the state_dict nor moved by .to(device). Register it with "
    "self.register_buffer('pe', table).",
    "1.2/device-not-kept": _device_not_kept(
        "the module and x", "module.to(device) moves only parameters and buffers, so a table "
        "made in forward (or kept as a plain attribute) stays behind. Add the buffer "
        "self.pe: dropout(x + self.pe[:L])."),
    "1.2/dtype-promoted": "For x in {dtype} the output is {got}: adding the float32 table "
    "promoted it. Convert the table to x's dtype first: self.pe[:L].to(x.dtype).",
    "1.2/dropout-in-eval": "Dropout is still on in eval mode (about half the entries are 0): "
    "use an nn.Dropout module, which module.eval() switches off (functional dropout needs "
    "training=self.training).",
    "1.2/dropout-before-the-table": "Dropout is applied to x before the table is added: the "
    "paper applies it to the sum, dropout(x + pe[:L]).",
    "1.2/detached": "Its values are right, but no gradient reaches x through "
    "PositionalEncoding: a step left autograd's graph (x.data, .detach(), torch.no_grad(), "
    "NumPy). The embeddings below it learn through this sum: compute dropout(x + pe[:L]) "
    "with torch operations on x itself.",
    # 1.3 TokenEmbedding
    "1.3/no-scale": "This is the embedding lookup without the scale: multiply it by "
    "sqrt(d_model) (section 3.4).",
    "1.3/scaled-by-d_model": "This is the lookup multiplied by d_model: multiply by its square "
    "root, sqrt(d_model).",
    "1.3/divided-by-sqrt-d_model": "This is the lookup divided by sqrt(d_model): multiply by "
    "it instead.",
    "1.3/dtype-changed": "Its values are right, but for a {dtype} table the output is {got}: "
    "the output keeps the table's dtype. A tensor made in another dtype "
    "(torch.tensor(..., dtype=torch.float64), NumPy's float64) promoted it: multiply by the "
    "Python number math.sqrt(d_model).",
    "1.3/detached": "Its values are right, but no gradient reaches embedding.weight: the "
    "lookup left autograd's graph (embedding.weight.data, .detach(), torch.no_grad(), NumPy), "
    "so the table would never learn. Look up with self.embedding(tokens) itself.",
    "1.3/device-not-kept": _device_not_kept(
        "the module and the tokens", "module.to(device) moves only parameters and buffers, "
        "so a tensor attribute (a scale kept as torch.tensor) stays behind. Multiply by the "
        "Python number math.sqrt(d_model)."),
    # 1.4 relative_position_matrix
    "1.4/identity": "This is the identity: PE[pos + k] is not PE[pos] (every pair turns by "
    "k * w_i). Build the block-diagonal rotation, each 2x2 block [[cos, -sin], [sin, cos]] "
    "of the angle k * w_i.",
    "1.4/rotation-transposed": "This is the rotation the wrong way round (M transposed): with "
    "rows multiplied on the left, PE[pos] @ M, each block is [[cos t, -sin t], [sin t, "
    "cos t]], -sin t in the top right.",
    "1.4/angle-without-frequency": "The angle of pair i is k * i: it is k * w_i, with "
    "w_i = 1 / 10000^(2i/d_model) the pair's frequency.",
    "1.4/not-float32": "Its values are right, but M is {got}: it is float32, as the table "
    "PE it multiplies (computing in float64 is fine: convert the finished matrix with "
    ".float(), or build it with dtype=torch.float32).",
    # 2.1 softmax
    "2.1/no-maximum-subtracted": "This is exp(x) / sum(exp(x)) with no maximum subtracted: "
    "exp(1000) overflows to inf and inf / inf is NaN. Subtract each slice's maximum first: "
    "exp(x - m) / sum(exp(x - m)) is the same value.",
    "2.1/empty-slice-unguarded": "A slice that is all -inf gives NaN: its maximum is -inf "
    "(-inf - (-inf) is NaN), so replace a -inf maximum by 0 before subtracting; its exps are "
    "then all 0 and so is their sum, so guard the sum too (divide by "
    "torch.where(total == 0, 1, total)): the slice becomes all zeros.",
    "2.1/sum-over-everything": "The sum runs over every entry of x instead of along dim: take "
    "it with x.sum(dim, keepdim=True) (and the maximum with x.amax(dim, keepdim=True)).",
    "2.1/dim-ignored": "This is the softmax over the last axis whatever dim is: take the "
    "maximum and the sum over dim, with keepdim=True.",
    "2.1/keepdim-forgotten": "The maximum or the sum lost the dimension it was taken over, "
    "so it does not line up with x any more: take them with keepdim=True "
    "(x.amax(dim, keepdim=True), e.sum(dim, keepdim=True)) so that they broadcast back.",
    "2.1/dtype-changed": "Its values are right, but for {dtype} x the result is {got}: softmax "
    "keeps x's dtype. A tensor made in another dtype (.double(), dtype=torch.float64, NumPy's "
    "float64) promoted it: compute with x's own dtype (torch.zeros_like(x), or convert the "
    "result back with .to(x.dtype)).",
    "2.1/detached": "Its values are right, but no gradient flows through softmax: the result "
    "is off autograd's graph (torch.no_grad(), .detach(), .item(), NumPy), and attention is "
    "trained through it. Compute it with torch operations on x alone, with no no_grad around "
    "them.",
    "2.1/device-not-kept": _device_not_kept(
        "x", "make new tensors on x's device (torch.zeros_like(m), torch.where(total == 0, 1, "
        "total)), never with torch.zeros(shape), which takes the CPU."),
    # 2.2 scaled_dot_product_attention
    "2.2/no-scaling": "These are the weights with no scaling, softmax(Q K^T): divide the "
    "scores by sqrt(d_k) = {sqrt_d_k} before the softmax.",
    "2.2/divided-by-d_k": "These are the weights with the scores divided by d_k instead of "
    "sqrt(d_k): divide by sqrt(d_k) = {sqrt_d_k}, not {d_k}.",
    "2.2/divided-by-sqrt-d_model": "These are the weights with the scores divided by "
    "sqrt({d_model}), the width of all {heads} heads together: each head's scores are divided "
    "by the width of one head, sqrt(d_k) = sqrt(query.size(-1)) = sqrt({d_k}).",
    "2.2/scaled-by-d_v": "These are the weights with the scores divided by sqrt(d_v) = "
    "sqrt({d_v}), the value's width: the scale comes from the width of the query and key "
    "vectors whose dot products make the scores, sqrt(d_k) = sqrt({d_k}).",
    "2.2/large-negative-fill": "A query whose keys are all masked gets uniform weights (1/Lk "
    "each): a large negative fill such as -1e9 still leaves a softmax over equal scores. Fill "
    "with -inf and use your softmax of 2.1, which gives an all -inf row zeros.",
    "2.2/masked-scores-zeroed": "These are the weights with the masked scores set to 0 "
    "(scores * mask, or masked_fill(~mask, 0)): a score of 0 is not excluded, it gets weight "
    "exp(0) like any other. Fill the masked scores with -inf before the softmax: "
    "scores.masked_fill(~mask, float('-inf')).",
    "2.2/weights-before-dropout": "The weights returned are the ones from before dropout: "
    "return the weights after dropout, the ones that multiplied value.",
    "2.2/dropout-on-output": "Dropout was applied to the output [B, Lq, d_v]: the paper drops "
    "attention weights, so apply dropout to the weights [B, Lq, Lk], then multiply by value.",
    "2.2/softmax-over-queries": "These are the weights with the softmax over the queries "
    "(dim=-2): take it over the keys (dim=-1), so that each query's weights sum to 1.",
    "2.2/mask-true-hides": "Your weights hide the keys where the mask is True: here True "
    "means attention allowed (PyTorch's nn.MultiheadAttention masks say the opposite), so "
    "fill the scores with -inf where the mask is False: scores.masked_fill(~mask, -inf).",
    "2.2/mask-after-softmax": "The mask is applied after the softmax, so the weights of the "
    "allowed keys no longer sum to 1: fill the masked scores with -inf before the softmax.",
    "2.2/weights-detached": "The output is right, but no gradient reaches query and key: the "
    "weights were detached before they multiply value, so the scores never learn. Keep the "
    "weights on the graph for weights @ value; only a copy kept for inspection is detached "
    "(3.3's attention_weights).",
    "2.2/dtype-changed": "Its values are right, but for {dtype} inputs it returns {got}: "
    "attention keeps its inputs' dtype. A step in another dtype (.double(), "
    "dtype=torch.float64, NumPy's float64) changed it: compute in the inputs' dtype, or "
    "convert the results back with .to(query.dtype).",
    "2.2/device-not-kept": _device_not_kept(
        "query, key, value and mask", "make new tensors on theirs (scores.masked_fill(~mask, "
        "float('-inf')), torch.full_like(scores, float('-inf'))), never with torch.tensor(...) "
        "or torch.full(shape, ...), which take the CPU."),
    # 2.3 softmax_jacobian
    "2.3/outer-added": "This is diag(p) + p p^T: the outer product is subtracted, "
    "J = diag(p) - p p^T (off the diagonal dp_i/dz_j = -p_i p_j).",
    "2.3/diagonal-only": "This is the diagonal alone, p_i (1 - p_i): the off-diagonal entries "
    "are -p_i p_j, J = diag(p) - p p^T.",
    "2.3/no-diagonal-term": "This is -p p^T without diag(p): J = diag(p) - p p^T, so the "
    "diagonal is p_i - p_i^2 = p_i (1 - p_i).",
    "2.3/dtype-changed": "Its values are right, but J keeps p's dtype (and device): a tensor "
    "made in another dtype (torch.eye(n, dtype=torch.float64), torch.tensor of NumPy values, "
    "which are float64) or a .double() promoted it. Make new tensors with dtype=p.dtype, "
    "device=p.device, or build J from p alone (torch.diag_embed(p)).",
    "2.3/detached": "Its values are right, but no gradient could flow through J: a step left "
    "autograd's graph (.detach(), .numpy(), .item(), torch.tensor(...) of computed values). "
    "Build J from p with torch operations alone.",
    "2.3/device-not-kept": _device_not_kept(
        "p", "make new tensors on p's device (torch.eye(n, dtype=p.dtype, device=p.device)), "
        "or build J from p alone (torch.diag_embed(p))."),
    # 3.1 split_heads
    "3.1/view-without-transpose": "This is x reshaped straight to [B, H, L, d_k]: that cuts "
    "the sequence, not the features, into heads (positions mix). Reshape to [B, L, H, d_k], "
    "then transpose L and H: x.view(B, L, H, d_k).transpose(1, 2).",
    "3.1/d_k-major": "This splits the features d_k-major ([B, L, d_k, H]): head h would take "
    "every H-th feature. Head h takes the contiguous slice x[..., h*d_k:(h+1)*d_k]: reshape "
    "to [B, L, H, d_k].",
    "3.1/dtype-changed": "Its values are right, but split_heads writes x into a tensor of "
    "another dtype: torch.zeros(...) takes PyTorch's default dtype, float32, whatever x's, so "
    "float64 features are rounded to float32. Only reshape and transpose x itself, "
    "x.view(B, L, H, d_k).transpose(1, 2), or make a new tensor with dtype=x.dtype, "
    "device=x.device.",
    "3.1/detached": "Its values are right, but no gradient reaches x through split_heads: a "
    "step left autograd's graph (NumPy, .tolist(), .detach(), torch.no_grad()), and every "
    "projection of 3.3 learns through it. Reshape and transpose x with torch operations.",
    # 3.2 merge_heads
    "3.2/reshape-without-transpose": "This is the heads reshaped straight to [B, L, D] with no "
    "transpose: positions of different heads mix. Transpose back to [B, L, H, d_k] first, "
    "then reshape: x.transpose(1, 2).reshape(B, L, H * d_k).",
    "3.2/d_k-major": "This merges the heads d_k-major (feature j of every head, then j + 1): "
    "head 0's d_k features come first, then head 1's: transpose to [B, L, H, d_k] and "
    "reshape.",
    "3.2/view-after-transpose": "view() cannot merge the transposed heads: a transpose only "
    "swaps strides, so the memory is no longer in [B, L, H, d_k] order, which view needs. "
    "Use x.transpose(1, 2).reshape(B, L, H * d_k) (reshape copies when it must), or "
    ".contiguous().view(...).",
    "3.2/dtype-changed": "Its values are right, but merge_heads writes x into a tensor of "
    "another dtype: torch.zeros(...) takes PyTorch's default dtype, float32, whatever x's, so "
    "float64 heads are rounded to float32. Only transpose and reshape x itself, "
    "x.transpose(1, 2).reshape(B, L, H * d_k), or make a new tensor with dtype=x.dtype, "
    "device=x.device.",
    "3.2/detached": "Its values are right, but no gradient reaches x through merge_heads: a "
    "step left autograd's graph (.tolist(), NumPy, .detach(), torch.no_grad()), and every "
    "projection of 3.3 learns through it. Transpose and reshape x with torch operations.",
    # 3.3 MultiHeadAttention
    "3.3/no-out-proj": "This is the output without out_proj: apply out_proj to the merged "
    "heads (the last step).",
    "3.3/heads-without-transpose": "This is the output with the heads split and merged by "
    "one reshape each, no transpose: each head sees a mix of positions. Use split_heads and "
    "merge_heads of 3.1 and 3.2 (reshape to [B, L, H, d_k], then transpose).",
    "3.3/weights-averaged": "attention_weights is averaged over the heads ([B, Lq, Lk]): keep "
    "one map per head, [B, H, Lq, Lk] (what PyTorch gives with average_attn_weights=False).",
    "3.3/no-dropout": "No attention weight is dropped in training with dropout=0.5: pass the "
    "module's dropout to the attention of 2.2, which applies it to the weights.",
    "3.3/values-by-k-proj": "This is the output with the values projected by k_proj: project "
    "value with v_proj.",
    "3.3/keys-by-q-proj": "This is the output with the keys projected by q_proj: project key "
    "with k_proj.",
    "3.3/one-head": "This is attention with one head over all d_model features, scaled by "
    "sqrt(d_model): split the projections into num_heads heads of d_k = d_model / num_heads "
    "features (3.1), attend within each head (2.2 then divides by sqrt(d_k)) and merge them "
    "(3.2).",
    "3.3/scaled-by-sqrt-d_model": "This is the output with each head's scores divided by "
    "sqrt(d_model), the width of all heads together: each head's scores are divided by the "
    "width of one head, sqrt(d_k) (what 2.2 does with the split heads it is given).",
    "3.3/heads-merged-d_k-major": "This is the output with the heads merged in the reversed "
    "order ([B, L, d_k, H]: feature j of every head, then j + 1): head 0's d_k features come "
    "first, then head 1's; use merge_heads of 3.2.",
    "3.3/detached": "Its output is right, but no gradient reaches {name}: the attention ran off "
    "autograd's graph (torch.no_grad(), .detach()), so q_proj, k_proj and v_proj would never "
    "learn. Compute the output from weights on the graph; detach only the copy kept in "
    "attention_weights.",
    "3.3/device-not-kept": _device_not_kept(
        "the module and its inputs", "make every new tensor on the inputs' device (a default "
        "mask too, device=query.device, or pass mask=None on to the attention of 2.2), and keep "
        "attention_weights where it was computed (weights.detach(), no .cpu(): a plot moves "
        "its own copy)."),
    # 4.1 padding_mask
    "4.1/inverted": "Your mask is True at the padding and False at the real tokens, the "
    "opposite of the course's convention (True = attention allowed): compare tokens != pad_id, "
    "not ==.",
    "4.1/masks-queries": "Your mask has the shape [B, 1, L, 1]: it hides the padded queries "
    "(rows), not the padded keys (columns). Put the length last: [B, 1, 1, L].",
    "4.1/every-key-allowed": "Your mask allows every key, the padded ones too (a mask of "
    "ones?): attention still gives the padding weight. Compare the tokens, "
    "(tokens != pad_id)[:, None, None, :], so that only the real tokens are True.",
    "4.1/float-mask": _float_mask(
        "padding_mask", "Compare and keep the comparison's bool: (tokens != pad_id)[:, None, "
        "None, :], with no .float()."),
    "4.1/device-not-kept": _device_not_kept(
        "tokens", "make the mask from the tokens themselves, (tokens != pad_id)[:, None, None, "
        ":] (a comparison is on its operands' device), never a torch.zeros(...) filled from "
        "them."),
    # 4.2 causal_mask
    "4.2/upper-triangle": "This is the upper triangle (triu): position i would see the later "
    "positions j > i and not the earlier ones. Keep the lower triangle, tril: j <= i.",
    "4.2/true-hides": "Your mask is True where attention is hidden (the convention of "
    "nn.Transformer's masks, triu(1)); here True means allowed: use tril(), or negate yours.",
    "4.2/no-diagonal": "The diagonal is False: a position must see itself (j <= i, not j < i). "
    "Use tril() with diagonal=0.",
    "4.2/diagonal-only": "This is the identity: each position sees only itself. A causal "
    "mask lets position i see every earlier position too, j <= i: the lower triangle, "
    "torch.ones(size, size, dtype=torch.bool, device=device).tril().",
    "4.2/float-mask": _float_mask(
        "causal_mask", "Make it with dtype=torch.bool: torch.ones(size, size, dtype=torch.bool, "
        "device=device).tril()."),
    "4.2/device-not-kept": "For device the meta device (a stand-in for a GPU), your mask is on "
    "the CPU, PyTorch's default device: create it on the device passed in, torch.ones(size, "
    "size, dtype=torch.bool, device=device).tril().",
    # 4.3 target_mask
    "4.3/float-mask": _float_mask(
        "A mask of yours", "Make each with dtype=torch.bool (or by comparing, tokens != pad_id) "
        "and combine them with &, not *: padding_mask(tokens, pad_id) & causal_mask(L, "
        "tokens.device)."),
    "4.3/device-not-kept": _device_not_kept(
        "tokens", "make every part on the tokens' device: causal_mask(L, tokens.device) (4.2) "
        "and padding_mask(tokens, pad_id) (4.1), combined with &."),
    "4.3/causal-only": "This is the causal mask alone: the padded keys are still visible. "
    "Combine it with the padding mask: padding_mask(tokens, pad_id) & causal_mask(L).",
    "4.3/padding-only": "This is the padding mask alone, expanded: the decoder sees the future. "
    "Combine it with the causal mask: padding_mask(tokens, pad_id) & causal_mask(L).",
    "4.3/or-for-and": "The padding and causal masks are combined with | (either allows): "
    "attention must be allowed by both, so combine them with &.",
    "4.3/padding-on-queries": "The padding hides the padded queries (rows) instead of the padded "
    "keys (columns): use the padding mask [B, 1, 1, L] of 4.1, not [B, 1, L, 1].",
    # 5.1 LayerNorm
    "5.1/weight-and-bias-unused": "This is x normalised, but weight and bias are not applied: "
    "return normalised x * self.weight + self.bias.",
    "5.1/unbiased-variance": "This is LayerNorm with the unbiased variance (divided by D - 1): "
    "LayerNorm divides by D, so use x.var(-1, unbiased=False, keepdim=True) (correction=0).",
    "5.1/eps-outside-sqrt": "This is LayerNorm with eps added after the square root: add it to "
    "the variance inside, sqrt(var + eps).",
    "5.1/statistics-over-the-batch": "This is x normalised with the mean and variance over "
    "the batch (dim 0), as BatchNorm does: LayerNorm takes them over the features of each "
    "position alone, x.mean(-1, keepdim=True).",
    "5.1/statistics-over-positions": "This is x normalised with the mean and variance over "
    "the positions (dim -2) instead of the features: LayerNorm takes each position's own "
    "statistics over its d_model features, x.mean(-1, keepdim=True).",
    "5.1/statistics-over-positions-too": "This is x normalised with statistics over the "
    "positions and the features together: LayerNorm normalises each position's feature vector "
    "alone, over the last dimension only.",
    "5.1/dtype-changed": "Its values are right, but for {dtype} x the output is {got}: "
    "LayerNorm keeps x's dtype (a model in float32 or bfloat16 runs through it). A step in "
    "another dtype (.double(), dtype=torch.float64, NumPy's float64) changed it: compute with "
    "x's own dtype, or convert the result back with .to(x.dtype).",
    "5.1/no-parameters": "LayerNorm has no parameters: create weight (ones) and bias (zeros) "
    "of shape [d_model] as nn.Parameter, and return normalised x * weight + bias.",
    # 5.2 PositionwiseFeedForward
    "5.2/no-activation": "This is linear2(linear1(x)) with no ReLU between them: two linears "
    "in a row are one linear map. Apply the ReLU to the hidden layer: "
    "linear2(relu(linear1(x))).",
    "5.2/gelu": "This is the network with GELU: the paper's feed-forward network uses ReLU, "
    "max(0, x W1 + b1) W2 + b2.",
    "5.2/dropout-on-output": "Dropout is applied to the network's output: it goes on the "
    "hidden activations [B, L, d_ff], between the ReLU and linear2 (the residual drops the "
    "output itself).",
    "5.2/device-not-kept": _device_not_kept(
        "the module and x", "the ReLU is torch.relu(h) (or h.clamp(min=0)), computed from h "
        "alone; a torch.zeros(h.shape) to compare with takes the CPU (torch.zeros_like(h) "
        "keeps h's device and dtype)."),
    # 5.3 ResidualConnection
    "5.3/always-post-ln": "With norm_first=True this is the post-LN norm(x + sublayer(x)): "
    "pre-LN normalises the sublayer's input and leaves the sum alone, x + "
    "dropout(sublayer(norm(x))).",
    "5.3/placements-swapped": "With norm_first=False this is pre-LN, x + sublayer(norm(x)): "
    "the placements are swapped. norm_first=False is the paper's post-LN, "
    "norm(x + dropout(sublayer(x))).",
    "5.3/norm-on-the-branch": "This is x + norm(sublayer(x)): post-LN normalises the sum, "
    "norm(x + dropout(sublayer(x))).",
    "5.3/sublayer-called-twice": "The sublayer was called {calls} times: call it once and keep "
    "its output (a second call costs as much again, and with dropout draws other masks).",
    "5.3/dropout-on-the-sum": "Dropout is applied to the sum x + sublayer(...): drop the "
    "sublayer's output only, before adding it to x, so that the residual path x stays intact.",
    "5.3/skip-detached": "The output is right, but the gradient with respect to x is the "
    "sublayer branch's alone: x was detached (x.detach(), x.data) where it is added back, "
    "so the residual path, which carries the gradient straight down to the lower layers, "
    "carries none. Add x itself: x + dropout(sublayer(norm(x))).",
    # 5.4 EncoderLayer
    "5.4/mask-not-passed": "This is the layer's output with no mask: pass mask on to the "
    "self-attention, self_attn(y, y, y, mask).",
    "5.4/norm-first-not-passed-on": "With norm_first=True this is the post-LN layer: pass "
    "norm_first on to each ResidualConnection.",
    "5.4/device-not-kept": _device_not_kept(
        "the layer and x", "when mask is None, pass None on to the attention (2.2 masks "
        "nothing then); a mask of ones made with torch.ones(...) takes the CPU (one made with "
        "device=x.device would not)."),
    # 5.5 DecoderLayer
    "5.5/self-attention-unmasked": "This is the layer with its self-attention given no mask: "
    "each target position sees the later ones (and the padding). Pass tgt_mask to the "
    "self-attention over x (src_mask goes to the cross-attention).",
    "5.5/memory-unused": "Changing the encoder's memory did not change the decoder's output: "
    "cross-attention takes its queries from the decoder and its keys and values from memory, "
    "cross_attn(y, memory, memory, src_mask).",
    "5.5/masks-swapped": "{call} raised a size mismatch only when given masks: {error}. The "
    "package calls layer(x, memory, src_mask, tgt_mask), in that order; tgt_mask "
    "[B, 1, Lt, Lt] goes to the self-attention over x, src_mask [B, 1, 1, Ls] to the "
    "cross-attention (it masks the memory's keys).",
    "5.5/cross-attention-queries": "{call} raised a size mismatch: {error}. Cross-attention "
    "takes its queries from the decoder (x) and its keys and values from the memory: "
    "cross_attn(y, memory, memory, src_mask), whose output has x's length Lt.",
    "5.5/memory-detached": "The output is right, but no gradient reaches the memory: it was "
    "detached (or used under torch.no_grad()), so the encoder, whose output it is, never "
    "learns from the decoder's loss. Use memory as it comes: cross_attn(y, memory, memory, "
    "src_mask).",
    # 5.6 Encoder
    "5.6/layers-shared": "layers holds one layer {count} times: one set of weights applied "
    "{count} times. Build each layer anew, nn.ModuleList([EncoderLayer(...) for _ in "
    "range(num_layers)]), not [layer] * num_layers.",
    "5.6/no-final-norm": "This is the pre-LN stack without its last norm: pre-LN layers leave "
    "the residual stream unnormalised, so with norm_first=True the stack ends with norm(x), "
    "a LayerNorm (nn.Identity() only for post-LN).",
    "5.6/mask-not-passed": "This is the stack's output with no mask: pass mask on to every "
    "layer, x = layer(x, mask).",
    "5.6/dropout-not-passed-on": "This is the stack in training mode with no dropout in its "
    "layers: they were built with dropout 0. Pass dropout on to every layer, "
    "EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first), or the model the chapters "
    "train never drops anything.",
    "5.6/norm-first-not-passed-on": "This is a pre-LN stack of post-LN layers (its last norm "
    "is there, its layers normalise after each sublayer): pass norm_first on to every layer, "
    "EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first).",
    "5.6/layers-not-chained": "This is the last layer applied to the stack's input: every "
    "layer read x, the stack's input, not the output of the layer before it. Feed each "
    "layer's output to the next, for layer in self.layers: x = layer(x, mask).",
    "5.6/norm-always-identity": "With norm_first=True the {name}'s state dict has no "
    "norm.weight and norm.bias: its last norm holds no parameters (nn.Identity() whatever "
    "norm_first is?). Pre-LN layers leave the residual stream unnormalised, so a pre-LN stack "
    "ends with a LayerNorm: self.norm = LayerNorm(d_model) if norm_first else nn.Identity().",
    "5.6/device-not-kept": _device_not_kept(
        "the stack and x", "when mask is None, pass None on to the layers; a mask of ones "
        "made with torch.ones(...) takes the CPU (one made with device=x.device would not)."),
    # 5.7 Decoder
    "5.7/layers-shared": "layers holds one layer {count} times: one set of weights applied "
    "{count} times. Build each layer anew, nn.ModuleList([DecoderLayer(...) for _ in "
    "range(num_layers)]).",
    "5.7/no-final-norm": "This is the pre-LN stack without its last norm: with "
    "norm_first=True the decoder ends with norm(x), a LayerNorm.",
    "5.7/masks-not-passed": "This is the stack's output with no masks: pass both on to every "
    "layer, x = layer(x, memory, src_mask, tgt_mask).",
    "5.7/target-mask-not-passed": "This is the stack's output with the target's mask left "
    "out: self-attention reads the tokens it must predict. Pass both masks on to every "
    "layer, x = layer(x, memory, src_mask, tgt_mask).",
    "5.7/source-mask-not-passed": "This is the stack's output with the source's mask left "
    "out: cross-attention reads the source's padding. Pass both masks on to every layer, "
    "x = layer(x, memory, src_mask, tgt_mask).",
    "5.7/masks-swapped": "{call} raised a size mismatch: {error}. Your stack hands the layers "
    "its two masks swapped (called with them swapped, it computes the right output): the "
    "layer takes layer(x, memory, src_mask, tgt_mask), the source's mask [B, 1, 1, Ls] for "
    "cross-attention, then the target's [B, 1, Lt, Lt] for self-attention.",
    "5.7/dropout-not-passed-on": "This is the stack in training mode with no dropout in its "
    "layers: they were built with dropout 0. Pass dropout on to every layer, "
    "DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first).",
    "5.7/norm-first-not-passed-on": "This is a pre-LN stack of post-LN layers (its last norm "
    "is there, its layers normalise after each sublayer): pass norm_first on to every layer, "
    "DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first).",
    "5.7/layers-not-chained": "This is the last layer applied to the stack's input: every "
    "layer read x, the stack's input, not the output of the layer before it. Feed each "
    "layer's output to the next, x = layer(x, memory, src_mask, tgt_mask) in the loop.",
    "5.7/norm-always-identity": "With norm_first=True the {name}'s state dict has no "
    "norm.weight and norm.bias: its last norm holds no parameters (nn.Identity() whatever "
    "norm_first is?). A pre-LN stack ends with a LayerNorm: self.norm = LayerNorm(d_model) "
    "if norm_first else nn.Identity().",
    "5.7/memory-detached": "The output is right, but no gradient reaches the memory: it was "
    "detached (or used under torch.no_grad()) before the layers read it, so the encoder "
    "never learns from the decoder's loss. Hand every layer memory as it comes.",
    # 5.8 EncoderDecoder
    "5.8/log-probabilities": "These are log-probabilities (a log_softmax after the "
    "generator): forward returns the generator's logits, and the loss of Chapter 6 takes "
    "logits (it computes its own log_softmax).",
    "5.8/cross-attention-unmasked": "This is the decoder run without the source's mask: "
    "cross-attention must not read the source's padding, so decode passes src_mask on, "
    "self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask).",
    "5.8/target-read-by-source-embedding": "This is the target read through src_embed: the "
    "decoder embeds tgt with tgt_embed (the same matrix only when the weights are tied).",
    "5.8/dropout-not-passed-on": "{call} drew no dropout in {parts}: pass the model's dropout "
    "on to every part, embeddings(vocab_size, d_model, max_len, dropout), Encoder(..., "
    "dropout, norm_first) and Decoder(..., dropout, norm_first), or the model never drops "
    "anything in training.",
    "5.8/generator-in-decode": "decode returned the generator's logits [B, Lt, V]: decode "
    "returns the decoder's hidden states [B, Lt, D], and forward alone applies the generator "
    "(greedy decoding, 6.4, applies it to the last position of decode's output).",
    "5.8/dtype-changed": "Its values are right, but for a model in {dtype} the logits are "
    "{got}: forward returns the generator's output in the model's dtype (model.double() "
    "gives float64 logits, model.float() float32). A cast (.float(), .double(), .to(...)) on "
    "the way changed it: leave the dtype to the module's parameters.",
    "5.8/memory-detached": "The logits are right, but no gradient reaches the encoder and the "
    "source embedding: the memory was detached (or computed under torch.no_grad()) between "
    "encode and decode, so the encoder never learns. forward is generator(decode(encode(src, "
    "src_mask), src_mask, tgt, tgt_mask)), on autograd's graph throughout.",
    "5.8/device-not-kept": _device_not_kept(
        "the model and the tokens", "when a mask is None, pass None on to the stacks; masks "
        "made with torch.ones(...) take the CPU (made from the tokens, src != pad_id, they "
        "would not)."),
    "5.8/not-tied": "With tie_embeddings=True {missing} should be the source embedding's "
    "own nn.Parameter, but {how}: assign it, self.generator.weight = "
    "self.src_embed.tokens.embedding.weight (likewise tgt_embed), after initialising.",
    "5.8/not-xavier": "{name} reaches {largest} at initialisation, beyond Xavier's bound "
    "{bound}: initialise every parameter with more than one dimension with "
    "nn.init.xavier_uniform_ (nn.Embedding's own N(0, 1) is far larger).",
    # 6.1 noam_lr
    "6.1/warmup-exponent": "These are the rates with step * warmup_steps^-0.5 during warmup: "
    "the warmup branch is step * warmup_steps^-1.5, so that both branches meet at step = "
    "warmup_steps.",
    "6.1/d_model-to-minus-1": "These are the rates scaled by d_model^-1: the paper's scale is "
    "d_model^-0.5 (1 / sqrt(d_model)).",
    "6.1/step-zero": "noam_lr gives {at_zero} at step 0 and {at_one} at step 1: count step 0 "
    "as step 1 (step = max(step, 1)): 0^-0.5 is infinite, and a rate of 0 wastes the first "
    "step.",
    "6.1/not-a-float": "Its values are right, but noam_lr returns a {kind}, not a Python "
    "float: the rate is a plain number that LambdaLR multiplies the optimiser's lr by, and a "
    "tensor there (torch.tensor, torch.rsqrt, torch.minimum) would carry a dtype and a device "
    "into every step. Compute it with Python's arithmetic (step ** -0.5, min(a, b)), or "
    "return float(rate).",
    # 6.2 LabelSmoothingLoss
    "6.2/smoothing-over-the-other-classes": "This is the loss with the smoothing spread over "
    "the V - 1 wrong classes (s / (V - 1) each): the course, like PyTorch's label_smoothing, "
    "spreads s over all V classes, so the target gets 1 - s + s / V: "
    "(1 - s) * (-log p[target]) + s * mean over V of -log p.",
    "6.2/mean-includes-ignored": "This is the loss averaged over every target, ignored ones "
    "included: divide by the number of targets that are not ignore_index.",
    "6.2/nan-when-all-ignored": "With every target ignored the loss is NaN (a mean of nothing, "
    "0 / 0): divide the sum by max(count, 1) so that it is 0, still connected to the logits.",
    "6.2/dtype-changed": "The loss is right, but for {dtype} logits it is {got}: the loss "
    "keeps the logits' dtype. A tensor made in another dtype (a one-hot .double(), "
    "dtype=torch.float64, NumPy's float64) promoted it: make the target distribution with "
    "dtype=logits.dtype (or .to(logits.dtype)).",
    "6.2/detached": "The loss is right, but no gradient reaches the logits: it was rebuilt "
    "off autograd's graph (float(...), .item(), .tolist(), torch.tensor(...) of computed "
    "values), so loss.backward() would train nothing. Compute it with torch operations on "
    "the logits alone (a masked sum divided by the count).",
    "6.2/device-not-kept": _device_not_kept(
        "the logits and the targets", "make new tensors on theirs: torch.ones_like(target, "
        "dtype=torch.bool) for the targets kept, torch.zeros_like(loss); never "
        "torch.ones(N, dtype=torch.bool) or torch.zeros(N), which take the CPU."),
    "6.2/log-of-softmax": "The loss is not finite for logits of +-1000: log(softmax(x)) takes "
    "log(0) = -inf where a probability underflows. Use torch.log_softmax, computed as "
    "x - logsumexp(x).",
    # 6.3 make_batch
    "6.3/target-not-shifted": "tgt_input is the whole target: the decoder would see each token "
    "it must predict. Feed tgt[:, :-1] (BOS first, the last token dropped) and predict "
    "tgt[:, 1:].",
    "6.3/labels-include-bos": "tgt_labels is tgt[:, :-1], the decoder's input: the labels are "
    "the next tokens, tgt[:, 1:] (position t predicts token t + 1).",
    "6.3/shift-reversed": "The shift is reversed: tgt_input is tgt[:, 1:] (no BOS) and "
    "tgt_labels tgt[:, :-1], so each position would predict the token before it. The decoder "
    "reads tgt[:, :-1] (BOS first) and predicts tgt[:, 1:] (position t predicts token t + 1).",
    "6.3/padding-counted": "num_tokens counts the padding too ({counted} labels): count the "
    "labels that are not pad_id, int((tgt_labels != pad_id).sum()).",
    "6.3/target-mask-not-causal": "tgt_mask is the padding mask alone: each position would see "
    "the later ones. Combine it with the causal mask (target_mask of 4.3).",
    "6.3/device-not-kept": _device_not_kept(
        "src and tgt", "make every tensor of the batch on theirs. Chapter 4's padding_mask "
        "and target_mask (active_parts()) keep the tokens' device; by hand, "
        "torch.ones(n, n, dtype=torch.bool, device=tgt.device).tril(), never torch.ones(n, "
        "n), which takes the CPU."),
    # 6.4 greedy_decode
    "6.4/generates-after-eos": "A row keeps generating after its EOS: write pad_id in a row "
    "once it has produced EOS (keep a boolean done per row).",
    "6.4/never-stops-early": "The output always has max_len columns: stop as soon as every row "
    "has produced EOS.",
    "6.4/source-encoded-every-step": "The source is encoded {calls} times: encode it once "
    "before the loop (memory = model.encode(src, src_mask)) and decode from that memory at "
    "every step.",
    "6.4/no-target-mask": "greedy_decode passed tgt_mask=None to model.decode: pass the causal "
    "mask of the prefix (causal_mask(L) of 4.2), as in training.",
    "6.4/device-not-kept": _device_not_kept(
        "the source and the model", "make the ids, the finished flags and the causal mask on "
        "src's device: torch.full((B, 1), bos_id, dtype=src.dtype, device=src.device), "
        "causal_mask(L, device=src.device); never torch.full(shape, ...) or torch.zeros(...) "
        "alone, which take the CPU."),
    # 6.5 train_step
    "6.5/gradients-not-zeroed": "These are the weights when each step's gradients are added to "
    "the last step's: backward adds to .grad, so zero it first, optimizer.zero_grad(), in "
    "every step.",
    "6.5/not-clipped": "These are the weights of an update with the gradients as they came: "
    "clip them to a total norm of clip_norm, nn.utils.clip_grad_norm_(model.parameters(), "
    "clip_norm), after backward and before optimizer.step().",
    "6.5/clipped-at-zero": "With clip_norm=0 the weights never changed: the gradients were "
    "clipped to a total norm of 0. clip_norm of None or 0 means no clipping: clip only when "
    "it is set, if clip_norm: nn.utils.clip_grad_norm_(model.parameters(), clip_norm).",
    "6.5/zeroed-before-step": "The weights never changed: the gradients were zeroed after "
    "backward and before optimizer.step(), which then had nothing to apply. Zero them at the "
    "start of the step (or after the update), never between backward and step.",
    "6.5/schedule-before-step": "These are the weights of an update at the next step's "
    "learning rate: scheduler.step() ran before optimizer.step(). Step the optimizer first, "
    "then the scheduler (the rate it sets is the next step's).",
    "6.5/schedule-not-stepped": "The learning rate never moved: call scheduler.step() once "
    "per training step, after optimizer.step().",
    "6.5/eval-mode": "The model ran in evaluation mode: call model.train() in the step "
    "(dropout is on only in training mode).",
    "6.5/loss-as-a-number": "train_step returned the loss as a Python number ({number}, "
    "loss.item()?): return it as a scalar tensor, loss.detach(). .item() makes the host wait "
    "for the device at every step, where a tensor lets the next step start at once.",
    "6.5/loss-not-detached": "The loss returned still holds its graph (requires_grad): return "
    "loss.detach(), so that keeping it does not keep every step's graph alive.",
    "6.5/loss-dtype-changed": "The loss is right, but for a {dtype} model train_step returns "
    "it as {got}: a tensor rebuilt from a number (torch.tensor(loss.item())) takes the default "
    "dtype, float32, and the CPU, and makes the host wait for the device. Return "
    "loss.detach(), which keeps the model's dtype and device.",
    "6.5/gradient-dtype-changed": "The gradients of a float32 model became float64, and "
    "PyTorch refuses to give a parameter a gradient of another dtype: the clipping computed "
    "its scale in float64 (dtype=torch.float64, .double()) and multiplied the gradients by "
    "it. Clip with nn.utils.clip_grad_norm_(model.parameters(), clip_norm), or scale each "
    "gradient in place in its own dtype (grad.mul_(scale)).",
    "6.5/device-not-kept": _device_not_kept(
        "the model and the batch", "clip with nn.utils.clip_grad_norm_(model.parameters(), "
        "clip_norm), or sum the gradients' norms with torch operations on the gradients "
        "themselves (torch.stack([g.norm() for g in grads]).norm()), never into torch.zeros(1), "
        "which takes the CPU."),
    # 7.1 beam_search
    "7.1/penalty-counts-bos": "This is the best sequence when n counts BOS in the length "
    "penalty ((5 + n) / 6) ** length_penalty: n counts the generated tokens only (EOS "
    "included, BOS not).",
    "7.1/length-penalty-ignored": "This is the best sequence with no length penalty: divide "
    "each finished hypothesis's sum of log-probabilities by ((5 + n) / 6) ** length_penalty "
    "before comparing (n its generated tokens, EOS included).",
    "7.1/penalty-per-token": "This is the search with each token's log-probability divided by "
    "the penalty at its position: the penalty divides a finished hypothesis's whole sum, once, "
    "when hypotheses are compared at the end.",
    "7.1/scores-not-accumulated": "This is the search that ranks hypotheses by their last "
    "token's log-probability alone: a hypothesis's score is the sum of the log-probabilities "
    "of all its tokens (add each step's log-probability to its parent's total).",
    "7.1/finished-dropped": "This is the search that forgets the hypotheses ended by EOS and "
    "answers with a live one at max_len: keep every finished hypothesis with its score until "
    "the end, and answer with the best of them all.",
    "7.1/finished-keep-places": "This is the search whose finished hypotheses keep their "
    "places in the beam: a hypothesis that ends in EOS leaves the beam (remember it apart), so "
    "that the next step again extends beam_size live ones.",
    "7.1/finished-extended": "This is the search that goes on extending hypotheses after their "
    "EOS: a hypothesis ending in EOS is finished; set it aside with its score and extend only "
    "the live ones.",
    "7.1/no-log-softmax": "The search gives different answers for a generator's logits and for "
    "its log-probabilities: it adds up raw logits. Apply torch.log_softmax to the generator's "
    "output before adding it to the scores.",
    "7.1/beam-of-bos-copies": "Your beam started with beam_size live copies of BOS, so it "
    "filled with the same hypothesis several times: start with one live hypothesis (the others "
    "at score -inf) so that each step keeps beam_size different ones.",
    "7.1/scores-in-another-dtype": "With the model in float32, the search writes its "
    "float32 scores into a tensor of another dtype in place (scores[...] = ..., index_put_), "
    "which PyTorch refuses: a tensor made with dtype=torch.float64 (or the default float32 "
    "under a float64 model) does not follow the model. Make the search's tensors in the dtype "
    "of the model's log-probabilities (dtype=log_probs.dtype), or combine them with + and "
    "torch.where, which promote, rather than writing in place.",
    # 8.1 next_token_distribution
    "8.1/temperature-after-softmax": "This is the softmax of the logits with the temperature "
    "applied after it (or not at all): divide the logits by the temperature first, then take "
    "the softmax, softmax(logits / T).",
    "8.1/temperature-multiplied": "This is softmax(logits * T): divide the logits by the "
    "temperature, softmax(logits / T), so that T < 1 sharpens and T > 1 flattens.",
    "8.1/top-k-keeps-k-minus-1": "This keeps {kept} tokens for top_k={k}: keep the tokens whose "
    "logit is at least the k-th largest (logits < kth are removed, not logits <= kth).",
    "8.1/temperature-zero-divides": "At temperature 0 every probability is NaN: the logits "
    "were divided by 0, which gives +-inf (and NaN for 0 / 0), and a softmax of those is NaN. "
    "Temperature 0 means greedy: handle it before dividing, probability 1 on "
    "logits.argmax(-1) (the first of tied maxima) and 0 elsewhere.",
    "8.1/not-renormalised": "The rows do not sum to 1: after removing tokens, divide the "
    "probabilities that are left by their sum (or set the removed logits to -inf before the "
    "softmax).",
    "8.1/top-p-excludes-crossing": "This nucleus leaves out the token that makes the mass reach "
    "p: keep a token when the tokens more probable than it add up to less than p (the mass "
    "before it, not including it), so that the kept tokens add up to at least p.",
    "8.1/top-p-before-top-k": "This measures the nucleus on the probabilities from before "
    "top-k: top-p applied first, or top-k's survivors not renormalised before top-p (both keep "
    "the same tokens). With probabilities 0.4, 0.3, 0.2, 0.1, top_k=2 and top_p=0.5 it keeps "
    "two tokens, where top-k leaves 4/7 and 3/7 and the nucleus of that is the first token "
    "alone. Apply top-k, renormalise, then top-p.",
    "8.1/top-p-skipped-with-top-k": "With both top_k and top_p given, this is top-k alone: "
    "top-p was not applied (an if/elif?). Apply top-k, renormalise, then top-p over what it "
    "left.",
    "8.1/dtype-changed": "Its probabilities are right, but for {dtype} logits they are {got}: "
    "the distribution keeps the logits' dtype. A tensor made in the default dtype "
    "(torch.zeros(shape), a one-hot .float()) changed it: make new tensors with "
    "torch.zeros_like(logits) or dtype=logits.dtype.",
    "8.1/device-not-kept": _device_not_kept(
        "the logits", "make new tensors on theirs, torch.zeros_like(logits) (a one-hot for "
        "temperature 0) or torch.full_like(logits, float('-inf')), never torch.zeros(shape), "
        "which takes the CPU."),
    # 8.2 sample_next
    "8.2/draws-at-temperature-zero": "At temperature 0 your sample_next still draws from the "
    "generator (its state changed): return the argmax without drawing, so that a generator "
    "shared with other draws gives them what it would have without this call.",
    "8.2/always-greedy": "Every token drawn at temperature 1.5 is its row's most probable one: "
    "sample_next returns the argmax whatever the temperature. Draw from the distribution, "
    "torch.multinomial(probs, 1, generator=generator); only temperature 0 is greedy.",
    "8.2/generator-unused": "The same seed gave different tokens: draw with the generator "
    "passed in, torch.multinomial(probs, 1, generator=generator), so that a seed reproduces "
    "the samples.",
    "8.2/not-int64": "The tokens drawn are right, but their ids are {got}: token ids are "
    "torch.long (int64), what nn.Embedding reads and what torch.cat appends to the ids so far. "
    "torch.multinomial and argmax give int64; convert others with .long().",
    "8.2/device-not-kept": _device_not_kept(
        "the logits", "keep the ids where the logits are: probs.argmax(-1) and "
        "torch.multinomial(probs, 1, generator=generator) do; never torch.tensor([...]) of "
        "values read row by row, which takes the CPU (and waits for the device at every "
        "row)."),
    # 8.3 attention_step
    "8.3/cache-ignored": "This is the new position attending to itself alone: its query must "
    "attend to the cached keys and values too (concatenate them before the new ones, "
    "dim=2).",
    "8.3/no-out-proj": "This is the output with the heads merged but not projected: apply "
    "the module's out_proj to the merged heads, attn.out_proj(merge_heads(...)), the last step "
    "of MultiHeadAttention (3.3).",
    "8.3/new-position-first": "The returned cache has the new key and value before the old "
    "ones: append them after, torch.cat([cached, new], dim=2), so that the cache's position "
    "i is the sequence's position i.",
    "8.3/cache-not-extended": "The returned cache is the one passed in: return the keys and "
    "values with the new position appended, so that the next step sees it.",
    "8.3/dtype-changed": "Its output is right, but for {dtype} inputs the cache it returns is "
    "{got}: the keys and values keep the module's dtype, or the next step's attention "
    "multiplies tensors of two dtypes. Return the projected keys and values as they are, "
    "without .double() or .float().",
    "8.3/detached": "Its output is right, but no gradient reaches {names}: the step ran off "
    "autograd's graph (torch.no_grad(), .detach()). attention_step computes what "
    "MultiHeadAttention does, and trains like it: leave torch.no_grad() to the caller that "
    "generates.",
    "8.3/device-not-kept": _device_not_kept(
        "the module and x", "make every tensor on x's device; with no cache, start from the "
        "new key and value themselves (or k[:, :, :0]), never torch.zeros(B, H, 0, d_k), "
        "which takes the CPU."),
    # 8.4 language_model_loss
    "8.4/not-shifted": "This is the loss of each position's logits against its own token: the "
    "logits at position i predict token i + 1 (logits[:, :-1] against tokens[:, 1:]).",
    "8.4/shifted-backwards": "This is the loss of logits[:, 1:] against tokens[:, :-1] (each "
    "position predicting the token before it): the logits at position i predict token i + 1, "
    "logits[:, :-1] against tokens[:, 1:].",
    "8.4/padding-counted": "This loss counts the padding: leave out every target equal to "
    "pad_id (ignore_index=pad_id) and divide by the number of tokens that are left.",
    "8.4/mean-of-row-means": "This is the mean of each row's mean: every predicted token "
    "weighs the same, so sum over all of them and divide by their number, whatever their "
    "rows' lengths.",
    "8.4/dtype-changed": "The loss is right, but for {dtype} logits it is {got}: the loss keeps "
    "the logits' dtype. A step in another dtype (.double() for precision, dtype=torch.float64) "
    "changed it: compute on the logits as they are (log_softmax is stable in float32).",
    "8.4/detached": "The loss is right, but no gradient reaches the logits: it was rebuilt "
    "from its value (float(...), .item(), torch.tensor(...)), so loss.backward() would train "
    "nothing. Return the loss that torch operations on the logits computed.",
    # 8.5 DecoderOnlyTransformer
    "8.5/log-probabilities": "These are log-probabilities (a log_softmax after the "
    "generator): forward returns the generator's logits, which language_model_loss (8.4) "
    "takes.",
    "8.5/mask-not-passed": "This is the model run without the mask: pass mask on to the "
    "stack, self.decoder(self.embed(tokens), mask), or every position reads the tokens it "
    "must predict.",
    "8.5/dropout-not-passed-on": "In training with dropout, the model drew no dropout in "
    "{parts}: pass the model's dropout on to both, embeddings(vocab_size, d_model, max_len, "
    "dropout) and Encoder(d_model, num_heads, d_ff, num_layers, dropout, norm_first), or the "
    "model never drops anything while it trains.",
    "8.5/dtype-changed": "Its logits are right, but after .double() the model returns them "
    "as {got} (for {dtype} weights): a module's output follows its weights' dtype. Return "
    "the generator's output as it is, without .float() or .double().",
    "8.5/detached": "Its logits are right, but no gradient reaches {names}: a step of forward "
    "is off autograd's graph (.detach(), torch.no_grad(), .data), so those parameters never "
    "learn. Keep every step of generator(decoder(embed(tokens), mask)) on the graph.",
    "8.5/device-not-kept": _device_not_kept(
        "the model, tokens and mask", "add the positions with the embedding module, "
        "self.embed(tokens), whose table is a buffer that model.to(device) moves; never a "
        "table or mask made in forward, which is made on the CPU."),
    "8.5/positions-skipped": "These are the logits of the tokens' embeddings without their "
    "positions (embed.tokens(tokens)?): the model cannot tell the order of the tokens. Embed "
    "with the whole embeddings module, self.embed(tokens), which adds the positional "
    "encoding.",
    "8.5/generator-twice": "forward ran the generator {calls} times and the second run "
    "failed: {error}. The generator turns the stack's output [B, L, D] into logits [B, L, V] "
    "once: return self.generator(self.decoder(self.embed(tokens), mask)).",
    "8.5/not-tied": "With tie_embeddings=True the generator's weight should be the "
    "embedding's own nn.Parameter, but it is {how}: assign it, self.generator.weight = "
    "self.embed.tokens.embedding.weight, after initialising.",
    "8.5/not-xavier": "{name} reaches {largest} at initialisation, beyond Xavier's bound "
    "{bound}: initialise every parameter with more than one dimension with "
    "nn.init.xavier_uniform_.",
}


def named(mistake: str, **values: object) -> str:
    """The message of ``mistake`` (its ``{placeholders}`` filled from ``values``), ending with
    its id in the grader's sealed tag."""
    return f"{MISTAKES[mistake].format(**values)} {mistake_tag(mistake)}"


def first_match(value: object, candidates: dict[str, torch.Tensor], atol: float = 1e-6,
                rtol: float = 1e-5) -> str | None:
    """The id of the first candidate mistake whose result ``value`` equals (shape and values;
    bool tensors exactly), None for none."""
    if not isinstance(value, torch.Tensor):
        return None
    for mistake, mistaken in candidates.items():
        if value.shape != mistaken.shape:
            continue
        if value.dtype == torch.bool or mistaken.dtype == torch.bool:
            if value.dtype == mistaken.dtype and torch.equal(value, mistaken):
                return mistake
        elif torch.allclose(value.double(), mistaken.double(), atol=atol, rtol=rtol):
            return mistake
    return None


def mistake_of(value: object, expected: torch.Tensor, candidates: dict[str, torch.Tensor],
               atol: float = 1e-6, rtol: float = 1e-5) -> str | None:
    """The id of the first candidate mistake whose result ``value`` equals, None when
    ``value`` is ``expected`` itself (a mistake that gives the right result here is not
    one) or matches none."""
    if (isinstance(value, torch.Tensor) and value.shape == expected.shape
            and torch.allclose(value.double(), expected.double(), atol=atol, rtol=rtol)):
        return None
    return first_match(value, candidates, atol, rtol)


# PyTorch's words for a tensor that met, or was copied out of, one on another device: with
# the inputs on the "meta" device, a tensor the learner's code made on the CPU (or moved
# there) is all that raises them.
DEVICE_CLASH = re.compile(r"is not on the expected device|Expected all tensors to be on the "
                          r"same device|Cannot copy out of meta tensor")
# ... for a tensor written into one of another floating dtype.
DTYPE_CLASH = re.compile(r"\b(Float|Double|Half|BFloat16) did not match (Float|Double|Half|"
                         r"BFloat16)\b|Index put requires the source and destination dtypes "
                         r"match")


def run_naming(learner, probe, clash: re.Pattern, mistake: str, **inputs: object) -> object:
    """``learner.run(probe, **inputs)``; an error of the learner's code whose message
    ``clash`` matches (PyTorch's words for what ``mistake`` does) names ``mistake``, after
    PyTorch's words (an error of the code under test all the same)."""
    try:
        return learner.run(probe, **inputs)
    except LearnerRaised as error:
        if clash.search(error.message) is None:
            raise
        raise LearnerRaised(error.types, f"{error.message}: {named(mistake)}",
                            error.where) from None
