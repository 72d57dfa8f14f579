"""A model sized on the command line: --layers, --d-model, --heads, --d-ff and --dropout
over any --model, checked with a clear error, and recorded in the checkpoint."""

from __future__ import annotations

import pytest
import torch

from annotated_transformer import checkpoint, cli
from annotated_transformer.model import count_parameters
from annotated_transformer.recipes import CPU_TRANSLATION, MODEL_SIZES, RECIPES

TINY = ["--steps", "3", "--batch-size", "8", "--eval-size", "4", "--device", "cpu",
        "--no-progress", "--threads", "1"]


def run(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_sizes_override_the_model_and_are_recorded(capsys, tmp_path):
    status, out, err = run(capsys, "train", "--task", "copy", "--model", "base", "--layers",
                           1, "--d-model", 32, "--heads", 2, "--d-ff", 48, "--dropout", 0.25,
                           "--out", tmp_path, *TINY)
    assert status == 0, err
    assert "1 layers, d_model 32, 2 heads, d_ff 48, dropout 0.25" in out
    state = checkpoint.load(tmp_path / checkpoint.FILE_NAME)
    config = state["model_config"]
    assert (config["num_layers"], config["d_model"], config["num_heads"], config["d_ff"],
            config["dropout"]) == (1, 32, 2, 48, 0.25)
    assert config["norm_first"] is False  # the rest of --model base is kept
    model = checkpoint.build_model(state)
    d, v, ff = 32, config["src_vocab_size"], 48
    layer = 4 * (d * d + d) + (d * ff + ff + ff * d + d) + 2 * 2 * d  # encoder layer
    decoder = layer + 4 * (d * d + d) + 2 * d
    assert count_parameters(model) == layer + decoder + v * d + v
    # Resuming with another size is refused by the checkpoint's recorded config.
    status, _, err = run(capsys, "train", "--task", "copy", "--model", "base", "--layers", 2,
                         "--d-model", 32, "--heads", 2, "--d-ff", 48, "--dropout", 0.25,
                         "--resume", "--out", tmp_path, *TINY)
    assert status == 2 and "config differs in num_layers" in err


@pytest.mark.parametrize("argv, message", [
    (["--layers", "0"], "--layers must be at least 1, got 0"),
    (["--d-model", "-8"], "--d-model must be at least 1, got -8"),
    (["--heads", "0"], "--heads must be at least 1, got 0"),
    (["--d-ff", "0"], "--d-ff must be at least 1, got 0"),
    (["--dropout", "1"], r"--dropout must be in \[0, 1\), got 1.0"),
    (["--dropout", "-0.1"], r"--dropout must be in \[0, 1\), got -0.1"),
    (["--heads", "3"], "d_model=64 is not divisible by num_heads=3"),  # small's 64
    (["--model", "cpu", "--d-model", "250"], "d_model=250 is not divisible by num_heads=4"),
])
def test_bad_sizes_exit_2_naming_the_flag(capsys, tmp_path, argv, message):
    status, _, err = run(capsys, "train", "--task", "copy", "--out", tmp_path, *argv, *TINY)
    assert status == 2 and err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert __import__("re").search(message, err), err
    assert not (tmp_path / checkpoint.FILE_NAME).exists()


def test_resized_keeps_the_run_and_checks_sizes():
    recipe = RECIPES["translation"].with_model("cpu")
    assert recipe is CPU_TRANSLATION and recipe.model == MODEL_SIZES["cpu"]
    wider = recipe.resized(d_model=512, num_heads=None)
    assert wider.model == {**MODEL_SIZES["cpu"], "d_model": 512}
    assert wider.train == recipe.train and wider.vocab_size == recipe.vocab_size
    with pytest.raises(ValueError, match="unknown model size"):
        recipe.resized(width=3)
    with pytest.raises(ValueError, match="not divisible"):
        recipe.resized(num_heads=5)
    # The CPU size on another task is only a model: that task's run is kept.
    assert RECIPES["copy"].with_model("cpu").train == RECIPES["copy"].train


def test_the_cpu_size_counts_as_expected():
    with torch.device("meta"):
        from annotated_transformer.model import EncoderDecoder, TransformerConfig
        model = EncoderDecoder(TransformerConfig.small(8000, **MODEL_SIZES["cpu"]))
    d, ff, n = 256, 1024, 3
    attention, feed_forward, norm = 4 * (d * d + d), d * ff + ff + ff * d + d, 2 * d
    layers = n * ((attention + feed_forward + 2 * norm) + (2 * attention + feed_forward
                                                           + 3 * norm))
    assert count_parameters(model) == layers + 2 * norm + 8000 * d + 8000  # final norms
