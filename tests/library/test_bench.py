"""The benchmark runs and reports what it promises (no timing is asserted: only that it runs)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from annotated_transformer.bench.command import main
from annotated_transformer.bench.contenders import CONTENDERS, REFERENCE, TorchTransformer, Trainer
from annotated_transformer.bench.goals import goals as check_goals
from annotated_transformer.bench.gpu import cuda_section
from annotated_transformer.bench.profiling import PHASES
from annotated_transformer.bench.report import gpu_lines
from annotated_transformer.bench.shapes import Shape, model_flops
from annotated_transformer.data.vocab import PAD

SMALL = Shape("small", d_model=32, num_heads=4, num_layers=2, d_ff=64, vocab=17, batch=3,
              length=6)


@pytest.mark.parametrize("contender", CONTENDERS)
def test_the_flop_count_is_what_pytorch_counts(contender):
    """Our count of matrix-product FLOPs equals PyTorch's own counter on every contender."""
    trainer = Trainer(contender, SMALL, torch.device("cpu"))
    batch = REFERENCE.make_batch(trainer.src, trainer.tgt, PAD)
    with FlopCounterMode(display=False) as counter:
        logits = trainer.model(batch.src, batch.tgt_input, batch.src_mask, batch.tgt_mask)
        trainer.loss_fn(logits.reshape(-1, SMALL.vocab), batch.tgt_labels.reshape(-1)).backward()
    assert counter.get_total_flops() == model_flops(SMALL)


@pytest.mark.parametrize("contender", ["fast", "torch"])
def test_the_recipe_batches_flop_count_is_what_pytorch_counts(contender, monkeypatch):
    """On padded batches, the count of each contender's own products equals PyTorch's:
    nn.Transformer's on every padded position, the fast parts' on the scored ones."""
    from annotated_transformer.bench import recipe_shape

    monkeypatch.setattr(recipe_shape, "SHAPE", SMALL)
    lengths = [([3, 2, 4], [4, 3, 6])]
    trainer = Trainer(contender, SMALL, torch.device("cpu"), lengths=lengths)
    model, inputs = trainer.model, trainer.inputs
    with FlopCounterMode(display=False) as counter:
        if contender == "fast":  # the generator as a product of its own: the counter
            # does not see the in-place addmm_ of the chunked loss's weight gradient
            hidden, labels = trainer.loss_fn.scored_features(model, inputs)
            loss = trainer.loss_fn(model.generator(hidden), labels)
            assert hidden.size(0) == 3 + 2 + 5  # the scored positions only
        else:
            loss = model.loss(inputs, trainer.loss_fn)
        loss.backward()
    assert counter.get_total_flops() == recipe_shape.contender_flops(lengths)[contender]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
def test_nn_transformer_gets_the_same_masks_and_decodes():
    """The ``nn.Transformer`` contender reads the course's masks (True = allowed): a padded
    source key changes nothing it may not see, and greedy decoding runs it."""
    torch.manual_seed(0)
    model = TorchTransformer(SMALL.config(dropout=0.0)).eval()
    parts = REFERENCE
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
@pytest.mark.alone  # measures speed
@pytest.mark.timeout(600)
def test_quick_run_writes_json_a_plot_and_tables(tmp_path):
    path, image, table = tmp_path / "bench.json", tmp_path / "bench.png", tmp_path / "bench.md"
    assert main(["--quick", "--threads", "1", "--json", str(path), "--plot",
                 str(image), "--markdown", str(table)]) == 0
    report = json.loads(path.read_text())
    assert {"environment", "quick", "rounds", "ceiling", "throughput", "attention",
            "copy_task", "cuda", "goals", "seconds"} <= set(report)
    assert report["quick"] is True and report["ceiling"]["gflops"] > 0
    assert set(report["throughput"]) == {"copy", "medium", "base", "multi30k-cpu"}
    compiled = {f"{name}+compile" for name in CONTENDERS}
    for shape, entry in report["throughput"].items():
        expected = set(CONTENDERS) | (compiled if shape == "copy" else set())
        assert set(entry["contenders"]) == expected
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
    text = table.read_text()
    assert "| copy | fast parts |" in text and "| copy | reference parts, compiled |" in text
    assert "| copy | nn.Transformer, compiled |" in text
    goals = report["goals"]
    for name in ("train_compile_every_task", "copy_task_100%_within_5s_cpu",
                 "fast_at_least_2x_copy_cpu", "reference_compiled_at_least_1x_cpu",
                 "reference_compiled_at_least_1x_gpu", "fast_compiled_bf16_mfu_at_least_40%_gpu",
                 "dates_recipe_within_10s_gpu"):
        assert name in goals, f"no line for the goal {name}"
        assert f"| {name.replace('_', ' ')} |" in text
    if not torch.cuda.is_available():
        assert report["cuda"] is None
        assert goals["dates_recipe_within_10s_gpu"]["met"] is None
        assert "| fast parts, compiled | not measured (no GPU) |" in text
        assert "| dates recipe within 10s gpu | - | not measured (no GPU) |" in text
    assert goals["reference_compiled_at_least_1x_cpu"]["value"] == pytest.approx(
        report["throughput"]["copy"]["contenders"]["reference+compile"]["ratio_to_torch"])


@pytest.mark.parametrize("argv, message", [(["--rounds", "0"], "--rounds"),
                                           (["--max-tokens", "5"], "--max-tokens")])
def test_bad_arguments_are_refused(capsys, argv, message):
    with pytest.raises(SystemExit):
        main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.alone  # measures speed
@pytest.mark.timeout(600)
def test_the_gpu_section_runs_and_reports(capsys):
    """The GPU section's code, run on the CPU in fp32 (a CPU computes bf16 slowly): the
    paper-scale step's six contenders and the dates recipe, and their Markdown."""
    cuda = cuda_section(torch.device("cpu"), quick=True, rounds=1, log=lambda _: None,
                        precision="fp32")
    names = set(CONTENDERS) | {f"{name}+compile" for name in CONTENDERS}
    assert set(cuda["contenders"]) == names
    assert all(stats["mfu"] > 0 and stats["median"] > 0 for stats in cuda["contenders"].values())
    assert set(cuda["dates"]) == {"eager"} and 0 <= cuda["dates"]["eager"]["exact_match"] <= 1
    lines = "\n".join(gpu_lines(cuda, {name: name for name in names}))
    assert "not measured" not in lines and "| fast+compile |" in lines and "| eager |" in lines
    report = {"throughput": {}, "environment": {"device": "cuda"}, "copy_task": {},
              "cuda": cuda}
    goals = check_goals(report)
    assert goals["fast_compiled_bf16_mfu_at_least_40%_gpu"]["value"] == pytest.approx(
        cuda["contenders"]["fast+compile"]["mfu"])
    assert goals["reference_compiled_at_least_1x_gpu"]["value"] == pytest.approx(
        cuda["contenders"]["reference+compile"]["ratio_to_torch"])
    assert goals["copy_task_100%_within_5s_cpu"]["met"] is None, "a GPU run measures no CPU goal"


def test_the_profile_times_every_phase_of_the_step(tmp_path, capsys):
    path = tmp_path / "profile.json"
    assert main(["--profile", "--quick", "--threads", "1", "--json", str(path)]) == 0
    profiles = json.loads(path.read_text())
    assert [p["parts"] for p in profiles] == ["solutions", "fast"]
    for p in profiles:
        assert list(p["phases_ms"]) == list(PHASES)
        assert all(ms > 0 for ms in p["phases_ms"].values())
        assert sum(p["phases_ms"].values()) <= 1.05 * p["step_ms"], "phases overlap"
        assert any(op["name"] in ("aten::mm", "aten::addmm") for op in p["operators"])
    assert "forward and loss" in capsys.readouterr().out


def test_the_decoding_section_times_both_ways_and_compares_them(tmp_path, capsys):
    """Beam search with and without the cache on the committed translation checkpoint:
    the same translations, both timed (no figure is asserted)."""
    pytest.importorskip("tokenizers")
    from pathlib import Path

    from annotated_transformer.bench.decoding import decoding

    chapters = Path(__file__).resolve().parents[2] / "chapters"
    result = decoding(chapters / "checkpoints" / "tiny-de-en.pt",
                      str(chapters / "data" / "tiny-de-en"), size=8)
    assert result["identical"] is True and result["sentences"] == 8
    assert result["cached"]["seconds"] > 0 and result["recomputed"]["seconds"] > 0
    assert "identical translations" in capsys.readouterr().out
    goals = check_goals({"throughput": {}, "environment": {"device": "cpu"},
                         "decoding": result})
    assert goals["beam4_test2016_within_20s_cpu"]["value"] == result["cached"]["seconds"]
    status = main(["--decoding", str(tmp_path / "none.pt")])
    assert status == 2 and "no such checkpoint" in capsys.readouterr().err


def test_the_recipe_shape_section_reports_ratio_parts_and_ceiling(tmp_path, capsys,
                                                                   monkeypatch):
    """``--recipe-shape`` (on a small shape here): per thread count the ceiling, each
    contender's ratio to nn.Transformer, GFLOP/s, the parts of its step, and the load."""
    from annotated_transformer.bench import recipe_shape

    monkeypatch.setattr(recipe_shape, "SHAPE", SMALL)
    lengths = [([3, 2, 4], [4, 3, 6]), ([5, 1], [2, 3])]  # padded on both sides
    monkeypatch.setattr(recipe_shape, "load_batches", lambda: lengths)
    path = tmp_path / "recipe.json"
    assert main(["--recipe-shape", "--quick", "--threads", "1", "--json", str(path)]) == 0
    result = json.loads(path.read_text())
    entry = result["threads"]["1"]
    assert entry["ceiling_gflops"] > 0 and set(entry["contenders"]) == {"fast", "torch"}
    assert entry["contenders"]["torch"]["ratio_to_torch"] == 1.0
    for stats in entry["contenders"].values():
        assert list(stats["parts_ms"]) == list(recipe_shape.PARTS)
        assert stats["gflops"] > 0 and 0 < stats["utilisation"]
    assert len(result["load_before"]) == 3
    floor = 1000 * result["model_flops_per_step"] / (entry["ceiling_gflops"] * 1e9)
    assert entry["floor_ms"] == pytest.approx(floor)
    scored = (3 + 2 + 5 + 1 + 2) / 2  # the labels a step: the targets less BOS
    assert result["batches"]["target_scored"] == scored
    assert result["batches"]["target_padding"] == pytest.approx(1 - 2 * scored / (3 * 5 + 2 * 2))
    flops = result["flops_per_step"]  # nn.Transformer computes on the padding too
    assert flops["torch"] > flops["fast"] == result["model_flops_per_step"]
    torch_best_ms = 1000 * scored / entry["contenders"]["torch"]["max"]
    assert entry["bound_ratio"] == pytest.approx(torch_best_ms / floor)
    out = capsys.readouterr().out
    assert "nothing computing them passes" in out
    assert "x nn.Transformer" in out and "load average" in out and "goal: fast >= 1.5x" in out
    assert "scored target tokens padded to" in out


def test_the_committed_recipe_batches_are_the_recipes():
    """The bench's recipe shape is cut as the recipe cuts its batches: the committed file
    was written with the recipe's token budget and vocabulary (rewrite it with
    ``recipe_batches.save(DIR)`` when the recipe changes), and no batch passes the budget."""
    from annotated_transformer.bench import recipe_batches
    from annotated_transformer.recipes import CPU_TRANSLATION

    saved = json.loads(recipe_batches.FILE.read_text())
    assert (saved["max_tokens"], saved["vocab_size"]) == (
        CPU_TRANSLATION.train.max_tokens, CPU_TRANSLATION.vocab_size)
    for src, tgt in recipe_batches.load():
        assert len(src) * max(src) <= saved["max_tokens"]
        assert len(tgt) * max(tgt) <= saved["max_tokens"]
