"""The copy check (``identical-file``): only files rare in the class and long enough to
mean something, never the learner's release's stub, said with how rare; and a learner's
feedback that names no classmate (the pairs are in the instructor's ``flags.md``).

The classes are hand-made chapter files in temporary folders; nothing is graded."""

from __future__ import annotations

import ast
from pathlib import Path

from annotated_transformer.course.grading.results import ExerciseResult
from annotated_transformer.course.instructor import class_folder, gradebook, submissions
from annotated_transformer.course.instructor.gradebook import Gradebook, Learner
from annotated_transformer.layout import EXERCISES_DIR, SOLUTIONS_DIR

CH01, CH04 = "ch01_positional_encoding.py", "ch04_masking.py"
ASIDE = "comments, spacing and docstrings aside"


def reference(name: str = CH01) -> str:
    return (SOLUTIONS_DIR / name).read_text()


def own_answer(i: int) -> str:
    """A chapter 1 of its own: the reference with another base for the frequencies."""
    text = reference().replace("math.log(10000.0)", f"math.log({10001 + i}.0)")
    assert text != reference()
    return text


def handed_in(tmp_path: Path, files: dict[str, str], name: str = CH01,
              release_stubs: dict[str, str] | None = None) -> dict[str, Learner]:
    """Each learner's ``name`` (``files``: ``{learner: text}``), collected as regrade
    does; ``{learner: Learner}``."""
    learners = {}
    for learner, text in files.items():
        folder = tmp_path / learner / "exercises"
        folder.mkdir(parents=True)
        (folder / name).write_text(text)
        out = tmp_path / f"{learner}-out"
        out.mkdir()
        who = learners[learner] = Learner(learner, learner)
        chapter = int(name[2:4])
        submissions.collect_exercises(tmp_path / learner, [chapter], out, who, release_stubs)
    return learners


def test_chapter_files_alike_but_for_comments_and_spacing_are_flagged_with_how_rare(tmp_path):
    source = reference()
    copied = "# my own work\n\n" + "\n".join(  # comments added, spacing changed
        f"{line}    # mine" if line.lstrip().startswith("return ") else line
        for line in source.splitlines())
    learners = handed_in(tmp_path, {"ann": source, "ben": copied, "cy": own_answer(1)})
    assert submissions.same_files(learners) == {
        "ann": [f"{CH01} is the same as ben's (shared by 2 of 3), {ASIDE}"],
        "ben": [f"{CH01} is the same as ann's (shared by 2 of 3), {ASIDE}"]}


def reworded_first_docstring(source: str) -> str:
    """``source`` with its first function's or class's docstring in other words."""
    tree = ast.parse(source)
    node = next(n for n in ast.walk(tree)
                if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and ast.get_docstring(n))
    doc = node.body[0]
    lines = source.splitlines()
    lines[doc.lineno - 1:doc.end_lineno] = [" " * doc.col_offset + '"""In my own words."""']
    return "\n".join(lines) + "\n"


def test_a_docstring_changed_does_not_hide_a_copied_chapter_file(tmp_path):
    """The fingerprint sets docstrings aside: a copy with one space added to the module's
    docstring, or a function's docstring reworded, is still flagged with the file it copies
    (though each changes the plain syntax tree); a file whose code differs is not. Three
    of a class of twelve share it: a quarter, still rare enough."""
    source = reference()
    spaced = source.replace('"""', '""" ', 1)
    reworded = reworded_first_docstring(source)
    for copy in (spaced, reworded):
        assert ast.dump(ast.parse(copy)) != ast.dump(ast.parse(source))
    files = {"ann": source, "ben": spaced, "cy": reworded}
    files |= {f"own-{i}": own_answer(i) for i in range(9)}
    found = submissions.same_files(handed_in(tmp_path, files))
    assert found == {
        "ann": [f"{CH01} is the same as ben, cy's (shared by 3 of 12), {ASIDE}"],
        "ben": [f"{CH01} is the same as ann, cy's (shared by 3 of 12), {ASIDE}"],
        "cy": [f"{CH01} is the same as ann, ben's (shared by 3 of 12), {ASIDE}"]}


def test_a_file_more_than_a_quarter_of_the_class_shares_is_not_flagged(tmp_path):
    """Of eight learners, three hand in the same file (more than a quarter: the obvious
    answer, not a copy) and two another: only the pair is flagged."""
    files = {f"same-{i}": reference() for i in range(3)}
    files |= {"pair-a": own_answer(1), "pair-b": own_answer(1)}
    files |= {f"own-{i}": own_answer(10 + i) for i in range(3)}
    found = submissions.same_files(handed_in(tmp_path, files))
    assert sorted(found) == ["pair-a", "pair-b"], found
    assert found["pair-a"] == [f"{CH01} is the same as pair-b's (shared by 2 of 8), {ASIDE}"]
    assert submissions.rare_enough(2, 3) and submissions.rare_enough(10, 40)
    assert not submissions.rare_enough(11, 40) and not submissions.rare_enough(1, 40)


def test_a_few_lines_of_code_of_its_own_are_not_flagged(tmp_path):
    """Chapter 4's answers are seven lines beside the stub (three one-line functions and
    their checks): two learners with the reference's are not flagged; chapter 1's are."""
    learners = handed_in(tmp_path / "4", {"ann": reference(CH04), "ben": reference(CH04),
                                          "cy": (EXERCISES_DIR / CH04).read_text()}, CH04)
    assert all(who.fingerprints == {} for who in learners.values())
    assert submissions.same_files(learners) == {}
    longer = handed_in(tmp_path / "1", {"ann": reference(), "ben": reference(),
                                        "cy": own_answer(1)})
    assert sorted(submissions.same_files(longer)) == ["ann", "ben"]


def test_the_stub_of_the_learner_s_release_is_set_aside(tmp_path):
    """Two learners who left chapter 1 as their release gave it (an older stub, with more
    code given than the course's now) are not "the same"; graded against the course's stub
    alone, they would be."""
    stub = (EXERCISES_DIR / CH01).read_text()
    given = "\n".join(f"def given_{i}(x):\n    return x * {i} + {i}\n" for i in range(6))
    older = stub + "\n\n" + given
    files = {"ann": older, "ben": older, "cy": own_answer(1)}
    assert submissions.same_files(handed_in(tmp_path / "course", files)) != {}
    learners = handed_in(tmp_path / "release", files, release_stubs={CH01: older})
    assert submissions.same_files(learners) == {}
    assert learners["ann"].fingerprints == {}


def row(learner: str, exercise: str = "1.1", points: float = 2) -> ExerciseResult:
    return ExerciseResult(exercise, 1, f"title {exercise}", points, 2,
                          "passed" if points == 2 else "failed", "", learner=learner, seed=1)


def test_a_learner_s_feedback_names_no_classmate_and_flags_md_names_the_pairs(tmp_path):
    """The copy check's pairs and a release other than the class's reach the instructor's
    flags.md and the gradebook; no learner's feedback shows them, nor any classmate's name,
    while the learner's own flags stay in it."""
    names = ["Quentin Aster", "Rosalind Birch", "Sigrid Cole", "Tobias Dunn"]
    book = Gradebook(chapters=[1])
    for name in names:
        who = Learner(name, f"/subs/{name}", seed=1)
        book.put(who, [row(name)])
    for name in names[:2]:
        book.learners[name].fingerprints = {CH01: "same"}
    book.learners[names[3]].release = "a" * 40
    book.learners[names[3]].flag("other-branch", "dev holds 1 commit(s) the graded one lacks")
    class_folder.flag_against_class(book)
    assert sorted(book.learners[names[0]].flags) == ["identical-file"]
    assert book.learners[names[3]].flags["release-other"] == [
        f"graded against the release of commit {'a' * 12}; 3 of 4 learners against the "
        f"course as it is now"]
    gradebook.write(tmp_path, book, {"seed": 1})
    for name in names:
        text = (tmp_path / "feedback" / f"{gradebook.feedback_name(name)}.md").read_text()
        assert name in text
        for other in names:
            if other != name:
                assert other not in text and other.split()[0] not in text, (name, other)
        assert "identical-file" not in text and "release-other" not in text
    own = tmp_path / "feedback" / f"{gradebook.feedback_name(names[3])}.md"
    assert "other-branch" in own.read_text(), "the learner's own flags stay"
    report = (tmp_path / "flags.md").read_text()
    assert f"is the same as {names[1]}'s (shared by 2 of 4)" in report
    assert f"is the same as {names[0]}'s (shared by 2 of 4)" in report
    assert "release-other" in report and "other-branch" in report
    assert names[2] not in report, "a learner without a flag is not listed"
