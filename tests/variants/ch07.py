"""Chapter 7: plausible wrong answers and other correct answers."""

from __future__ import annotations

import math

import torch

from variants import right, wrong

# ------------------------------------------------------------------ 7.1, one row at a time


def _penalty(n, alpha):
    return ((5 + n) / 6) ** alpha


def _one_row(model, memory, src_mask, max_len, bos_id, eos_id, beam_size, alpha, *,
             accumulate=True, normalise=True, per_token_penalty=False, remember_finished=True,
             finished_take_slots=False, eos_ends=True, n_offset=0):
    """Beam search of one row with Python lists: ``(score, tokens)`` of the answer."""
    live = [([bos_id], 0.0)]  # (tokens with BOS, sum of log-probabilities)
    parked = []  # finished_take_slots: finished hypotheses still holding a place in the beam
    best = (-math.inf, [bos_id])

    def finish(tokens, total):
        nonlocal best
        n = len(tokens) - 1 + n_offset
        score = total if per_token_penalty else total / _penalty(n, alpha)
        if score > best[0]:
            best = (score, tokens)

    while live and len(live[0][0]) < max_len:
        length = len(live[0][0])
        ys = torch.tensor([tokens for tokens, _ in live], dtype=torch.long)
        mask = torch.ones(length, length, dtype=torch.bool).tril()
        hidden = model.decode(memory.repeat(len(live), 1, 1), src_mask, ys, mask)
        out = model.generator(hidden[:, -1])
        log_probs = torch.log_softmax(out, dim=-1) if normalise else out
        extensions = []
        for (tokens, total), row in zip(live, log_probs.tolist(), strict=True):
            for token, lp in enumerate(row):
                if per_token_penalty:
                    lp = lp / _penalty(length, alpha)
                extensions.append((tokens + [token], total + lp if accumulate else lp, False))
        extensions += [(tokens, total, True) for tokens, total in parked]
        kept = sorted(extensions, key=lambda e: e[1], reverse=True)[:beam_size]
        live, parked = [], []
        for tokens, total, was_parked in kept:
            if was_parked:
                parked.append((tokens, total))
            elif eos_ends and tokens[-1] == eos_id:
                if remember_finished:
                    finish(tokens, total)
                if finished_take_slots:
                    parked.append((tokens, total))
            else:
                live.append((tokens, total))
    for tokens, total in live:
        finish(tokens, total)
    return best


def _row_by_row(model, src, src_mask, max_len, bos_id, eos_id, pad_id, beam_size=4,
                length_penalty=0.6, **mistakes):
    if beam_size < 1:
        raise ValueError(f"beam_size must be positive, got beam_size={beam_size}")
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        rows = []
        for b in range(src.size(0)):
            mask = None if src_mask is None else src_mask[b:b + 1]
            _, tokens = _one_row(model, memory[b:b + 1], mask, max_len, bos_id, eos_id,
                                 beam_size, length_penalty, **mistakes)
            if eos_id in tokens[1:]:  # anything generated after the first EOS becomes padding
                end = tokens.index(eos_id, 1) + 1
                tokens = tokens[:end] + [pad_id] * (len(tokens) - end)
            rows.append(tokens)
    width = max(map(len, rows))
    out = [tokens + [pad_id] * (width - len(tokens)) for tokens in rows]
    return torch.tensor(out, dtype=src.dtype, device=src.device)


@wrong("7.1", "beam_search", "scores not accumulated: only the last token's log-probability",
       mistake="7.1/scores-not-accumulated")
def last_token_only(*args, **kwargs):
    return _row_by_row(*args, **kwargs, accumulate=False)


@wrong("7.1", "beam_search", "no log_softmax: the generator's logits added up",
       mistake="7.1/no-log-softmax")
def logits_added_up(*args, **kwargs):
    return _row_by_row(*args, **kwargs, normalise=False)


@wrong("7.1", "beam_search", "the length penalty applied to every token, at its position",
       mistake="7.1/penalty-per-token")
def penalty_per_token(*args, **kwargs):
    return _row_by_row(*args, **kwargs, per_token_penalty=True)


@wrong("7.1", "beam_search", "finished hypotheses dropped: the answer is a live one at the end",
       mistake="7.1/finished-dropped")
def finished_dropped(*args, **kwargs):
    return _row_by_row(*args, **kwargs, remember_finished=False)


@wrong("7.1", "beam_search", "finished hypotheses extended further: EOS ends nothing",
       mistake="7.1/finished-extended")
def finished_extended(*args, **kwargs):
    return _row_by_row(*args, **kwargs, eos_ends=False)


@wrong("7.1", "beam_search", "finished hypotheses keep their place in the beam (fewer live)",
       mistake="7.1/finished-keep-places")
def finished_take_slots(*args, **kwargs):
    return _row_by_row(*args, **kwargs, finished_take_slots=True)


@wrong("7.1", "beam_search", "n counts BOS in the length penalty",
       mistake="7.1/penalty-counts-bos")
def penalty_counts_bos(*args, **kwargs):
    return _row_by_row(*args, **kwargs, n_offset=1)


@wrong("7.1", "beam_search", "the length penalty ignored",
       mistake="7.1/length-penalty-ignored")
def no_length_penalty(model, src, src_mask, max_len, bos_id, eos_id, pad_id, beam_size=4,
                      length_penalty=0.6):
    return _row_by_row(model, src, src_mask, max_len, bos_id, eos_id, pad_id, beam_size, 0.0)


@right("7.1", "beam_search", "one row at a time with Python lists, every live hypothesis "
       "decoded together")
def one_row_at_a_time(*args, **kwargs):
    return _row_by_row(*args, **kwargs)


# ------------------------------------------------------------------ 7.1, batched


@torch.no_grad()
def _batched(model, src, src_mask, max_len, bos_id, eos_id, pad_id, beam_size=4,
             length_penalty=0.6, *, across_rows=False, tile=False, all_slots_live=False,
             best_in_place=False):
    """The reference's vectorisation, with one of its details changed."""
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got beam_size={beam_size}")
    batch, k = src.size(0), beam_size
    rows = torch.arange(batch)
    memory = model.encode(src, src_mask)
    if tile:  # hypothesis j of row b at row j * B + b, but the reference order b * k + j below
        memory, src_mask = memory.repeat(k, 1, 1), src_mask.repeat(k, 1, 1, 1)
    else:
        memory, src_mask = memory.repeat_interleave(k, 0), src_mask.repeat_interleave(k, 0)
    ys = torch.full((batch * k, 1), bos_id, dtype=src.dtype)
    # with best_in_place, the scores follow the model's dtype (float32 + float32 stays float32)
    scores = torch.zeros(batch, k, dtype=None if best_in_place else torch.float64)
    if not all_slots_live:
        scores[:, 1:] = -math.inf
    best_score = torch.full((batch,), -math.inf, dtype=torch.float64)
    best = [[bos_id] for _ in range(batch)]

    def keep_best(final):
        if best_in_place:  # float64 best scores, overwritten in place where a row improves
            step_best, which = final.max(dim=-1)
            better = step_best > best_score
            best_score[better] = step_best[better]
            for b in better.nonzero().flatten().tolist():
                best[b] = ys[b * k + int(which[b])].tolist()
            return
        for b in range(batch):
            j = int(final[b].argmax())
            if final[b, j] > best_score[b]:
                best_score[b] = final[b, j]
                best[b] = ys[b * k + j].tolist()

    while ys.size(1) < max_len and scores.isfinite().any():
        length = ys.size(1)
        causal = torch.ones(length, length, dtype=torch.bool).tril()
        log_probs = torch.log_softmax(
            model.generator(model.decode(memory, src_mask, ys, causal)[:, -1]), -1)
        vocab = log_probs.size(-1)
        extensions = scores.view(-1, 1) + log_probs
        if across_rows:  # the B * k best of the whole batch, wherever they come from
            scores, index = extensions.view(-1).topk(batch * k)
            parent, token = index // vocab, index % vocab
            scores = scores.view(batch, k)
        else:
            scores, index = extensions.view(batch, -1).topk(k, dim=-1)
            parent = (rows[:, None] * k + index // vocab).view(-1)
            token = (index % vocab).view(-1)
        ys = torch.cat([ys[parent], token[:, None].to(ys.dtype)], 1)
        ended = (token.view(batch, k) == eos_id) & scores.isfinite()
        keep_best(torch.where(ended, scores / _penalty(length, length_penalty), -math.inf))
        scores = scores.masked_fill(ended, -math.inf)
    keep_best(scores / _penalty(ys.size(1) - 1, length_penalty))
    width = max(map(len, best))
    return torch.tensor([r + [pad_id] * (width - len(r)) for r in best], dtype=src.dtype)


@wrong("7.1", "beam_search", "top-k over the whole batch: rows take each other's places")
def topk_across_rows(*args, **kwargs):
    return _batched(*args, **kwargs, across_rows=True)


@wrong("7.1", "beam_search", "memory repeated with repeat, not repeat_interleave")
def memory_tiled(*args, **kwargs):
    return _batched(*args, **kwargs, tile=True)


@wrong("7.1", "beam_search", "every slot live at the start: the beam fills with copies",
       mistake="7.1/beam-of-bos-copies")
def copies_of_bos(*args, **kwargs):
    return _batched(*args, **kwargs, all_slots_live=True)


@wrong("7.1", "beam_search", "the best scores a float64 tensor overwritten in place: a float32 "
       "model's scores cannot be written into it", mistake="7.1/scores-in-another-dtype")
def float64_best_in_place(*args, **kwargs):
    return _batched(*args, **kwargs, best_in_place=True)


@right("7.1", "beam_search", "the reference's vectorisation with per-row Python bookkeeping")
def batched_with_lists(*args, **kwargs):
    return _batched(*args, **kwargs)


@right("7.1", "beam_search", "a ragged batch: only live hypotheses decoded, ranked per row by "
       "sorting")
@torch.no_grad()
def ragged(model, src, src_mask, max_len, bos_id, eos_id, pad_id, beam_size=4,
           length_penalty=0.6):
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    memory = model.encode(src, src_mask)
    owner = torch.arange(src.size(0))  # the row of each live hypothesis
    ys = src.new_full((src.size(0), 1), bos_id)
    sums = torch.zeros(src.size(0), dtype=torch.float64)
    best = {b: (-math.inf, [bos_id]) for b in range(src.size(0))}

    def offer(b, tokens, score):
        if score > best[b][0]:
            best[b] = (score, tokens)

    while len(owner) and ys.size(1) < max_len:
        length = ys.size(1)
        mask = None if src_mask is None else src_mask[owner]
        hidden = model.decode(memory[owner], mask, ys,
                              torch.ones(length, length, dtype=torch.bool).tril())
        log_probs = torch.log_softmax(model.generator(hidden[:, -1]).double(), -1)
        vocab = log_probs.size(-1)
        candidates = (sums[:, None] + log_probs).flatten()
        candidate_owner = owner.repeat_interleave(vocab)
        order = torch.argsort(candidates, descending=True, stable=True)
        order = order[torch.argsort(candidate_owner[order], stable=True)]  # by row, then score
        owners = candidate_owner[order]
        rank = torch.arange(len(order)) - torch.searchsorted(owners, owners)
        keep = order[rank < beam_size]
        token = keep % vocab
        ys = torch.cat([ys[keep // vocab], token[:, None].to(ys.dtype)], 1)
        sums, owner = candidates[keep], candidate_owner[keep]
        ended = token == eos_id
        for i in ended.nonzero().flatten().tolist():
            offer(int(owner[i]), ys[i].tolist(), float(sums[i]) / _penalty(length, length_penalty))
        ys, sums, owner = ys[~ended], sums[~ended], owner[~ended]
    for i in range(len(owner)):
        offer(int(owner[i]), ys[i].tolist(), float(sums[i]) / _penalty(ys.size(1) - 1,
                                                                       length_penalty))
    width = max(len(tokens) for _, tokens in best.values())
    return torch.tensor([best[b][1] + [pad_id] * (width - len(best[b][1]))
                         for b in range(src.size(0))], dtype=src.dtype, device=src.device)
