"""The benchmark runs and reports what it promises (no timing is asserted: only that it runs)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from annotated_transformer import bench
from annotated_transformer.data.vocab import PAD

SMALL = bench.Shape("small", d_model=32, num_heads=4, num_layers=2, d_ff=64, vocab=17,
                    batch=3, length=6)


@pytest.mark.parametrize("contender", bench.CONTENDERS)
def test_the_flop_count_is_what_pytorch_counts(contender):
    """Our count of matrix-product FLOPs equals PyTorch's own counter on every contender."""
    trainer = bench.Trainer(contender, SMALL, torch.device("cpu"))
    batch = bench.REFERENCE.make_batch(trainer.src, trainer.tgt, PAD)
    with FlopCounterMode(display=False) as counter:
        logits = trainer.model(batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask)
        trainer.loss_fn(logits.reshape(-1, SMALL.vocab), batch.tgt_labels.reshape(-1)).backward()
    assert counter.get_total_flops() == bench.model_flops(SMALL)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nn_transformer_gets_the_same_masks_and_decodes():
    """The ``nn.Transformer`` contender reads the course's masks (True = allowed): a padded
    source key changes nothing it may not see, and greedy decoding runs it."""
    torch.manual_seed(0)
    model = bench.TorchTransformer(SMALL.config(dropout=0.0)).eval()
    parts = bench.REFERENCE
    src = torch.randint(3, 17, (2, 6))
    tgt = torch.randint(3, 17, (2, 5))
    src_mask, tgt_mask = parts.padding_mask(src, PAD), parts.target_mask(tgt, PAD)
    out = model(src, tgt, src_mask, tgt_mask)
    changed = tgt.clone()
    changed[:, -1] = 3 if tgt[0, -1] != 3 else 4
    assert torch.allclose(model(src, changed, src_mask, parts.target_mask(changed, PAD))[:, :-1],
                          out[:, :-1], atol=1e-5), "a later target token changed an earlier output"
    decoded = parts.greedy_decode(model, src, src_mask, 7, 1, 2, PAD)
    assert decoded.shape[0] == 2 and decoded[:, 0].eq(1).all()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_quick_run_writes_json_a_plot_and_tables(tmp_path):
    path, image, table = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "bench.md"
    assert bench.main(["--quick", "--threads", "1", "--json", str(path), "--plot",
                       str(image), "--markdown", str(table)]) == 0
    report = json.loads(path.read_text())
    assert {"environment", "quick", "rounds", "ceiling", "throughput", "attention",
            "copy_task", "cuda", "goals", "seconds"} <= set(report)
    assert report["quick"] is True and report["ceiling"]["gflops"] > 0
    assert set(report["throughput"]) == {"copy", "medium", "base"}
    for entry in report["throughput"].values():
        assert set(entry["contenders"]) == set(bench.CONTENDERS)
        for stats in entry["contenders"].values():
            assert {"median", "min", "max", "spread", "ratio_to_torch", "utilisation",
                    "gflops", "step_ms"} <= set(stats)
            assert stats["median"] > 0
    for entry in report["attention"].values():
        assert set(entry) == {"reference", "fast_explicit", "fused"}
        assert all(stats["median"] > 0 for stats in entry.values())
    copy = report["copy_task"]
    assert "solutions" in copy["default"] and copy["default"]["solutions"]["runs"]
    assert {"reached", "final_exact_match", "curve"} <= set(copy["annotated_transformer"])
    assert "copy_default_recipe_100%_within_20s" in report["goals"]
    assert image.stat().st_size > 10_000
    assert "| copy | fast parts |" in table.read_text()


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err
