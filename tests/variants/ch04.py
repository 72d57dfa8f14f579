"""Chapter 4: plausible wrong answers and other correct answers."""

from __future__ import annotations

import torch

from variants import right, wrong

# ------------------------------------------------------------------ 4.1


@wrong("4.1", "padding_mask", "inverted: True at the padding",
       mistake="4.1/inverted")
def inverted(tokens, pad_id):
    return (tokens == pad_id)[:, None, None, :]


@wrong("4.1", "padding_mask", "[B, L] left as it is: does not broadcast over heads and queries")
def not_broadcastable(tokens, pad_id):
    return tokens != pad_id


@wrong("4.1", "padding_mask", "[B, 1, L, 1]: masks queries instead of keys",
       mistake="4.1/masks-queries")
def masks_queries(tokens, pad_id):
    return (tokens != pad_id)[:, None, :, None]


@wrong("4.1", "padding_mask", "a float mask of 0 and 1", mistake="4.1/float-mask")
def float_mask(tokens, pad_id):
    return (tokens != pad_id).float()[:, None, None, :]


@wrong("4.1", "padding_mask", "only key 0 allowed: the right shape, padded keys get no weight, "
       "but every real token after the first is hidden too")
def only_first_key(tokens, pad_id):
    mask = torch.zeros(tokens.size(0), 1, 1, tokens.size(1), dtype=torch.bool,
                       device=tokens.device)
    mask[..., 0] = True
    return mask


@wrong("4.1", "padding_mask", "every key allowed: the right shape and dtype, right only for "
       "a batch without padding", mistake="4.1/every-key-allowed")
def allows_every_key(tokens, pad_id):
    return torch.ones(tokens.size(0), 1, 1, tokens.size(1), dtype=torch.bool,
                      device=tokens.device)


@wrong("4.1", "padding_mask", "a bool mask made on the CPU, then filled from the tokens",
       mistake="4.1/device-not-kept")
def filled_on_the_cpu(tokens, pad_id):
    mask = torch.zeros(tokens.size(0), 1, 1, tokens.size(1), dtype=torch.bool)
    mask[:, 0, 0] = tokens != pad_id
    return mask


@right("4.1", "padding_mask", "ne and two unsqueezes")
def ne_unsqueeze(tokens, pad_id):
    return tokens.ne(pad_id).unsqueeze(1).unsqueeze(2)


@right("4.1", "padding_mask", "eq negated, then view")
def eq_negated_view(tokens, pad_id):
    batch, length = tokens.shape
    return (~tokens.eq(pad_id)).view(batch, 1, 1, length)


# ------------------------------------------------------------------ 4.2


@wrong("4.2", "causal_mask", "the upper triangle: every position sees the future",
       mistake="4.2/upper-triangle")
def upper_triangle(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).triu()


@wrong("4.2", "causal_mask", "the diagonal left out: a position cannot see itself",
       mistake="4.2/no-diagonal")
def no_diagonal(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril(-1)


@wrong("4.2", "causal_mask", "True = hidden (PyTorch's nn.Transformer convention)",
       mistake="4.2/true-hides")
def hidden_convention(size, device=None):
    return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)


@wrong("4.2", "causal_mask", "device ignored: always on the CPU", mistake="4.2/device-not-kept")
def cpu_only(size, device=None):
    return torch.ones(size, size).tril().bool()


@wrong("4.2", "causal_mask", "the identity: no later position leaks, but no earlier one is seen",
       mistake="4.2/diagonal-only")
def identity_mask(size, device=None):
    return torch.eye(size, dtype=torch.bool, device=device)


@wrong("4.2", "causal_mask", "a float triangle of ones on the given device, not a bool mask",
       mistake="4.2/float-mask")
def float_triangle(size, device=None):
    return torch.ones(size, size, device=device).tril()


@right("4.2", "causal_mask", "comparison of aranges")
def arange_comparison(size, device=None):
    positions = torch.arange(size, device=device)
    return positions[None, :] <= positions[:, None]


@right("4.2", "causal_mask", "triu(1) negated")
def triu_negated(size, device=None):
    return ~torch.ones(size, size, dtype=torch.bool, device=device).triu(diagonal=1)


# ------------------------------------------------------------------ 4.3


def _pad(tokens, pad_id):
    return (tokens != pad_id)[:, None, None, :]


def _causal(size, device):
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


@wrong("4.3", "target_mask", "causal only: padded keys still visible",
       mistake="4.3/causal-only")
def causal_only(tokens, pad_id):
    batch, length = tokens.shape
    return _causal(length, tokens.device).expand(batch, 1, length, length)


@wrong("4.3", "target_mask", "padding only: the decoder sees the future",
       mistake="4.3/padding-only")
def padding_only(tokens, pad_id):
    batch, length = tokens.shape
    return _pad(tokens, pad_id).expand(batch, 1, length, length)


@wrong("4.3", "target_mask", "padding applied to the queries (rows) instead of the keys",
       mistake="4.3/padding-on-queries")
def padding_on_queries(tokens, pad_id):
    return (tokens != pad_id)[:, None, :, None] & _causal(tokens.size(1), tokens.device)


@wrong("4.3", "target_mask", "combined with or instead of and",
       mistake="4.3/or-for-and")
def combined_with_or(tokens, pad_id):
    return _pad(tokens, pad_id) | _causal(tokens.size(1), tokens.device)


@wrong("4.3", "target_mask", "a float causal triangle combined with the bool padding mask",
       mistake="4.3/float-mask")
def float_causal(tokens, pad_id):
    length = tokens.size(1)
    return _pad(tokens, pad_id) & torch.ones(length, length, device=tokens.device).tril()


@wrong("4.3", "target_mask", "float masks multiplied: the right pattern of 1.0 and 0.0, not bool",
       mistake="4.3/float-mask")
def multiplied_float_masks(tokens, pad_id):
    length = tokens.size(1)
    return _pad(tokens, pad_id).float() * torch.ones(length, length, device=tokens.device).tril()


@wrong("4.3", "target_mask", "the causal part made on the CPU whatever the tokens' device",
       mistake="4.3/device-not-kept")
def causal_on_the_cpu(tokens, pad_id):
    return _pad(tokens, pad_id) & _causal(tokens.size(1), None)


@wrong("4.3", "target_mask", "the identity plus key 0: nothing leaks, padded keys get no "
       "weight, but most of the past is hidden")
def identity_plus_first_key(tokens, pad_id):
    batch, length = tokens.shape
    mask = torch.eye(length, dtype=torch.bool, device=tokens.device)
    mask[:, 0] = True
    return (mask & _pad(tokens, pad_id)).expand(batch, 1, length, length)


@right("4.3", "target_mask", "logical_and of aranges and the padding")
def logical_and_aranges(tokens, pad_id):
    positions = torch.arange(tokens.size(1), device=tokens.device)
    causal = positions.view(1, -1) <= positions.view(-1, 1)
    return torch.logical_and(tokens.ne(pad_id).view(tokens.size(0), 1, 1, -1), causal)


@right("4.3", "target_mask", "masked_fill of a full mask")
def masked_fill_full(tokens, pad_id):
    batch, length = tokens.shape
    mask = torch.ones(batch, 1, length, length, dtype=torch.bool, device=tokens.device)
    mask = mask.masked_fill(torch.ones(length, length, dtype=torch.bool,
                                       device=tokens.device).triu(1), False)
    return mask.masked_fill((tokens == pad_id)[:, None, None, :], False)
