"""The student release: no answers in it, and what does not need them still works.

The release is run by a Python that cannot see this repository: a fresh virtual
environment whose path holds the release and this environment's installed libraries
(torch, pytest, ...), but not the editable install that maps ``solutions`` here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch
from grading_run import grade_run

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.distribution import release, release_record
from annotated_transformer.course.grading import manifest
from annotated_transformer.course.grading.engine import exercise_points
from annotated_transformer.layout import MANIFEST, ROOT, relative

pytestmark = pytest.mark.skipif(not (ROOT / ".git").exists(),
                                reason="a release is made from a git clone of the course")


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("release") / "course"
    release.write_release(folder, allow_dirty=True)
    return folder


@pytest.fixture(scope="module")
def python(out: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python that sees the release and the installed libraries, not this repository."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"), None) or venv / "Lib" / "site-packages"
    libraries = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "release.pth").write_text("\n".join([str(out), *sorted(libraries)]) + "\n")
    exe = venv / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    done = run(exe, out, "-c", "import solutions")
    assert "No module named 'solutions'" in done.stderr, "the release's Python sees solutions"
    return exe


def run(python: Path, out: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env |= {"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    return subprocess.run([str(python), *args], cwd=out, capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_the_release_leaves_the_answers_and_the_course_tests_out(out: Path):
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    for gone in ("solutions/", "annotated_transformer/fast_parts/", "tests/variants/", ".ci/",
                 "CONTRIBUTING.md", ".github/workflows/book.yml",
                 ".github/workflows/classroom.yml", "tests/grading/test_grading.py"):
        assert not any(f.startswith(gone) for f in files), f"{gone} is in the release"
    tests = {f for f in files if f.startswith("tests/")}
    graded = {f for f in manifest.graded_files(ROOT) if f.startswith("tests/")}
    assert tests == graded | {relative(MANIFEST)}, "tests/graded/ whole, nothing else of tests/"
    for kept in ("README.md", "pyproject.toml", "annotated_transformer/grade.py",
                 "chapters/01_positional_encoding.ipynb", ".github/workflows/grade.yml",
                 "chapters/checkpoints/dates.pt", "book/_toc.yml", "scripts/test.sh"):
        assert kept in files
    for path in out.rglob("*.py"):
        lines = path.read_text().splitlines()
        assert not any(stubs.BEGIN.match(line) for line in lines), f"a solution in {path}"


def test_the_release_has_fresh_stubs_and_its_own_readme(out: Path):
    for solution in stubs.solution_files():
        stub = out / "exercises" / solution.name
        assert stub.read_text() == stubs.render(solution)
    readme = (out / "README.md").read_text()
    assert "A student release" in readme and "grade your exercises" in readme
    for marker in ("course-only", "release-only", "solutions/chNN", "CONTRIBUTING",
                   "with_chapter(", "from the reference parts", "browser test"):
        assert marker not in readme
    for stub in (out / "exercises").glob("ch*.py"):  # nothing points to the missing answers
        assert "solutions/" not in stub.read_text().split('"""')[0], stub.name
    course = (ROOT / "README.md").read_text()
    assert "A student release" not in release.COURSE_ONLY.sub("", course).split("<!--")[0]


def test_the_release_records_what_it_is(out: Path):
    """course-release.json: the commit it was made from, every exercise with the points the
    grader offers, and the sha256 of each stub, grading file and the workflow kept."""
    record = json.loads((out / release_record.RECORD).read_text())
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()
    assert record["commit"] == head and isinstance(record["uncommitted_changes"], bool)
    assert {e: v["points"] for e, v in record["exercises"].items()} == {
        r.id: r.max_points for r in exercise_points()}
    assert record["stubs"] == {f"exercises/{p.name}": manifest.file_sha256(p)
                               for p in sorted((out / "exercises").glob("ch*.py"))}
    assert record["grading_files"] == manifest.compute(out)["files"]
    assert record["workflows"] == {".github/workflows/grade.yml": manifest.file_sha256(
        out / ".github" / "workflows" / "grade.yml")}
    assert release_record.commit_of((out / release_record.RECORD).read_bytes()) == head


def test_the_classroom_release_keeps_the_classroom_workflow_only():
    files = release.release_files("classroom")
    assert ".github/workflows/classroom.yml" in files
    assert ".github/workflows/grade.yml" not in files


def test_release_refuses_a_folder_in_the_way_and_the_course_itself(tmp_path: Path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.txt").write_text("mine")
    assert release.main([str(tmp_path / "full"), "--allow-dirty"]) == 2
    assert (tmp_path / "full" / "notes.txt").read_text() == "mine"
    assert release.main([str(ROOT / "release"), "--allow-dirty"]) == 2
    with pytest.raises(SystemExit):
        release.main([str(tmp_path / "new"), "--workflow", "gitlab"])


@pytest.mark.slow
def test_grading_the_release_finds_every_exercise_not_implemented(python: Path, out: Path):
    done = run(python, out, "-m", "annotated_transformer", "grade", "--json", "r.json",
               "--verify-manifest", "tests/graded/grading_manifest.json")
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads((out / "r.json").read_text())
    statuses = {row["id"]: row["status"] for row in data["exercises"]}
    assert len(statuses) >= 20
    assert set(statuses.values()) == {"not implemented"}, statuses
    assert data["tampered"] == []
    (out / "r.json").unlink()


def test_the_package_uses_the_learners_parts_in_a_release(python: Path, out: Path):
    script = textwrap.dedent("""
        import warnings
        import torch
        from annotated_transformer import Parts
        from annotated_transformer.data import make_task
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parts = Parts.reference()
        print("describe:", parts.describe())
        print("warned:", any("student release" in str(w.message) for w in caught))
        print("warned at:", [f"{w.filename}:{w.lineno}" for w in caught])
        try:
            parts.positional_encoding(4, 6)
        except NotImplementedError as error:
            print("stub:", error)
        try:
            Parts("fast").module(5)
        except ModuleNotFoundError as error:
            print("fast:", error)
        src, tgt = make_task("dates").sample(2, torch.Generator().manual_seed(0))
        print("dates:", tuple(src.shape))
    """)
    done = run(python, out, "-c", script)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(": ", 1) for line in done.stdout.splitlines())
    assert lines["describe"] == "exercises" and lines["warned"] == "True"
    assert lines["warned at"] == "['<string>:8']", "the warning names the caller's line"
    assert lines["stub"].startswith("Exercise 1.1")
    assert "student release" in lines["fast"]
    assert lines["dates"].startswith("(2, ")

    train = run(python, out, "-m", "annotated_transformer", "train", "--task", "copy",
                "--steps", "1", "--out", "runs/copy")
    assert train.returncode == 1
    assert "student release" in train.stderr and "Traceback" not in train.stderr
    assert train.stderr.splitlines()[-1].startswith("error: Exercise 5.8: EncoderDecoder")
    mine = run(python, out, "-m", "annotated_transformer", "train", "--task", "copy",
               "--steps", "1", "--out", "runs/copy", "--parts", "exercises")
    assert mine.returncode == 1 and "student release" not in mine.stderr, mine.stderr
    bench = run(python, out, "-m", "annotated_transformer", "bench", "--quick")
    assert bench.returncode == 2 and "student release" in bench.stderr
    again = run(python, out, "-m", "annotated_transformer", "release", str(out.parent / "again"))
    assert again.returncode == 2 and "not from a release" in again.stderr
    assert not (out.parent / "again").exists()


@pytest.mark.slow  # two short training runs in a release
def test_a_finished_learner_s_parts_train_both_kinds_of_model(python: Path, out: Path,
                                                              tmp_path: Path):
    """A learner's folder with every exercise done (the reference's files, copied as a
    learner would hand them in) trains the encoder-decoder and both language models (Chapter
    8's progressions and its real text) through ``train --parts``: their own EncoderDecoder
    (5.8) and DecoderOnlyTransformer (8.5), stacks and train_step (6.5), in a release where
    no reference exists."""
    finished = tmp_path / "finished"
    finished.mkdir()
    for path in (ROOT / "solutions").glob("ch0*.py"):
        shutil.copy(path, finished / path.name)
    text = ("--data", "chapters/data/tiny-shakespeare/input.txt")  # Chapter 8's real text
    for task, kind, data in (("dates", "encoder-decoder", ()), ("addition", "decoder-only", ()),
                             ("text", "decoder-only", text)):
        done = run(python, out, "-m", "annotated_transformer", "train", "--task", task, *data,
                   "--steps", "3", "--out", str(tmp_path / task), "--parts", str(finished),
                   "--no-progress")
        assert done.returncode == 0, done.stderr
        saved = torch.load(tmp_path / task / "checkpoint.pt", weights_only=False)
        assert saved["kind"] == kind and saved["step"] == 3, (saved.get("kind"),
                                                                    saved.get("step"))


@pytest.mark.slow
def test_a_release_notebook_runs_until_it_needs_an_unfinished_exercise(python: Path,
                                                                       out: Path):
    script = textwrap.dedent("""
        import json, sys
        import nbformat
        from nbclient import NotebookClient
        from nbclient.exceptions import CellExecutionError
        notebook = nbformat.read(sys.argv[1], as_version=4)
        client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": "chapters"}})
        ran, error = 0, None
        with client.setup_kernel():
            for index, cell in enumerate(notebook.cells):
                if cell.cell_type != "code":
                    continue
                try:
                    client.execute_cell(cell, index)
                except CellExecutionError as failure:
                    error = f"{failure.ename}: {failure.evalue}"
                    break
                ran += 1
        print(json.dumps({"ran": ran, "error": error}))
    """)
    done = run(python, out, "-c", script, "chapters/01_positional_encoding.ipynb")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ran"] >= 2, result  # imports, the parts (with the release's warning), ...
    assert result["error"].startswith("NotImplementedError: Exercise 1."), result


@pytest.mark.slow
def test_one_verdict_in_the_course_and_in_a_release(python: Path, out: Path, tmp_path: Path):
    """The same files get the same points from the course's grader and from a release's,
    forbidden-op checks included (a release has no reference to compare with, and needs
    none)."""
    from grading.test_grading_security import CHEATS, HONEST  # tests/grading


    verdicts = {}
    for name, text in (("honest", HONEST), ("alias", CHEATS["alias outside the function"][0]),
                       ("softmin", CHEATS["softmin of -x"][0])):
        folder = tmp_path / name
        stubs.write_stubs(folder)
        (folder / "ch02_attention.py").write_text(text)
        course = grade_run([2], str(folder), seed=5).rows()
        done = run(python, out, "-m", "annotated_transformer", "grade", "--parts", str(folder),
                   "--chapter", "2", "--seed", "5", "--json", str(tmp_path / f"{name}.json"))
        assert done.returncode == 0, done.stdout + done.stderr
        released = json.loads((tmp_path / f"{name}.json").read_text())["exercises"]
        verdicts[name] = {row.id: (row.points, row.status) for row in course}
        assert verdicts[name] == {row["id"]: (row["points"], row["status"]) for row in released}
    assert verdicts["honest"]["2.1"][1] == "passed"
    assert verdicts["alias"]["2.1"] == verdicts["softmin"]["2.1"] == (0, "forbidden")


def test_grading_solutions_in_a_release_says_it_grades_the_learner_s_exercises(python: Path,
                                                                              out: Path):
    """A release has no solutions/: ``grade --parts solutions`` grades the learner's own
    exercises/, and the report's header says so."""
    done = run(python, out, "-m", "annotated_transformer", "grade", "--parts", "solutions",
               "--exercise", "1.1")
    assert done.returncode == 0, done.stdout + done.stderr
    header = done.stdout.splitlines()[0]
    assert "this student release has no solutions/, so your own exercises were graded" in \
        header, header
    assert str(out / "exercises") in header
