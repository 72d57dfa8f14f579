"""Corpus-level BLEU and chrF of detokenized translations, computed by ``sacrebleu``.

BLEU (Papineni et al. 2002) is the geometric mean of the 1- to 4-gram precisions of the
hypotheses against the references, over the whole corpus, times a brevity penalty;
chrF (Popović 2015) is an F-score of character n-grams. Both are computed by
``sacrebleu`` on detokenized text with its own standard tokenization, and reported with
its *signature*, which names every setting (tokenizer, smoothing, casing, version) so
that two scores can be compared (Post 2018).
"""

from __future__ import annotations

from annotated_transformer.data.optional import require


def corpus_scores(hypotheses: list[str], references: list[str]) -> dict:
    """``{"bleu", "bleu_signature", "chrf", "chrf_signature"}`` of ``hypotheses`` against
    one reference each (scores in percent, as ``sacrebleu`` gives them)."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses for {len(references)} references")
    sacrebleu = require("sacrebleu")
    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    return {"bleu": bleu_score.score, "bleu_signature": str(bleu.get_signature()),
            "chrf": chrf_score.score, "chrf_signature": str(chrf.get_signature())}
