"""Attacks that keep what the grader hands out, hook where it looks away, or size its own
models, graded through ``grade`` as a learner's folder is: each earns nothing.

Every submission passes the source rules (module-level state, ``__all__``, saved-tensor hooks
and a model's config are a learner's to use) and is the reference with the attack in place:

- **stand-ins kept for a capstone**: a 5.8 that keeps the stand-ins its first test is
  handed (1.2, 1.3, 5.6, 5.7) and builds every later model from them, with 1.2, 1.3, 3.3 and
  5.1 to 5.7 left as stubs, so that 6.6 ("your own parts together") would train on the
  grader's (10/10 for 5.8 and 6.6 before a stand-in served one request only);
- **label smoothing in a saved-tensor pack hook**: a 6.2 whose hook, fired by ``probe @
  probe``, computes ``F.cross_entropy(..., label_smoothing)`` and its gradient (then returns
  them through elementary ops), where PyTorch has popped the guard's mode;
- **the same inside a kept stand-in**: a 3.3 that keeps (and exports) the 2.2 stand-in its
  tests are handed, and a 6.2 whose hook fires inside that stand-in's exempt computation;
- **group norm inside a kept stand-in's hook**: a 5.1 that computes ``F.group_norm`` (one
  group: a layer norm) and its Jacobian there;
- **a config inflated by train_step**: a 6.5 that sets ``num_layers = 40000`` (and
  ``d_model, num_heads, d_ff = 2, 1, 1``) on the model's config at its 400th call, the
  capstone's last step, so that a grader that builds its model from the reply's config
  allocates forty thousand layers.

Each attack is tested at the cheapest level that shows it (the worker-level roads are in
tests/grading/test_blind_spots.py), then all of them end to end through the other paths a
grade takes: both workflows' own grading steps, run as GitHub runs them, and ``regrade``
beside the reference and the untouched release.
"""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from grading_run import grade_run, run_grading_step

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import engine
from annotated_transformer.layout import GRADED_DIR, ROOT, SOLUTIONS_DIR

KEEPS_STAND_INS = '''\
        if tie_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError(f"tie_embeddings needs one vocabulary: {src_vocab_size}, "
                             f"{tgt_vocab_size}")
        tokens, positions, encoder, decoder = KEPT.setdefault("5.8", (
            parts.TokenEmbedding, parts.PositionalEncoding, parts.Encoder, parts.Decoder))
        self.src_embed, self.tgt_embed = nn.Sequential(), nn.Sequential()
        for embed, vocab in ((self.src_embed, src_vocab_size), (self.tgt_embed, tgt_vocab_size)):
            embed.add_module("tokens", tokens(vocab, d_model))
            embed.add_module("positions", positions(d_model, max_len, dropout))
        self.encoder = encoder(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.decoder = decoder(d_model, num_heads, d_ff, num_layers, dropout, norm_first)
        self.generator = nn.Linear(d_model, tgt_vocab_size)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.xavier_uniform_(parameter)
        if tie_embeddings:
            shared = self.src_embed.tokens.embedding.weight
            self.tgt_embed.tokens.embedding.weight = shared
            self.generator.weight = shared
'''
ATTENTION = "        self.attention = active_parts().scaled_dot_product_attention\n"
# A pack hook, fired where PyTorch pops the guard's mode, computes the smoothed loss and its
# gradient; the loss returned is that value, with that gradient, through elementary ops.
SMOOTHING_IN_A_HOOK = '''\
        ignore = -100 if self.ignore_index is None else self.ignore_index
        if bool((target == ignore).all()):
            return (logits * 0).sum()
        found, packed = [], []

        def pack(saved):
            packed.append(1)
            if len(packed) == {at}:  # its own ops save tensors too: once is enough
                with torch.enable_grad():
                    plain = logits.detach().requires_grad_(True)
                    value = F.cross_entropy(plain, target, None, None, ignore, None, "mean",
                                            self.smoothing)
                    (slope,) = torch.autograd.grad(value, plain)
                found.append((value.detach(), slope))
            return saved

        probe = torch.ones(1, 1, 1, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
            {fire}
        value, slope = found[0]
        return value + (logits * slope).sum() - (logits * slope).sum().detach()
'''
GROUP_NORM_IN_A_HOOK = '''\
        rows = x.reshape(-1, x.size(-1))
        found, packed = [], []

        def normed(r):
            return F.group_norm(r[:, :, None], 1, None, None, self.eps)[:, :, 0]

        def pack(saved):
            packed.append(1)
            if len(packed) == 3:  # inside the stand-in's softmax (its own ops save tensors)
                with torch.enable_grad():
                    plain = rows.detach()
                    jacobian = torch.autograd.functional.jacobian(normed, plain)
                found.append((normed(plain).detach(),
                              jacobian.diagonal(dim1=0, dim2=2).permute(2, 0, 1)))
            return saved

        probe = torch.ones(1, 1, 1, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
            active_parts().KEPT[0](probe, probe, probe)
        value, jacobian = found[0]
        moved = torch.einsum("nij,nj->ni", jacobian, rows - rows.detach())
        return ((value + moved) * self.weight + self.bias).reshape(x.shape)
'''
INFLATES_THE_CONFIG = '''\
    CALLS.append(1)
    if len(CALLS) == 400:
        config = model.model.config
        config.d_model, config.num_heads, config.d_ff, config.num_layers = 2, 1, 1, 40000
    model.train()
    optimizer.zero_grad()
    logits = model(*batch.args)
    loss = loss_fn(logits.reshape(-1, logits.size(-1)), batch.labels.reshape(-1))
    loss.backward()
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    scheduler.step()
    return loss.detach()
'''
REGION = re.compile(r"( *)# BEGIN SOLUTION (\d+\.\d+)\n.*?\n\1# END SOLUTION\n", re.DOTALL)


def chapter(number: int, stubbed: tuple[str, ...] = (),
            regions: dict[tuple[str, int], str] | None = None,
            edits: tuple[tuple[str, str], ...] = (), header: str = "", exports: str = "") -> str:
    """The reference's chapter ``number`` with the exercises ``stubbed`` raising as the
    release's stubs do, each region ``(exercise, n)`` of ``regions`` (the exercise's n-th,
    from 1) replaced by its body, ``edits`` made (old, new), ``header`` after its imports and
    ``exports`` added to ``__all__``."""
    text = next(stubs.SOLUTIONS_DIR.glob(f"ch{number:02d}_*.py")).read_text()
    regions = regions or {}
    seen: dict[str, int] = {}

    def region(match: re.Match) -> str:
        indent, exercise = match[1], match[2]
        seen[exercise] = seen.get(exercise, 0) + 1
        if exercise in stubbed:
            return (f'{indent}raise NotImplementedError("Exercise {exercise}: is not '
                    f'implemented yet")\n')
        return regions.get((exercise, seen[exercise]), match[0])

    text = REGION.sub(region, text)
    assert all(n <= seen.get(e, 0) for e, n in regions), f"no region {set(regions)}"
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    at = text.index("\n__all__ = [") + 1
    text = text[:at] + header + text[at:]
    return text.replace("__all__ = [", f"__all__ = [{exports}", 1)


def submission(folder: Path, files: dict[int, str]) -> str:
    """A learner's folder: the release's stubs, with ``files`` (``{chapter: text}``)."""
    stubs.write_stubs(folder)
    for number, text in files.items():
        next(folder.glob(f"ch{number:02d}_*.py")).write_text(text)
    return str(folder)


def graded(folder: Path, files: dict[int, str], exercises: list[str]) -> dict:
    return {r.id: r for r in grade_run(None, submission(folder, files),
                                       exercises=exercises).rows()}


KEEPING_3_3 = chapter(3, header="KEPT = []\n", exports='"KEPT", ', edits=(
    (ATTENTION, ATTENTION + "        KEPT.append(self.attention)\n"),))


@pytest.mark.slow  # two exercises graded
def test_stand_ins_kept_for_the_capstone_earn_it_nothing(tmp_path):
    ch05 = chapter(5, stubbed=("5.1", "5.2", "5.3", "5.4", "5.5", "5.6", "5.7"),
                   regions={("5.8", 1): KEEPS_STAND_INS}, header="KEPT = {}\n")
    files = {1: chapter(1, stubbed=("1.2", "1.3")), 2: chapter(2),
             3: chapter(3, stubbed=("3.3",)), 4: chapter(4), 5: ch05, 6: chapter(6)}
    rows = graded(tmp_path, files, ["5.8", "6.6"])
    for exercise in ("5.8", "6.6"):  # 5.8's later tests, too, are not its first test
        assert rows[exercise].status == "forbidden" and rows[exercise].points == 0, (
            rows[exercise])
        assert re.search(r"stand-in for exercise (1\.2|1\.3|5\.6|5\.7) .*which a test of "
                         r"exercise 5\.8 was handed", rows[exercise].message), (
            rows[exercise].message)


@pytest.mark.slow  # an exercise graded
def test_label_smoothing_in_a_saved_tensor_hook_earns_nothing(tmp_path):
    ch06 = chapter(6, regions={("6.2", 2): SMOOTHING_IN_A_HOOK.format(at=1, fire="probe @ probe")},
                   header="import torch.nn.functional as F\n")
    rows = graded(tmp_path, {6: ch06}, ["6.2"])
    assert rows["6.2"].status == "forbidden" and rows["6.2"].points == 0, rows["6.2"]
    assert "F.cross_entropy with label_smoothing" in rows["6.2"].message, rows["6.2"].message


@pytest.mark.slow  # three exercises graded
def test_a_forbidden_op_in_a_kept_stand_in_s_hook_earns_nothing(tmp_path):
    """The label smoothing of 6.2 and the group norm of 5.1, each computed in a pack hook
    fired inside the 2.2 stand-in that 3.3's tests were handed and 3.3 kept."""
    ch06 = chapter(6, regions={("6.2", 2): SMOOTHING_IN_A_HOOK.format(
        at=3, fire="active_parts().KEPT[0](probe, probe, probe)")},
        header="import torch.nn.functional as F\n\nfrom annotated_transformer.parts import "
               "active_parts\n")
    ch05 = chapter(5, regions={("5.1", 2): GROUP_NORM_IN_A_HOOK},
                   header="import torch.nn.functional as F\n")
    rows = graded(tmp_path, {3: KEEPING_3_3, 5: ch05, 6: ch06}, ["3.3", "5.1", "6.2"])
    assert rows["3.3"].status == "passed", rows["3.3"]
    for exercise in ("5.1", "6.2"):
        assert rows[exercise].status == "forbidden" and rows[exercise].points == 0, (
            rows[exercise])
        assert ("stand-in for exercise 2.2 (scaled_dot_product_attention), which a test of "
                "exercise 3.3 was handed") in rows[exercise].message, rows[exercise].message


def test_a_reply_s_config_and_shapes_size_nothing_in_the_grader():
    """The capstones' checks, on what the inflating train_step sends back: its config is a
    failed test naming what changed, before the grader builds anything; the grader's model
    is the test's own, and weights of other shapes are refused before any is copied."""
    checks = runpy.run_path(str(GRADED_DIR / "checks.py"))
    models = runpy.run_path(str(GRADED_DIR / "torch_models.py"))
    expected = dict(src_vocab_size=13, tgt_vocab_size=13, num_layers=1, d_model=64, d_ff=256,
                    num_heads=4, dropout=0.0, max_len=64, norm_first=True, tie_embeddings=True)
    inflated = {**expected, "d_model": 2, "num_heads": 1, "d_ff": 1, "num_layers": 40000}
    with pytest.raises(AssertionError, match=r"num_layers=40000 \(expected 1\)"):
        checks["check_trained_config"](inflated, expected, "the model your parts trained")
    for wrong in ({**expected, "max_len": 64.0}, {**expected, "extra": 1}, [1], {}):
        with pytest.raises(AssertionError):
            checks["check_trained_config"](wrong, expected, "the model")
    checks["check_trained_config"](dict(expected), expected, "the model")  # the same: passes
    from types import SimpleNamespace

    model = models["TorchEncoderDecoder"](SimpleNamespace(**expected))
    state = {"src_embed.tokens.embedding.weight": torch.zeros(13, 2)}
    with pytest.raises(KeyError, match="src_embed.weight"):
        model.load_course_state_dict(state)


def test_the_graded_tests_own_process_is_bounded_by_the_kernel(monkeypatch):
    """Whatever a reply makes the checks do, their process (outside the worker and its
    cgroup) stops at its own CPU time, data and wall-clock bounds, and says which."""
    monkeypatch.setattr(engine, "CHECKS_CPU_SECONDS", 1)
    monkeypatch.setattr(engine, "CHECKS_DATA_BYTES", 2**28)
    monkeypatch.setattr(engine, "CHECKS_WALL_SECONDS", 600)  # a busy machine's 1 CPU second
    python = [sys.executable, "-c"]
    returncode, _, stderr = engine.bounded_run([*python, "while True: pass"], dict(os.environ))
    with pytest.raises(engine.ChecksOverBound, match="bound of 1 CPU seconds"):
        engine.over_bound(returncode, stderr)
    returncode, _, stderr = engine.bounded_run([*python, "bytearray(2**30)"], dict(os.environ))
    with pytest.raises(engine.ChecksOverBound, match=r"bound of 0\.25 GiB of data"):
        engine.over_bound(returncode, stderr)
    monkeypatch.setattr(engine, "CHECKS_WALL_SECONDS", 2)
    with pytest.raises(engine.ChecksOverBound, match="did not finish in 2 s of wall time"):
        engine.bounded_run([*python, "import time; time.sleep(60)"], dict(os.environ))
    returncode, stdout, _ = engine.bounded_run([*python, "print(sum(range(10)))"],
                                               dict(os.environ))
    assert (returncode, stdout) == (0, "45\n")  # within its bounds: its output, as it is
    engine.over_bound(returncode, "")
    # Stopped for its CPU after it wrote some records: the run still grades nothing; a
    # MemoryError inside a test that was recorded is that test's failure, not a bound.
    with pytest.raises(engine.ChecksOverBound, match="bound of 1 CPU seconds"):
        engine.over_bound(-signal.SIGXCPU, "", reported=True)
    engine.over_bound(1, "MemoryError", reported=True)


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _gone(pid: int, seconds: float = 30.0) -> bool:
    """Whether ``pid`` has ended (or is a zombie) within ``seconds``: a deadline, not a
    measure."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")
@pytest.mark.parametrize("how", ["the grader", "a regrade worker"])
def test_a_grader_killed_from_outside_leaves_no_graded_tests_running(how):
    """Killed by any signal, ``SIGKILL`` included, the process that runs the graded tests
    (``grade``, or one of ``regrade``'s workers) takes them with it: the kernel ends them
    (``engine.bounded_run``, ``engine.die_with_parent``)."""
    checks = ("import os, sys; from annotated_transformer.course.grading import engine; "
              "engine.bounded_run([sys.executable, '-c', 'import time; time.sleep(600)'], "
              "dict(os.environ))")
    if how == "a regrade worker":  # the worker's parent, regrade, is what is killed
        worker = checks.replace("engine.bounded_run",
                                "engine.die_with_parent(); engine.bounded_run")
        checks = ("import subprocess, sys, time; "
                  f"subprocess.Popen([sys.executable, '-c', {worker!r}]); time.sleep(600)")
    killed = subprocess.Popen([sys.executable, "-c", checks])
    try:
        deadline, descendants = time.monotonic() + 60, []
        while time.monotonic() < deadline and len(descendants) < (2 if "regrade" in how else 1):
            descendants = _children(killed.pid)
            descendants += [g for c in descendants for g in _children(c)]
            time.sleep(0.1)
        assert descendants, "the graded tests' process never started"
        killed.kill()
        killed.wait()
        assert all(_gone(pid) for pid in descendants), "left running after its grader died"
    finally:
        if killed.poll() is None:
            killed.kill()


def test_a_grading_run_past_the_checks_bounds_grades_nothing(monkeypatch, tmp_path):
    """The bounds hold on the graded tests' process itself: at 1 CPU second (importing
    PyTorch and the tests costs more), the run stops and nothing is graded."""
    monkeypatch.setattr(engine, "CHECKS_CPU_SECONDS", 1)
    with pytest.raises(engine.ChecksOverBound, match="bound of 1 CPU seconds"):
        grade_run(None, submission(tmp_path, {}), exercises=["2.1"])


@pytest.mark.slow  # the capstone trained: a minute
def test_a_train_step_that_inflates_the_config_fails_the_capstone(tmp_path):
    ch06 = chapter(6, regions={("6.5", 1): INFLATES_THE_CONFIG}, header="CALLS = []\n")
    files = {n: chapter(n) for n in (1, 2, 3, 4, 5, 7, 8)}
    rows = graded(tmp_path, {**files, 6: ch06}, ["6.6"])
    assert rows["6.6"].status == "failed" and rows["6.6"].points == 0, rows["6.6"]
    assert "num_layers=40000 (expected 1)" in rows["6.6"].message, rows["6.6"].message


# ---------------------------------------------------------------- every path a grade takes

def mallory() -> dict[int, str]:
    """The road through a kept stand-in: 3.3 keeps its 2.2 stand-in, 5.1 computes its group
    norm and 6.2 its smoothed loss in hooks fired inside it (as do the capstones, which
    compute with 5.1's layer norm)."""
    ch05 = chapter(5, regions={("5.1", 2): GROUP_NORM_IN_A_HOOK},
                   header="import torch.nn.functional as F\n")
    ch06 = chapter(6, regions={("6.2", 2): SMOOTHING_IN_A_HOOK.format(
        at=3, fire="active_parts().KEPT[0](probe, probe, probe)")},
        header="import torch.nn.functional as F\n\nfrom annotated_transformer.parts import "
               "active_parts\n")
    return {**{n: chapter(n) for n in (1, 2, 4, 7, 8)}, 3: KEEPING_3_3, 5: ch05, 6: ch06}


def trudy() -> dict[int, str]:
    """The hook where PyTorch pops the guard's mode: 6.2 computes its smoothed loss in a hook
    fired by ``probe @ probe`` (the capstone, which trains with it, fails with it)."""
    ch06 = chapter(6, regions={("6.2", 2): SMOOTHING_IN_A_HOOK.format(at=1, fire="probe @ probe")},
                   header="import torch.nn.functional as F\n")
    return {**{n: chapter(n) for n in (1, 2, 3, 4, 5, 7, 8)}, 6: ch06}


def eve() -> dict[int, str]:
    """The stand-ins kept for the capstone, the parts they stand in for left as stubs."""
    ch05 = chapter(5, stubbed=("5.1", "5.2", "5.3", "5.4", "5.5", "5.6", "5.7"),
                   regions={("5.8", 1): KEEPS_STAND_INS}, header="KEPT = {}\n")
    return {**{n: chapter(n) for n in (2, 4, 6, 7, 8)}, 1: chapter(1, stubbed=("1.2", "1.3")),
            3: chapter(3, stubbed=("3.3",)), 5: ch05}


ATTACKERS = {"mallory": mallory, "trudy": trudy, "eve": eve}
# What each attacked exercise gets, and who its message names: a kept stand-in names the
# exercise whose test was handed it.
REFUSED = {"mallory": {e: ("forbidden", "which a test of exercise 3.3 was handed")
                       for e in ("5.1", "6.2", "6.6", "8.6")},
           "trudy": {"6.2": ("forbidden", "F.cross_entropy with label_smoothing"),
                     "6.6": ("error", "fix 6.2 first")},
           "eve": {e: ("forbidden", "which a test of exercise 5.8 was handed")
                   for e in ("5.8", "6.6")}}
# Eve's stubs, and 8.6, which trains her own parts of chapters 1 to 5 and meets them.
STUBBED = {"eve": {"1.2", "1.3", "3.3", "5.1", "5.2", "5.3", "5.4", "5.5", "5.6", "5.7", "8.6"}}


def earned_nothing(learner: str, rows: dict[str, tuple[float, str, str]]) -> None:
    """The attacked exercises earn nothing, refused for what they did; the stubbed ones are
    not implemented; every other exercise passes, as the reference's lines do."""
    for exercise, (points, status, message) in rows.items():
        if exercise in REFUSED[learner]:
            outcome, named = REFUSED[learner][exercise]
            assert (points, status) == (0, outcome) and named in message, (exercise,
                                                                          rows[exercise])
        elif exercise in STUBBED.get(learner, ()):
            assert points == 0 and status == "not implemented", (exercise, rows[exercise])
        else:
            assert status == "passed", (learner, exercise, rows[exercise])


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """The course as a workflow's ``.course`` holds it (its source rules on)."""
    folder = tmp_path_factory.mktemp("course") / "course"
    for name in ("annotated_transformer", "solutions", "exercises", "tests/graded", ".github"):
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, folder)
    return folder


@pytest.mark.slow  # the whole course graded, its capstones trained
@pytest.mark.skipif(os.geteuid() != 0, reason="the workflows run the grader as root")
@pytest.mark.parametrize("learner, workflow", [
    ("eve", "grade.yml"), ("mallory", "classroom.yml"), ("trudy", "grade.yml")])
def test_the_catalogue_through_the_workflow_s_own_grading_step(course, workflow, learner,
                                                              tmp_path):
    """Each learner through one workflow: both grade with the same command
    (tests/distribution/test_workflows.py::test_both_workflows_grade_alike)."""
    workspace = tmp_path / "workspace"
    submission(workspace / "exercises", ATTACKERS[learner]())
    done = run_grading_step(workflow, workspace, course)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((workspace / "temp" / "grade" / "grade.json").read_text())
    earned_nothing(learner, {r["id"]: (r["points"], r["status"], r["message"])
                             for r in data["exercises"]})


@pytest.mark.slow  # five learners, the whole course each, capstones trained
@pytest.mark.alone  # regrade --jobs 2
def test_the_catalogue_through_regrade_beside_the_reference_and_the_release(tmp_path):
    learners = tmp_path / "submissions"
    for name, files in ATTACKERS.items():
        submission(learners / name / "exercises", files())
    submission(learners / "alice" / "exercises", {
        int(path.name[2:4]): path.read_text() for path in SOLUTIONS_DIR.glob("ch*.py")})
    submission(learners / "bob" / "exercises", {})
    out = tmp_path / "grades"
    names = [*ATTACKERS, "alice", "bob"]
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "regrade",
                           *(str(learners / n) for n in names), "--out", str(out),
                           "--seed", "4", "--jobs", "2"], cwd=ROOT,
                          capture_output=True, text=True, timeout=2400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows: dict[str, dict[str, tuple[float, str, str]]] = {}
    for row in json.loads((out / "gradebook.json").read_text())["rows"]:
        rows.setdefault(row["learner"], {})[row["exercise"]] = (
            row["points"], row["status"], row["message"])
    for learner in ATTACKERS:
        earned_nothing(learner, rows[learner])
    assert all(status == "passed" for _, status, _ in rows["alice"].values()), rows["alice"]
    assert all(points == 0 for points, _, _ in rows["bob"].values()), rows["bob"]
