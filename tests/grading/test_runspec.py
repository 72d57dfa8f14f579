"""One grading run, described once (course.grading.runspec): what grade and regrade hand the
graded tests as one file, and the single places where its choices are made."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from annotated_transformer.course.grading import boundary
from annotated_transformer.course.grading.limits import DEFAULT_CPU_SECONDS
from annotated_transformer.course.grading.runspec import (
    RunSpec,
    graded_sources,
    is_trusted,
    learner_folder,
)
from annotated_transformer.layout import EXERCISES_DIR
from annotated_transformer.sources import Source

PACKAGE = Path(__file__).resolve().parents[2] / "annotated_transformer"
GRADED = Path(__file__).resolve().parents[1] / "graded"


def test_a_run_reads_back_what_was_written(tmp_path):
    spec = RunSpec.new(f"solutions,{tmp_path}", seed=7, cpu_seconds=2.5, sandbox="none",
                       exercises=["2.1", "6.5"])
    assert spec.sources == (Source("solutions"), Source("folder", tmp_path.resolve()))
    assert spec.parts == f"solutions,{tmp_path.resolve()}", "written as --parts, resolved"
    assert spec.exercises == ("2.1", "6.5")
    spec.write(tmp_path / "run.json")
    assert RunSpec.read(tmp_path / "run.json") == spec


def test_the_grader_refuses_the_fast_parts_and_names_the_folder_form():
    with pytest.raises(ValueError, match=r"\./fast"):
        graded_sources("solutions,fast")
    assert graded_sources("variants") == (Source("variants"),)


def test_a_source_grades_a_learner_folder_or_the_course_own_code(tmp_path):
    """What a source means to the grader: the learner's folder it confines a worker to, or
    the course's own code, which shares one worker."""
    folder = Source.parse(str(tmp_path))
    assert learner_folder(Source("exercises")) == EXERCISES_DIR.resolve()
    assert learner_folder(folder) == tmp_path.resolve()
    for own in (Source("solutions"), Source("fast"), Source.of_variant("softmax_right")):
        assert learner_folder(own) is None and is_trusted(own), own
    assert not is_trusted(folder) and not is_trusted(Source("exercises"))


def test_a_seed_is_drawn_only_when_none_is_given():
    assert RunSpec.new("solutions", seed=0).seed == 0
    drawn = {RunSpec.new("solutions").seed for _ in range(5)}
    assert len(drawn) > 1, "a fresh seed each run"
    assert RunSpec.new("solutions").cpu_seconds == DEFAULT_CPU_SECONDS


@pytest.mark.parametrize("text, named", [
    ('{"sources": "solutions", "speed": 3}', "not a grading run"),
    ("[1, 2]", "not a grading run"),
    ("{", "cannot read"),
    ('{"sources": "solutions", "sandbox": "auto"}', "'auto'"),
])
def test_a_broken_run_file_is_a_clear_error(text, named, tmp_path):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(ValueError, match=named):
        RunSpec.read(tmp_path / "run.json")


def test_the_sandbox_is_decided_in_one_place(monkeypatch):
    monkeypatch.setattr(boundary, "unavailable", lambda: "no bwrap here")
    assert boundary.decide("auto") == "none" and boundary.decide("none") == "none"
    with pytest.raises(ValueError, match="no bwrap here"):
        boundary.decide("bubblewrap")
    monkeypatch.setattr(boundary, "unavailable", lambda: None)
    assert boundary.decide("auto") == "bubblewrap"


def _sources_of(pattern: str) -> list[str]:
    found = []
    for path in [*PACKAGE.rglob("*.py"), *GRADED.glob("*.py")]:
        if re.search(pattern, path.read_text()):
            found.append(path.name)
    return sorted(found)


def test_one_seed_draw_one_sandbox_decision_one_default_of_cpu_seconds():
    assert _sources_of(r"secrets\.randbelow|random\.randrange\(2") == ["runspec.py"]
    assert _sources_of(r"boundary\.unavailable\(\)|\bunavailable\(\) if") == ["boundary.py"]
    assert _sources_of(r"DEFAULT_CPU_SECONDS = |cpu.seconds.*default=\d") == ["limits.py"]
    assert _sources_of(r"--grade-(seed|sandbox|cpu-seconds|exercises|report)") == []


def test_grade_reports_on_one_source_and_says_so_for_several(capsys):
    """``grade --parts a,b`` is refused up front, naming what to do, never a traceback
    after the run (the graded tests take a comma list; a learner's report is one source's)."""
    from annotated_transformer.course.grading import grade

    with pytest.raises(SystemExit) as stopped:
        grade.main(["--parts", "solutions,exercises", "--exercise", "2.1", "--no-cache"])
    assert stopped.value.code == 2
    assert "grade reports on one source at a time, got 2" in capsys.readouterr().err
