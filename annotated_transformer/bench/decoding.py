"""The decoding section: a translation checkpoint's beam search over a whole test split,
recomputing every prefix at each step and with each layer's keys and values kept
(:mod:`~annotated_transformer.incremental`), timed, and the two outputs compared."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def decoding(path: Path, dataset: str | None = None, split: str = "test", beam: int = 4,
             size: int | None = None, log=print) -> dict:
    """Wall and CPU seconds of decoding the first ``size`` sentences (default all) of
    ``split`` with the checkpoint at ``path`` (its corpus, or ``dataset``), without and
    with the cache; ``identical``: whether the two give the same translations."""
    from annotated_transformer import checkpoint
    from annotated_transformer.metrics import (
        Decoding,
        corpus_scores,
        length_penalty_of,
        translate_texts,
    )

    state = checkpoint.load(path)
    task = checkpoint.build_task(state, dataset)
    model = checkpoint.build_model(state)
    pairs = task.split(split)[:size]
    sources = [source for source, _ in pairs]
    result = {"checkpoint": str(path), "split": split, "sentences": len(pairs), "beam": beam,
              "threads": torch.get_num_threads()}
    outputs = {}
    for name, cache in (("recomputed", False), ("cached", True)):
        wall, cpu = time.perf_counter(), time.process_time()
        decoding = Decoding(beam_size=beam, alpha=length_penalty_of(state), cache=cache)
        outputs[name] = translate_texts(model, task, sources, decoding)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        result[name] = {"seconds": wall, "cpu_seconds": cpu,
                        "sentences_per_second": len(pairs) / wall}
        log(f"  beam {beam}, {len(pairs)} {split} sentences, {name:10s}: {wall:7.1f} s "
            f"({cpu:.1f} s of CPU)")
    result["identical"] = outputs["recomputed"] == outputs["cached"]
    result["speedup"] = result["recomputed"]["seconds"] / result["cached"]["seconds"]
    result["bleu"] = corpus_scores(outputs["cached"], [t for _, t in pairs])["bleu"]
    log(f"  the cache: {result['speedup']:.1f}x faster, "
        f"{'identical' if result['identical'] else 'DIFFERENT'} translations, "
        f"BLEU {result['bleu']:.2f}")
    return result
