"""The command line: train, evaluate, translate, attention; and every error exits 2 with a
message and no traceback."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from annotated_transformer import checkpoint, cli, machine

TINY = ["--steps", "12", "--batch-size", "16", "--eval-size", "20", "--device", "cpu",
        "--no-progress"]


def run(capsys, *argv):
    """``python -m annotated_transformer ARGV`` in-process: (status, stdout, stderr)."""
    status = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("copy")
    assert cli.main(["train", "--task", "copy", "--out", str(out), *TINY]) == 0
    return out


@pytest.fixture(scope="module")
def addition_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("addition")
    assert cli.main(["train", "--task", "addition", "--out", str(out), *TINY]) == 0
    return out


def test_train_writes_a_checkpoint_and_metrics(copy_run):
    assert (copy_run / "checkpoint.pt").is_file()
    lines = [json.loads(line) for line in (copy_run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in lines if "loss" in r]
    evals = [r for r in lines if "exact_match" in r]
    assert [r["step"] for r in steps] == [10, 12] and steps[0]["tokens_per_second"] > 0
    assert evals[-1]["step"] == 12 and 0 <= evals[-1]["exact_match"] <= 1
    assert not list(copy_run.glob("*.tmp")), "the atomic save leaves no temporary file"


def test_train_prints_and_records_the_machine_it_measured(tmp_path, capsys, monkeypatch):
    """The machine's matrix-product rate, measured at the start: on the start's lines, in
    the metrics' first line and in the checkpoint's history (a figure given here, so that
    nothing depends on this machine's speed)."""
    figure = {"gflops": 123.4, "size": 512, "dtype": "float32", "device": "cpu",
              "threads": 3, "by_size": {"512": 123.4, "1024": 99.0}}
    monkeypatch.setattr(machine, "measure", lambda device: dict(figure))
    status, out, _ = run(capsys, "train", "--task", "copy", "--out", tmp_path, *TINY)
    assert status == 0
    assert "this machine: 123 GFLOP/s of float32 matrix products (cpu, 3 threads)" in out, out
    first = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert first == {"step": 0, "machine": figure}
    assert checkpoint.load(tmp_path / "checkpoint.pt")["history"]["machine"] == figure


def test_evaluate_json_parses(capsys, copy_run):
    status, out, _ = run(capsys, "evaluate", "--checkpoint", copy_run / "checkpoint.pt",
                         "--json", "--size", "50", "--device", "cpu")
    result = json.loads(out)
    assert status == 0 and result["num_examples"] == 50 and result["task"] == "copy"
    assert 0 <= result["exact_match"] <= 1 and result["loss"] > 0


def test_evaluate_threads_sets_pytorchs_threads(capsys, copy_run):
    before = torch.get_num_threads()
    try:
        status, out, _ = run(capsys, "evaluate", "--checkpoint", copy_run / "checkpoint.pt",
                             "--json", "--size", "20", "--device", "cpu", "--threads", "1")
        assert status == 0 and json.loads(out)["num_examples"] == 20
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_translate_arguments_and_stdin(capsys, monkeypatch, copy_run):
    status, out, _ = run(capsys, "translate", "--checkpoint", copy_run / "checkpoint.pt",
                         "123", "4567", "--device", "cpu")
    assert status == 0 and len(out.splitlines()) == 2
    assert all(set(line) <= set("0123456789") for line in out.splitlines())
    monkeypatch.setattr(sys, "stdin", __import__("io").StringIO("12\n\n345\n"))
    status, out, _ = run(capsys, "translate", "--checkpoint", copy_run / "checkpoint.pt",
                         "--device", "cpu")
    assert status == 0 and len(out.splitlines()) == 2


def test_translate_decoder_only_greedy_and_sampled(capsys, addition_run):
    ckpt = addition_run / "checkpoint.pt"
    status, out, _ = run(capsys, "translate", "--checkpoint", ckpt, "12+34=", "--device", "cpu")
    assert status == 0 and len(out.splitlines()) == 1
    status, out, _ = run(capsys, "translate", "--checkpoint", ckpt, "12+34=", "--temperature",
                         "1.0", "--top-k", "3", "--device", "cpu")
    assert status == 0 and len(out.splitlines()) == 1


def test_attention_writes_an_image(capsys, tmp_path, copy_run):
    image = tmp_path / "maps.png"
    status, out, _ = run(capsys, "attention", "--checkpoint", copy_run / "checkpoint.pt",
                         "31415", "--out", image, "--device", "cpu")
    assert status == 0 and image.stat().st_size > 1000 and "wrote" in out


@pytest.fixture
def corrupted(tmp_path, copy_run):
    path = tmp_path / "broken.pt"
    path.write_bytes((copy_run / "checkpoint.pt").read_bytes()[:5000])
    return path


@pytest.fixture
def foreign(tmp_path):
    path = tmp_path / "foreign.pt"
    torch.save({"weights": torch.zeros(3)}, path)
    return path


def bad_tsv(tmp_path, content):
    path = tmp_path / "bad.tsv"
    path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize("case, make_argv, message", [
    ("unknown task", lambda t, c, b, f: ["train", "--task", "poetry", "--out", t],
     "unknown task 'poetry'"),
    ("tsv without data", lambda t, c, b, f: ["train", "--task", "tsv", "--out", t],
     "needs its data file"),
    ("missing tsv", lambda t, c, b, f: ["train", "--task", "tsv", "--data", t / "no.tsv",
                                        "--out", t], "no such file"),
    ("empty tsv", lambda t, c, b, f: ["train", "--task", "tsv", "--data", bad_tsv(t, ""),
                                      "--out", t], "no 'source<TAB>target' lines"),
    ("malformed tsv", lambda t, c, b, f: ["train", "--task", "tsv", "--data",
                                          bad_tsv(t, "a\tb\nc d\n"), "--out", t], "line 2"),
    ("data for a generated task", lambda t, c, b, f: ["train", "--task", "dates", "--data",
                                                      bad_tsv(t, "a\tb\n"), "--out", t],
     "--data is for --task tsv"),
    ("zero steps", lambda t, c, b, f: ["train", "--task", "copy", "--steps", "0", "--out", t],
     "--steps must be at least 1"),
    ("negative lr factor", lambda t, c, b, f: ["train", "--task", "copy", "--lr-factor", "-1",
                                               "--out", t], "--lr-factor must be positive"),
    ("resume without checkpoint", lambda t, c, b, f: ["train", "--task", "copy", "--resume",
                                                      "--out", t / "none"], "does not exist"),
    ("resume another schedule", lambda t, c, b, f: ["train", "--task", "copy", "--resume",
                                                    "--out", c, "--lr-factor", "0.5", *TINY],
     r"another learning-rate schedule \(linear decay, warmup 100, factor 0.3, 12 steps\)"),
    ("resume another config", lambda t, c, b, f: ["train", "--task", "reverse", "--resume",
                                                  "--out", c, *TINY],
     "config differs in num_layers"),
    ("bad parts", lambda t, c, b, f: ["train", "--task", "copy", "--parts", "nowhere",
                                      "--out", t], "--parts"),
    ("bad device", lambda t, c, b, f: ["train", "--task", "copy", "--device", "toaster",
                                       "--out", t], "--device 'toaster'"),
    ("missing checkpoint", lambda t, c, b, f: ["evaluate", "--checkpoint", t / "none.pt"],
     "no such checkpoint"),
    ("corrupted checkpoint", lambda t, c, b, f: ["evaluate", "--checkpoint", b],
     "not a readable checkpoint"),
    ("foreign checkpoint", lambda t, c, b, f: ["evaluate", "--checkpoint", f],
     "not a checkpoint of this package"),
    ("outside the vocabulary", lambda t, c, b, f: ["translate", "--checkpoint",
                                                   c / "checkpoint.pt", "12x4"],
     "outside the vocabulary: 'x'"),
    ("threads zero", lambda t, c, b, f: ["evaluate", "--checkpoint", c / "checkpoint.pt",
                                         "--threads", "0"], "--threads must be at least 1"),
    ("beam zero", lambda t, c, b, f: ["translate", "--checkpoint", c / "checkpoint.pt",
                                      "--beam", "0", "12"], "--beam must be at least 1"),
    ("sampling an encoder-decoder", lambda t, c, b, f: ["translate", "--checkpoint",
                                                        c / "checkpoint.pt", "--temperature",
                                                        "1", "12"], "decoder-only"),
])
def test_errors_exit_2_with_a_message(capsys, tmp_path, copy_run, corrupted, foreign, case,
                                      make_argv, message):
    status, out, err = run(capsys, *make_argv(tmp_path, copy_run, corrupted, foreign))
    assert status == 2, f"{case}: exit status {status}, stderr {err!r}"
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1, err
    assert __import__("re").search(message, err), f"{case}: {err!r} lacks {message!r}"


def test_training_unfinished_parts_names_the_stub_and_the_way_on(capsys, tmp_path):
    from annotated_transformer.course.authoring.stubs import write_stubs

    write_stubs(tmp_path / "stubs")
    status, _, err = run(capsys, "train", "--task", "copy", "--parts", tmp_path / "stubs",
                         "--out", tmp_path / "run", *TINY)
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: Exercise 5.8: EncoderDecoder")  # the model, built first
    assert "grade --exercise 5.8" in err and "other --parts" in err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_training_parts_with_a_syntax_error_is_one_line(capsys, tmp_path):
    """A chapter file that does not parse: one error line naming the file, the line and its
    text, no traceback."""
    from annotated_transformer.course.authoring.stubs import SOLUTIONS_DIR

    parts = tmp_path / "parts"
    parts.mkdir()
    for path in SOLUTIONS_DIR.glob("ch0*.py"):
        (parts / path.name).write_text(path.read_text())
    broken = parts / "ch04_masking.py"
    broken.write_text(broken.read_text() + "\ndef broken(:\n    pass\n")
    line = len(broken.read_text().splitlines()) - 1
    status, _, err = run(capsys, "train", "--task", "copy", "--parts", parts,
                         "--out", tmp_path / "run", *TINY)
    assert status == 1 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: {broken}, line {line}: this line is not valid Python")
    assert "(`def broken(:`)" in err and "Traceback" not in err


def test_the_real_entry_point_exits_2_without_a_traceback(tmp_path):
    result = subprocess.run([sys.executable, "-m", "annotated_transformer", "evaluate",
                             "--checkpoint", str(tmp_path / "none.pt")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "no such checkpoint" in result.stderr
    usage = subprocess.run([sys.executable, "-m", "annotated_transformer", "train"],
                           capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "--task" in usage.stderr


def test_export_keeps_what_evaluation_needs(capsys, tmp_path, copy_run):
    small = tmp_path / "copy.pt"
    status, _, _ = run(capsys, "export", "--checkpoint", copy_run / "checkpoint.pt", "--out",
                       small)
    assert status == 0 and small.stat().st_size < (copy_run / "checkpoint.pt").stat().st_size / 2
    status, out, _ = run(capsys, "evaluate", "--checkpoint", small, "--json", "--size", "20",
                         "--device", "cpu")
    assert status == 0 and json.loads(out)["num_examples"] == 20
    resume_dir = tmp_path / "resume"
    resume_dir.mkdir()
    (resume_dir / "checkpoint.pt").write_bytes(small.read_bytes())
    status, _, err = run(capsys, "train", "--task", "copy", "--resume", "--out", resume_dir, *TINY)
    assert status == 2 and "exported without its optimizer" in err


@pytest.mark.parametrize("weights", ["float16", "int8"])
def test_export_smaller_weights_rebuild_a_float32_model(capsys, tmp_path, copy_run, weights):
    from annotated_transformer import checkpoint

    full, small = tmp_path / "full.pt", tmp_path / f"{weights}.pt"
    assert run(capsys, "export", "--checkpoint", copy_run / "checkpoint.pt", "--out", full)[0] == 0
    assert run(capsys, "export", "--checkpoint", copy_run / "checkpoint.pt", "--out", small,
               "--weights", weights)[0] == 0
    state, original = checkpoint.load(small), checkpoint.load(full)["model"]
    model = checkpoint.build_model(state)
    parameters = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    assert parameters and parameters < set(state["model"])  # the positional table is a buffer
    tied = {state["model"][name].data_ptr() for name in ("src_embed.tokens.embedding.weight",
                                                         "generator.weight")}
    assert len(tied) == 1, "the tied matrix is stored once"
    for name, tensor in model.state_dict().items():
        stored, before = state["model"][name], original[name]
        assert tensor.dtype == before.dtype  # float32 again
        if name not in parameters:
            assert torch.equal(stored, before)
        elif weights == "int8" and before.dim() == 2:
            assert stored.dtype == torch.int8 and stored.abs().max() <= 127
            scale = before.abs().amax(dim=1, keepdim=True) / 127
            assert ((tensor - before).abs() <= scale / 2 + 1e-7).all()
        else:
            assert stored.dtype == torch.float16
            torch.testing.assert_close(tensor, before.half().float(), rtol=0, atol=0)
    status, out, _ = run(capsys, "evaluate", "--checkpoint", small, "--json", "--size", "20",
                         "--device", "cpu")
    assert status == 0 and json.loads(out)["num_examples"] == 20
    status, _, err = run(capsys, "average", "--out", tmp_path / "avg.pt", small, full)
    assert status == 2 and "average the training checkpoints" in err


@pytest.mark.parametrize("task", ["dates", "addition"])
def test_bf16_autocast_trains_on_the_cpu(capsys, tmp_path, task):
    """The same code path as on a GPU with --precision bf16 (autocast, masks in bf16)."""
    status, out, err = run(capsys, "train", "--task", task, "--precision", "bf16", "--out",
                           tmp_path, "--steps", "3", "--batch-size", "8", "--eval-size", "8",
                           "--device", "cpu", "--no-progress")
    assert status == 0, err
    assert "bf16" in out and "held-out exact match" in out


def test_fast_parts_train_and_load_into_the_reference(capsys, tmp_path):
    status, _, err = run(capsys, "train", "--task", "copy", "--parts", "fast", "--out", tmp_path,
                         *TINY)
    assert status == 0, err
    status, out, _ = run(capsys, "evaluate", "--checkpoint", tmp_path / "checkpoint.pt",
                         "--parts", "solutions", "--json", "--size", "10", "--device", "cpu")
    assert status == 0 and json.loads(out)["num_examples"] == 10
