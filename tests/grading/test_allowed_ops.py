"""The allow-list at PyTorch's dispatcher, attacked directly in the worker.

As in tests/grading/test_sandbox.py, the static rules are skipped on purpose: the worker is handed a
chapter file that reaches a guarded exercise's result by another road (a fused kernel behind
a module, an argument passed by position) or that replaces the grader's own guard, as a
learner past those rules would. Each road must be refused, and an honest answer built from
elementary ops must still run.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
import torch
from grading_run import grade_run
from probes.worker_probes import call

from annotated_transformer.course.grading.supervisor import (
    CodeUnderTest,
    ForbiddenCall,
    LearnerRaised,
    WorkerPool,
)
from annotated_transformer.course.grading.worker import allowed_ops
from annotated_transformer.sources import Source

PROBES = Path(__file__).resolve().parents[1] / "probes"
SOFTMAX = ("_softmax", "_log_softmax", "logsumexp")  # 2.1's own forbidden ops, in part
NLL = ("+_log_softmax", "+nll_loss_forward", "F.cross_entropy:label_smoothing")  # 6.2's

ROADS = '''
import functools
import sys

import torch
import torch.nn.functional as F
from torch import nn


def softmax(x, dim=-1):
    exp = (x - x.amax(dim, keepdim=True)).exp()
    return exp / exp.sum(dim, keepdim=True)


def honest_with_utilities(x):
    """Elementary ops through PyTorch's tensor utilities: padding, stacking, where."""
    rows = nn.utils.rnn.pad_sequence([x[0], x[1, :2]], batch_first=True)
    return torch.where(rows > 0, rows, torch.zeros_like(rows)).sum() + softmax(x).sum()


def fused_attention(x):
    """nn.MultiheadAttention in eval mode without gradients: PyTorch's fused CPU kernel."""
    attention = nn.MultiheadAttention(4, 1, batch_first=True).eval()
    with torch.no_grad():
        attention(x[None, :, :4].float(), x[None, :, :4].float(), x[None, :, :4].float(),
                  need_weights=False)
    return softmax(x)


def fused_encoder_layer(x):
    """LayerNorm from nn.TransformerEncoderLayer's fused fast path (zero attention and
    feed-forward leave norm2(norm1(x)))."""
    layer = nn.TransformerEncoderLayer(4, 1, 4, dropout=0.0, batch_first=True).eval()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.zero_()
        return layer(x[None, :, :4].float())[0]


def smoothing_by_position(x):
    target = torch.zeros(x.shape[0], dtype=torch.long)
    return F.cross_entropy(x, target, None, None, -100, None, "mean", 0.1)


def smoothing_by_module(x):
    target = torch.zeros(x.shape[0], dtype=torch.long)
    return nn.CrossEntropyLoss(label_smoothing=0.1)(x, target)


class Smoothing(float):
    """A number that says it is the default (0.0) whatever it holds."""

    def __ne__(self, other):
        return False

    def __eq__(self, other):
        return True

    def __hash__(self):
        return 0


def smoothing_that_claims_the_default(x):
    target = torch.zeros(x.shape[0], dtype=torch.long)
    return F.cross_entropy(x, target, label_smoothing=Smoothing(0.1))


def in_place_forms(x):
    """The in-place form of an allowed op: the same computation."""
    y = x.abs() + 1
    return y.rsqrt_().sin_().cumsum_(-1).erf_().index_fill_(1, torch.tensor([0]), 2.0)


def plain_cross_entropy(x):
    return F.cross_entropy(x, torch.zeros(x.shape[0], dtype=torch.long), None, None, -100,
                           None, "mean", 0.0)


def replaces_the_guard(x):
    """What the update_wrapper escape led to: the grader's own names replaced."""
    worker = sys.modules["annotated_transformer.course.grading.worker.process"]
    guard = sys.modules["annotated_transformer.course.grading.worker.allowed_ops"]
    dispatch = sys.modules["torch.utils._python_dispatch"]
    worker.forbid_ops = lambda ops, exercise: None
    guard.ELEMENTARY = frozenset({"_softmax"}) | guard.ELEMENTARY
    guard.guard_factory = lambda: (lambda refused, exercise: (None, []))
    guard.op_name = lambda func: "exp"
    dispatch.TorchDispatchMode.__enter__ = lambda self: self
    worker.Worker.handle = lambda self, request: {"ok": True, "value": 1.0}
    return torch.softmax(x, -1)


REPLACED = replaces_the_guard


def enters_the_exemption(x):
    """The guard's exemption (before: a function ``exempt``), sought among the garbage
    collector's objects, then softmax."""
    import gc
    import types

    for found in gc.get_objects():
        if isinstance(found, types.FunctionType) and found.__name__ == "exempt":
            manager = found()
            if hasattr(manager, "__enter__"):
                with manager:
                    return torch.softmax(x, -1)
    raise LookupError("no exemption found")


def audited_events(x):
    """Each event the worker's audit hook refuses, raised from here: what each one said."""
    import ctypes
    import gc
    import types

    def blank():
        pass

    def set_code():
        blank.__code__ = softmax.__code__

    said = []
    for attempt in (gc.get_objects, lambda: gc.get_referrers(x), lambda: gc.get_referents(x),
                    sys._current_frames, lambda: sys.settrace(None),
                    lambda: sys.setprofile(None), lambda: ctypes.string_at(id(x), 8),
                    lambda: types.FunctionType(softmax.__code__, {}),
                    lambda: softmax.__code__.replace(co_name="mine"), set_code):
        try:
            attempt()
            said.append("not refused")
        except RuntimeError as error:
            said.append(str(error))
    sys.addaudithook(lambda event, args: said.append(f"a second hook saw {event}"))
    try:
        gc.get_objects()
    except RuntimeError:
        pass
    return said
'''


@pytest.fixture(scope="module")
def folder():
    path = Path(tempfile.mkdtemp(prefix="roads-"))
    os.chmod(path, 0o755)  # readable by an unprivileged worker too
    (path / "ch02_attention.py").write_text(ROADS)
    os.chmod(path / "ch02_attention.py", 0o644)
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture(scope="module")
def pool():
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES)
    yield pool
    pool.close()


def learner(pool, folder, forbid_ops, exercise="2.1"):
    return CodeUnderTest(pool, Source.parse(str(folder)), 2, exercise, tuple(forbid_ops), seed=0,
                         cpu_seconds=30.0)


X = torch.randn(3, 5, dtype=torch.float64)


def test_an_honest_answer_with_tensor_utilities_runs(pool, folder):
    found = learner(pool, folder, SOFTMAX).run(call, name="honest_with_utilities", x=X)
    rows = torch.nn.utils.rnn.pad_sequence([X[0], X[1, :2]], batch_first=True)
    assert torch.allclose(found, rows.clamp(min=0).sum() + 3)


@pytest.mark.parametrize(("name", "exercise", "refused", "op"), [
    ("fused_attention", "2.1", SOFTMAX,
     "aten._native_multi_head_attention|aten._scaled_dot_product_"),
    ("fused_encoder_layer", "5.1", ("native_layer_norm",),
     "aten._transformer_encoder_layer_fwd|aten._scaled_dot_product_|aten.native_layer_norm"),
    ("smoothing_by_position", "6.2", NLL, "F.cross_entropy with label_smoothing"),
    ("smoothing_by_module", "6.2", NLL, "F.cross_entropy with label_smoothing"),
    ("smoothing_that_claims_the_default", "6.2", NLL, "F.cross_entropy with label_smoothing"),
])
def test_a_fused_or_unlisted_op_is_refused_whatever_name_reached_it(pool, folder, name,
                                                                     exercise, refused, op):
    """Which op is met first depends on the road PyTorch takes inside (a fused kernel or the
    attention it falls back to); each is outside the allow-list."""
    with pytest.raises(ForbiddenCall, match=rf"PyTorch's ({op})") as refused_call:
        learner(pool, folder, refused, exercise).run(call, name=name, x=X)
    assert str(refused_call.value).startswith(f"Exercise {exercise} ")


def test_the_guard_cannot_be_replaced_by_the_code_it_guards(folder):
    """The file replaces every name of the grader it can reach, then calls torch.softmax:
    refused, and so is every later call (the guard was built before any learner code)."""
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES)
    try:
        _replaced(pool, folder)
    finally:
        pool.close()


def _replaced(pool, folder):
    with pytest.raises(ForbiddenCall, match="aten._softmax"):
        learner(pool, folder, SOFTMAX).run(call, name="replaces_the_guard", x=X)
    with pytest.raises(ForbiddenCall, match="aten._softmax"):
        learner(pool, folder, SOFTMAX).run(call, name="REPLACED", x=X)


def test_code_that_walks_the_collector_s_objects_finds_no_way_past_the_guard(pool, folder):
    """With the source rules off, the old attack (the guard's exemption found among the
    garbage collector's objects, then ``torch.softmax``: 2.1 earned full marks) is refused
    in the worker itself: its audit hook refuses ``gc.get_objects``, and the learner reads
    why as the error of the exercise. Past the hook, there is no exemption to find
    (:func:`test_no_object_of_the_worker_s_turns_the_guard_off`)."""
    with pytest.raises(LearnerRaised, match=r"the grading worker refuses gc\.get_objects: it "
                                            r"lists every object"):
        learner(pool, folder, SOFTMAX).run(call, name="enters_the_exemption", x=X)


def test_no_object_of_the_worker_s_turns_the_guard_off():
    """The guard exempts the stand-ins' ops by the code objects that call them: there is no
    switch among the worker's objects. Every context manager that the worker's modules
    made (found as the old attack found ``exempt``, among the collector's objects, here in
    the test's own process, where no audit hook is) is entered around ``torch.softmax``:
    refused inside each (the stand-ins' ``alone()`` turns the guard's mode off with the
    rest, so every op there is refused)."""
    import gc
    import types

    from annotated_transformer.course.grading.worker import trusted

    computed, entries, inner = trusted.computations()
    guard = allowed_ops.guard_factory(entries, inner)
    worker = "annotated_transformer.course.grading.worker"
    managers = [found for found in gc.get_objects()
                if type(found) is types.FunctionType
                and (found.__module__ or "").startswith(worker) and hasattr(found, "__wrapped__")]
    assert managers, "no context manager of the worker's found: this proves nothing"
    for manager in managers:
        mode, hits = guard(SOFTMAX, "2.1")
        with mode, pytest.raises(allowed_ops.ForbiddenOpUsed), manager():
            torch.softmax(X, -1)
        assert hits, manager


def test_the_worker_s_audit_hook_refuses_each_road_to_its_own_objects(pool, folder):
    """Events no honest exercise raises, each refused with its name and a reason; a second
    audit hook of the learner's is not added (silently: Python's rule). The worker's own
    trace function (which notes the chapters' functions a probe entered) is let through."""
    handle = learner(pool, folder, SOFTMAX)
    handle.observe = True
    said = handle.run(call, name="audited_events", x=X)
    events = ("gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._current_frames",
              "sys.settrace", "sys.setprofile", "ctypes.", "function.__new__", "code.__new__",
              "setting a function's __code__")
    assert len(said) == len(events), said
    for event, message in zip(events, said, strict=True):
        assert message.startswith(f"the grading worker refuses {event}"), (event, message)
    assert not [m for m in said if "second hook" in m]


def test_a_plain_cross_entropy_is_allowed_where_the_smoothing_is_not(pool, folder):
    found = learner(pool, folder, NLL, "6.2").run(call, name="plain_cross_entropy", x=X)
    assert torch.allclose(found, torch.nn.functional.cross_entropy(X, torch.zeros(3).long()))


def test_an_allowed_op_is_allowed_in_place_too(pool, folder):
    found = learner(pool, folder, SOFTMAX).run(call, name="in_place_forms", x=X)
    expected = (X.abs() + 1).rsqrt().sin().cumsum(-1).erf()
    expected[:, 0] = 2.0
    assert torch.allclose(found, expected)


def test_an_exercise_may_allow_one_more_op_and_refuse_an_elementary_one():
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    assert _get_current_dispatch_mode() is None
    mode, hits = allowed_ops.guard_factory()(("+_log_softmax", "gather"), "6.2")
    assert not hits
    with mode:
        torch.log_softmax(X, -1)
        with pytest.raises(allowed_ops.ForbiddenOpUsed, match="aten.gather"):
            X.gather(1, torch.zeros(3, 1, dtype=torch.long))
    assert hits == ["aten.gather"]
    mode, hits = allowed_ops.guard_factory()(("exp",), "2.1")
    with mode:
        with pytest.raises(allowed_ops.ForbiddenOpUsed, match="aten.exp_"):
            X.clone().exp_()  # an op refused is refused in place too
    assert hits == ["aten.exp_"]


def test_the_allow_list_holds_the_building_blocks_and_no_fused_kernel():
    for op in ("exp", "sum", "amax", "matmul", "mm", "bmm", "where", "masked_fill", "gather",
               "embedding", "native_dropout"):
        assert op in allowed_ops.ELEMENTARY, op
    for op in ("_softmax", "_log_softmax", "logsumexp", "native_layer_norm",
               "_native_multi_head_attention", "_transformer_encoder_layer_fwd",
               "_scaled_dot_product_flash_attention_for_cpu", "nll_loss_forward", "kl_div"):
        assert op not in allowed_ops.ELEMENTARY, op


# ---------------------------------------------------------------- through the grader

MHA_SOFTMAX = '''\
    # softmax(x) as the weights of an attention whose keys are x: PyTorch's fused kernel.
    moved = x.movedim(dim, -1)
    n = moved.shape[-1]
    if moved.numel() == 0:
        return moved.clone().movedim(-1, dim)
    rows = moved.reshape(-1, n).float()
    attention = nn.MultiheadAttention(n, 1, bias=False, batch_first=True).eval()
    with torch.no_grad():
        attention.in_proj_weight.copy_(torch.eye(n).repeat(3, 1))
        attention.out_proj.weight.copy_(torch.eye(n))
        scale = n ** 0.5
        keys = torch.zeros(rows.shape[0], n, n)
        keys[:, :, 0] = rows * scale
        query = torch.zeros(rows.shape[0], 1, n)
        query[:, 0, 0] = 1.0
        values = torch.eye(n).expand(rows.shape[0], n, n)
        out, _ = attention(query, keys, values, need_weights=False)
    return out[:, 0].to(x.dtype).reshape(moved.shape).movedim(-1, dim)
'''
POSITIONAL_SMOOTHING = '''\
        ignore = -100 if self.ignore_index is None else self.ignore_index
        if bool((target == ignore).all()):
            return logits.sum() * 0.0
        return F.cross_entropy(logits, target, None, None, ignore, None, "mean", self.smoothing)
'''


def _with(chapter_file: str, exercise: str, body: str, header: str) -> str:
    from annotated_transformer.course.authoring import stubs

    text = (stubs.SOLUTIONS_DIR / chapter_file).read_text()
    marker = f"# BEGIN SOLUTION {exercise}"
    start = text.rindex(marker)
    start = text.rindex("\n", 0, start) + 1
    end = text.index("# END SOLUTION", start)
    end = text.rindex("\n", 0, end) + 1
    text = text[:start] + body + text[end:]
    at = text.index("\nimport torch\n") + len("\nimport torch\n")
    return text[:at] + header + text[at:]


PLAIN_CROSS_ENTROPY = POSITIONAL_SMOOTHING.replace(', "mean", self.smoothing)', ', "mean")')


def _graded(folder: Path, softmax: str, loss: str) -> dict:
    from annotated_transformer.course.authoring import stubs

    folder.mkdir()
    stubs.write_stubs(folder)
    (folder / "ch02_attention.py").write_text(
        _with("ch02_attention.py", "2.1", softmax, "from torch import nn\n"))
    (folder / "ch06_training.py").write_text(
        _with("ch06_training.py", "6.2", loss, "import torch.nn.functional as F\n"))
    return {r.id: r for r in grade_run([2, 6], str(folder)).rows()}


@pytest.mark.slow  # two chapters graded twice
def test_forbidden_roads_score_only_the_honest_content_through_the_grader(tmp_path):
    """2.1 computed by nn.MultiheadAttention's fused kernel and 6.2's label smoothing passed
    to F.cross_entropy by position: names the static rules allow, results the allow-list
    refuses. Each exercise is forbidden and earns nothing, as the untouched release does,
    although a plain cross-entropy (the control) is right without smoothing: an exercise
    that reaches a forbidden op anywhere earns nothing."""
    assert "self.smoothing" not in PLAIN_CROSS_ENTROPY
    attack = _graded(tmp_path / "attack", MHA_SOFTMAX, POSITIONAL_SMOOTHING)
    control = _graded(tmp_path / "control", "    return torch.zeros_like(x)\n",
                      PLAIN_CROSS_ENTROPY)
    assert control["6.2"].points > 0, control["6.2"]  # its smoothing-free cases are right
    for exercise in ("2.1", "6.2"):
        assert attack[exercise].status == "forbidden", attack[exercise]
        assert control[exercise].status in ("failed", "error"), control[exercise]
        assert attack[exercise].points == 0, attack[exercise]
    assert attack["2.1"].points == 0 and "aten." in attack["2.1"].message
    assert "label_smoothing" in attack["6.2"].message
    assert attack["2.3"].status == "passed" and attack["6.1"].status == "passed"
