"""What a whole class got right and wrong: the summary ``regrade`` writes beside the gradebook.

Per exercise, how many learners pass it, and the known mistakes the grader named
(``tests/graded/mistakes.py``) with how many learners made each, most common first: as
Markdown (``class-summary.md``) and as a figure for a lecture (``class-summary.png``). A
learner counts once per mistake, however many tests named it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from annotated_transformer.course.grading import dependencies
from annotated_transformer.course.grading.messages import markdown_code
from annotated_transformer.course.grading.outcomes import Outcome
from annotated_transformer.course.grading.report import write_report
from annotated_transformer.course.grading.results import ExerciseResult


@dataclass
class ExerciseSummary:
    """One exercise over the class."""

    id: str
    title: str
    learners: int = 0  # graded on it
    passed: int = 0  # with every test passed
    mistakes: Counter[str] = field(default_factory=Counter)  # {mistake id: learners}
    unnamed: int = 0  # did not pass for a reason of its own, with no known mistake named
    blocked: int = 0  # did not pass because an exercise it builds on does not
    not_started: int = 0  # still the release's stub
    example: dict[str, str] = field(default_factory=dict)  # {mistake id: a message naming it}


def summarize(rows: Iterable[ExerciseResult]) -> list[ExerciseSummary]:
    """The class's summary from the gradebook's results; those of submissions not graded
    are left out."""
    found: dict[str, ExerciseSummary] = {}
    for row in rows:
        if not row.id:  # a submission that could not be graded
            continue
        entry = found.setdefault(row.id, ExerciseSummary(row.id, row.title))
        entry.learners += 1
        mistake = row.mistake
        if row.status == Outcome.PASSED:
            entry.passed += 1
        elif mistake:
            entry.mistakes[mistake] += 1
            entry.example.setdefault(mistake, row.message)
        elif row.status == Outcome.NOT_IMPLEMENTED:
            entry.not_started += 1
        elif row.blocked_by:  # the grader's record, never the message's text
            entry.blocked += 1
        else:
            entry.unnamed += 1
    return [found[e] for e in sorted(found, key=dependencies.order)]


def most_common(summary: list[ExerciseSummary]) -> list[tuple[str, int]]:
    """Every named mistake of the class with its learners, most common first (then by id)."""
    counts = sum((entry.mistakes for entry in summary), Counter())
    return sorted(counts.items(), key=lambda item: (
        -item[1], dependencies.order(item[0].split("/")[0]), item[0]))


def markdown(summary: list[ExerciseSummary], learners: int) -> str:
    """The summary as Markdown: a table of exercises, then the named mistakes."""
    lines = ["# Class summary", "",
             f"{learners} submission(s). Per exercise: how many learners pass it, and the "
             f"known mistakes the grader named, with how many learners made each.", "",
             "Besides the named mistakes: *blocked*, learners whose exercise fails because one "
             "it builds on does not pass; *not started*, still the release's stub; *other*, "
             "failures no known mistake explains.", "",
             "| exercise | title | pass | named mistakes (learners) | blocked | not started "
             "| other |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for entry in summary:
        named = ", ".join(f"`{m}` ({n})" for m, n in entry.mistakes.most_common())
        title = entry.title.replace("|", "\\|")  # the course's own title
        lines.append(f"| {entry.id} | {title} | {entry.passed}/{entry.learners} | "
                     f"{named or '-'} | {entry.blocked} | {entry.not_started} | "
                     f"{entry.unnamed} |")
    ranked = most_common(summary)
    lines += ["", "## The named mistakes, most common first", ""]
    if not ranked:
        lines.append("No known mistake was named.")
    examples = {m: e.example[m] for e in summary for m in e.example}
    for mistake, count in ranked:
        text = examples[mistake]
        text = text if len(text) <= 300 else text[:297] + "..."
        # The message (which may quote the learner's code) is shown as data, never as markup.
        lines.append(f"- **`{mistake}`**: {count} learner(s). One of their messages: "
                     f"{markdown_code(text)}")
    return "\n".join(lines) + "\n"


def figure(summary: list[ExerciseSummary], learners: int, path: Path, top: int = 12) -> None:
    """The summary as a PNG: learners passing each exercise (left), the ``top`` most common
    named mistakes (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = most_common(summary)[:top]
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(13, max(4.5, 0.32 * len(summary) + 1.5)),
        gridspec_kw={"width_ratios": [1, 1.3]})
    ids = [e.id for e in summary][::-1]
    passed = [e.passed for e in summary][::-1]
    graded = [e.learners for e in summary][::-1]
    left.barh(ids, graded, color="#e6e6e6", label="graded")
    left.barh(ids, passed, color="#4c9a6a", label="pass")
    left.set_xlim(0, max(graded + [1]))
    left.set_xlabel("learners")
    left.set_title("Learners who pass each exercise", pad=24)
    left.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    left.tick_params(axis="y", labelsize=9)
    if ranked:
        names = [m for m, _ in ranked][::-1]
        counts = [n for _, n in ranked][::-1]
        bars = right.barh(names, counts, color="#c0504d")
        right.bar_label(bars, padding=3, fontsize=9)
        right.set_xlim(0, max(counts) * 1.15)
        right.xaxis.get_major_locator().set_params(integer=True)
        right.tick_params(axis="y", labelsize=9)
    else:
        right.text(0.5, 0.5, "no known mistake named", ha="center", va="center")
        right.set_yticks([])
    right.set_xlabel("learners")
    right.set_title(f"The most common named mistakes (top {min(top, len(ranked))})", pad=24)
    for axis in (left, right):
        axis.spines[["top", "right"]].set_visible(False)
    fig.suptitle(f"Class summary: {learners} submission(s)", fontsize=13)
    fig.tight_layout()
    partial = path.with_name(path.name + ".partial.png")
    fig.savefig(partial, dpi=110)
    plt.close(fig)
    partial.replace(path)


def write(out: Path, rows: Iterable[ExerciseResult], learners: int) -> list[Path]:
    """Write ``class-summary.md`` and ``class-summary.png`` into ``out``; their paths."""
    summary = summarize(rows)
    out.mkdir(parents=True, exist_ok=True)
    write_report(out / "class-summary.md", markdown(summary, learners))
    figure(summary, learners, out / "class-summary.png")
    return [out / "class-summary.md", out / "class-summary.png"]
