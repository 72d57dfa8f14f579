"""``train --compile`` through the real command line, for every task and both model kinds.

The layers compile with ``aot_eager`` (here counting its calls): the same tracing of
forward and backward as Inductor, where a graph break or a crash in the model's code
would show, without generating C++ kernels, which takes minutes on a 2-core CPU. The
losses must be those of the same run without ``--compile``.
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo import register_backend
from torch._dynamo.backends.debugging import aot_eager
from torch._dynamo.utils import counters

from annotated_transformer import checkpoint, cli

from train_tasks import TRAINED_TASKS, task_arguments

SHORT = ["--steps", "3", "--batch-size", "8", "--eval-size", "8", "--device", "cpu",
         "--no-progress", "--threads", "1"]


def train(capsys, out, task, *extra) -> tuple[str, list[float]]:
    """``train`` the task into the folder ``out`` (its data, where it needs some, beside it)."""
    status = cli.main(["train", *task_arguments(task, out.parent), "--out", str(out), *SHORT,
                       *extra])
    stdout, stderr = capsys.readouterr()
    assert status == 0, stderr
    state = torch.load(out / checkpoint.FILE_NAME, weights_only=True)
    return stdout, state["history"]["loss"]


CALLS: list[str] = []


@register_backend
def counted_aot_eager(graph, example_inputs):
    """``aot_eager``, counting every call of what it compiled (a cached graph included)."""
    compiled = aot_eager(graph, example_inputs)

    def run(*args):
        CALLS.append(graph.__class__.__name__)
        return compiled(*args)
    return run


@pytest.mark.slow
@pytest.mark.alone  # Inductor compiles with a process per core, within its timeout
@pytest.mark.timeout(300)
@pytest.mark.parametrize("task", TRAINED_TASKS)
def test_train_compile_trains_every_task_as_eager_does(capsys, tmp_path, task):
    counters.clear()
    CALLS.clear()
    out, compiled = train(capsys, tmp_path / "compiled", task, "--compile",
                          "counted_aot_eager")
    assert "compiled (counted_aot_eager)" in out
    assert "held-out exact match" in out or "held-out perplexity" in out  # text: perplexity
    assert CALLS, "--compile ran no compiled code"
    breaks = dict(counters["graph_break"])
    assert not breaks, f"graph breaks in the layers: {breaks}"
    _, eager = train(capsys, tmp_path / "eager", task)
    assert len(compiled) == len(eager) == 3
    assert compiled == pytest.approx(eager, rel=1e-4), (
        f"--compile changed the losses: {compiled} against {eager} without it")


def test_compile_refuses_an_unknown_backend(capsys, tmp_path):
    status = cli.main(["train", "--task", "copy", "--out", str(tmp_path), "--compile", "nope",
                       *SHORT])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: --compile 'nope'") and len(err.splitlines()) == 1
