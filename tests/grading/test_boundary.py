"""The operating-system boundary around the grading worker, attacked by code that has full
control of its process.

The payload below is a chapter file that gets ``os`` without naming it (through the
namespace of a PyTorch module, as a learner who got past the static rules would) and then
tries what a dishonest learner would: read the reference and the course's ``.git``, start
a daemon that outlives the worker, rewrite a report, reach the network. Each test hands it
to a worker inside bubblewrap and checks, from outside, that nothing it tried happened.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from pathlib import Path

import pytest
import torch
from probes.worker_probes import call

from annotated_transformer.course.grading import boundary
from annotated_transformer.course.grading.supervisor import CodeUnderTest, LearnerRaised, WorkerPool
from annotated_transformer.layout import ROOT, SOLUTIONS_DIR
from annotated_transformer.sources import Source

PROBES = Path(__file__).resolve().parents[1] / "probes"

pytestmark = pytest.mark.skipif(boundary.unavailable() is not None,
                                reason=f"no sandbox here: {boundary.unavailable()}")

PAYLOAD = '''
import torch

system = vars(torch.cuda)["os"]  # os, reached without an import or its name in the file
spawn = vars(torch.cuda)["importlib"].import_module("subprocess")


def softmax(x, dim=-1):
    exp = (x - x.amax(dim, keepdim=True)).exp()
    return exp / exp.sum(dim, keepdim=True)


def read(path):
    """The first bytes of ``path``, or the error that stopped the read."""
    try:
        with open(path, "rb") as handle:
            return handle.read(200).decode("latin-1")
    except OSError as error:
        return f"refused: {type(error).__name__}"


def look(paths):
    return {path: read(path) for path in paths}


def git_show(course):
    done = spawn.run(["git", "-C", course, "show", "HEAD:solutions/ch02_attention.py"],
                     capture_output=True, text=True)
    return done.returncode, done.stdout[:200]


def daemon(token):
    """A double-forked, setsid daemon that would rewrite a report after the grader is done."""
    if system.fork() == 0:
        system.setsid()
        if system.fork() == 0:
            import sys
            system.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(30)",
                                          token])
        system._exit(0)
    return "started"


def write(path):
    try:
        with open(path, "w") as handle:
            handle.write('{"points": 155}')
        return "written"
    except OSError as error:
        return f"refused: {type(error).__name__}"


def connect(port):
    import socket
    try:
        socket.create_connection(("127.0.0.1", port), timeout=3).close()
        return "connected"
    except OSError as error:
        return f"refused: {type(error).__name__}"


def look_up_reference(x):
    """The reference by import."""
    import solutions.ch02_attention as reference
    return reference.__file__


def who(x):
    return system.getuid(), sorted(system.listdir("/"))
'''


@pytest.fixture(scope="module")
def folder():
    path = Path(tempfile.mkdtemp(prefix="payload-"))
    os.chmod(path, 0o755)
    (path / "ch02_attention.py").write_text(PAYLOAD)
    os.chmod(path / "ch02_attention.py", 0o644)
    yield path
    (path / "ch02_attention.py").unlink()
    path.rmdir()


@pytest.fixture
def pool():
    # The boundary alone: the worker may start processes here (grading never lets it).
    pool = WorkerPool(lambda source: source.folder, lambda source: {}, probes=PROBES,
                      new_tasks=True)
    yield pool
    pool.close()


def run(pool, folder, name, x):
    return CodeUnderTest(pool, Source.parse(str(folder)), 2, "2.1", (), seed=0, cpu_seconds=30).run(
        call, name=name, x=x)


def test_an_honest_function_still_runs(pool, folder):
    x = torch.randn(3, 4, dtype=torch.float64)
    assert torch.allclose(run(pool, folder, "softmax", x), torch.softmax(x, -1))


def test_the_reference_and_the_course_history_are_not_there(pool, folder):
    wanted = [str(SOLUTIONS_DIR / "ch02_attention.py"), str(ROOT / ".git" / "HEAD"),
              str(ROOT / "README.md"), "/etc/shadow", "/root/.bash_history"]
    seen = run(pool, folder, "look", wanted)
    assert all(text.startswith("refused") for text in seen.values()), seen
    code, shown = run(pool, folder, "git_show", str(ROOT))
    assert code != 0 and "def softmax" not in shown


def test_nothing_it_starts_outlives_it(pool, folder):
    token = f"outlives-{os.getpid()}-{time.monotonic_ns()}"
    assert run(pool, folder, "daemon", token) == "started"
    assert _wait_for(lambda: _processes_with(token)), "the daemon should run with its worker"
    pool.discard(Source.parse(str(folder)))
    assert _wait_for(lambda: not _processes_with(token)), "a process of the worker outlived it"


def test_a_report_outside_cannot_be_written(pool, folder, tmp_path):
    report = tmp_path / "grade.json"
    report.write_text('{"points": 0}')
    assert run(pool, folder, "write", str(report)).startswith("refused")
    assert run(pool, folder, "write", str(ROOT / "gradebook.csv")).startswith("refused")
    assert report.read_text() == '{"points": 0}'
    assert not (ROOT / "gradebook.csv").exists()


def test_no_network(pool, folder):
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        assert run(pool, folder, "connect", server.getsockname()[1]).startswith("refused")


def test_it_sees_only_what_it_needs(pool, folder):
    uid, top = run(pool, folder, "who", None)
    if os.geteuid() == 0:
        assert uid != 0, "a grader running as root runs the worker as another user"
    assert "home" not in top and "etc" in top  # /etc holds only what the linker reads
    with pytest.raises(LearnerRaised, match="No module named 'solutions"):
        run(pool, folder, "look_up_reference", None)


def _wait_for(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _processes_with(token: str) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                    if token.encode() in handle.read():
                        found.append(int(entry.name))
            except OSError:
                pass
    return found
