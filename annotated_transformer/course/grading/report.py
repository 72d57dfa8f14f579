"""A grading run's :class:`Report` and every format it is written in: the terminal's table,
one line of score, JSON (read back by :meth:`Report.from_json`), Markdown for a CI job
summary, JUnit XML, and for a report of nothing graded the points on offer."""

from __future__ import annotations

import os
import re
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from annotated_transformer.course.grading.messages import CONTROL, markdown_code, one_line
from annotated_transformer.course.grading.outcomes import Outcome
from annotated_transformer.course.grading.protocol import cut
from annotated_transformer.course.grading.results import ExerciseResult, TestRecord

# Characters that XML 1.0 cannot hold (JUnit).
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@dataclass
class Integrity:
    """How a submission's grading files compare with the course's manifest."""

    manifest: str  # the manifest's path, as given
    submission: str  # the repository that was compared with it
    changes: dict[str, str]  # {path: "changed" | "missing" | "added"}
    used: bool  # True: those files graded this run (the grader ran from the submission)

    def lines(self) -> list[str]:
        if not self.changes:
            return [f"Grading files: as in the course's manifest ({self.manifest})."]
        listed = cut(", ".join(f"{one_line(path)} ({change})"
                               for path, change in self.changes.items()))
        effect = ("These files graded this run: compare the submission with the course." if
                  self.used else "The course's own copies graded this run, not these.")
        return [f"TAMPERED: {len(self.changes)} grading file(s) differ from the course's "
                f"manifest ({self.manifest}): {listed}.", effect]


@dataclass
class WorkflowCheck:
    """The submission's committed workflow files against the course's copies.

    GitHub runs the submission's copy of a workflow: a learner can change what it does, so a
    learner's CI grade is advisory, whatever this says; the instructor's re-grade is the
    grade to trust."""

    folder: str  # the submission's .github/workflows
    changes: dict[str, str]  # {file name: "changed" | "added"}

    def lines(self) -> list[str]:
        """What every report says about it."""
        if not self.changes:
            return [f"Workflows: {self.folder} holds the course's copies (a learner's CI is "
                    f"advisory all the same: the instructor's re-grade is the grade to trust)."]
        listed = cut(", ".join(f"{one_line(name)} ({how})" for name, how in self.changes.items()))
        return [f"WORKFLOW CHANGED: {listed} in {self.folder} differ from the course's.",
                "GitHub ran the submission's copy: this run may not be the course's grading; "
                "re-grade the submission to be sure."]


def _first_line(message: str) -> str:
    """A message's first line for a one-line report, without control characters."""
    lines = cut(message).splitlines()
    return CONTROL.sub("\ufffd", lines[0]) if lines else ""


def _points(value: float) -> str:
    return f"{round(value, 2):g}"


@dataclass
class Report:
    """What one grading run found, and its formats."""

    rows: list[ExerciseResult]
    parts: str | None  # what --parts graded; None: nothing was (the points on offer)
    integrity: Integrity | None = None
    seed: int | None = None
    workflow: WorkflowCheck | None = None
    records: list[TestRecord] | None = field(default=None, repr=False)  # the tests'
    sandbox: str | None = None  # the boundary the code under test ran in (boundary.describe)
    show_output: bool = False  # the table shows what every test printed, not only failing
    folder: str = ""  # the folder --parts graded, as runspec.described_folder says it

    @property
    def points(self) -> float:
        return sum(r.points for r in self.rows)

    @property
    def max_points(self) -> float:
        return sum(r.max_points for r in self.rows)

    @property
    def percent(self) -> float:
        return 100 * self.points / self.max_points if self.max_points else 0.0

    @property
    def alarm(self) -> bool:
        """Whether a reader must not miss something: tampering, a changed workflow."""
        return bool((self.integrity and self.integrity.changes)
                    or (self.workflow and self.workflow.changes))

    def passed_count(self) -> int:
        """How many exercises passed every test."""
        return sum(r.status == Outcome.PASSED for r in self.rows)

    def _graded(self, markdown: bool = False) -> str:
        if self.parts is None:
            return "Nothing graded: the points on offer"
        code, folder = "`" if markdown else "", self.folder
        graded = f"Graded: {code}--parts {self.parts}{code}" + (f" ({folder})" if folder else "")
        if self.seed is not None:
            graded += (f", random inputs from seed {self.seed} (the same again: "
                       f"{code}--seed {self.seed}{code})")
        return graded + (f"\nSandbox: {self.sandbox}" if self.sandbox else "")

    def table(self) -> str:
        """The table for the terminal: one line an exercise, what to look at, the total."""
        lines = [self._graded(), ""]
        width = max([len(r.title) for r in self.rows] + [5])
        lines.append(f"{'id':<5} {'exercise':<{width}} {'points':>7}  status")
        for row in self.rows:
            score = f"{_points(row.points)}/{_points(row.max_points)}"
            lines.append(f"{row.id:<5} {row.title:<{width}} {score:>7}  {row.status}")
            if row.status != Outcome.PASSED or row.message:
                named = f" [mistake {row.mistake}]" if row.mistake else ""
                lines.append(f"{'':<5} -> {_first_line(row.message)}{named}")
            if row.printed and (row.status != Outcome.PASSED or self.show_output):
                printed = row.printed.rstrip().splitlines()[-5:]  # its last lines, each cut
                lines += [f"{'':<5}    your code printed: " + CONTROL.sub("\ufffd", line[:200])
                          for line in printed]
        lines += ["", f"Total: {_points(self.points)}/{_points(self.max_points)} points "
                  f"({self.passed_count()}/{len(self.rows)} exercises with all tests passed)"]
        if self.integrity is not None:
            lines += ["", *self.integrity.lines()]
        if self.workflow is not None:
            lines += ["", *self.workflow.lines()]
        return "\n".join(lines)

    def offer(self) -> str:
        """The points on offer: one line an exercise, the chapter totals and the course's."""
        width = max([len(r.title) for r in self.rows] + [5])
        lines = [f"{'id':<5} {'exercise':<{width}} {'points':>6}"]
        for chapter in sorted({r.chapter for r in self.rows}):
            rows = [r for r in self.rows if r.chapter == chapter]
            lines += [f"{r.id:<5} {r.title:<{width}} {_points(r.max_points):>6}" for r in rows]
            total = _points(sum(r.max_points for r in rows))
            lines.append(f"{'':<5} {f'chapter {chapter}':>{width}} {total:>6}")
        lines += ["", f"Total: {_points(self.max_points)} points"]
        return "\n".join(lines)

    def score(self) -> str:
        """The total on one line, with what a reader must not miss (tampering, the workflow)."""
        score = (f"{_points(self.points)}/{_points(self.max_points)} points from passed tests "
                 f"({self.passed_count()}/{len(self.rows)} exercises with every test passed)")
        if self.integrity and self.integrity.changes:
            score += f"; TAMPERED: {cut(', '.join(map(one_line, sorted(self.integrity.changes))))}"
        if self.workflow and self.workflow.changes:
            score += f"; WORKFLOW CHANGED: {cut(', '.join(map(one_line, self.workflow.changes)))}"
        return score

    def to_json(self) -> dict[str, Any]:
        """The JSON report: the rows, the totals, and (null when not checked) the grading
        files that differ from the course's manifest and the workflow file the CI job ran."""
        rows = self.rows
        return {
            "tampered": sorted(self.integrity.changes) if self.integrity else None,
            "integrity": asdict(self.integrity) if self.integrity else None,
            "workflow": ({**asdict(self.workflow), "changed": bool(self.workflow.changes)}
                         if self.workflow else None),
            "parts": self.parts,
            "folder": self.folder,
            "seed": self.seed,
            "sandbox": self.sandbox,
            "exercises": [r.to_json() for r in rows],
            "points": self.points,
            "max_points": self.max_points,
            "chapters": {
                str(c): {"points": sum(r.points for r in rows if r.chapter == c),
                         "max_points": sum(r.max_points for r in rows if r.chapter == c)}
                for c in sorted({r.chapter for r in rows})
            },
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Report:
        """The report that :meth:`to_json` wrote (its rows, not the tests' records)."""
        rows = [ExerciseResult.from_json(row) for row in data["exercises"]]
        return cls(rows, data.get("parts"),
                   Integrity(**data["integrity"]) if data.get("integrity") else None,
                   data.get("seed"),
                   WorkflowCheck(data["workflow"]["folder"], data["workflow"]["changes"])
                   if data.get("workflow") else None, sandbox=data.get("sandbox"),
                   folder=str(data.get("folder") or ""))

    def markdown(self) -> str:
        """The table as Markdown (for a CI job summary)."""
        lines = [f"### Grading: {_points(self.points)}/{_points(self.max_points)} points "
                 f"from passed tests", "", self._graded(markdown=True), "",
                 "| id | exercise | points | status | what to look at | mistake |",
                 "| --- | --- | --- | --- | --- | --- |"]
        for row in self.rows:
            # The message may quote the learner's code: data in a code span, never markup.
            message = markdown_code(_first_line(row.message), table=True) if row.message else ""
            lines.append(f"| {row.id} | {row.title} | {_points(row.points)}/"
                         f"{_points(row.max_points)} | {row.status} | {message} | "
                         f"{f'`{row.mistake}`' if row.mistake else ''} |")
        for check in (self.integrity, self.workflow):
            if check is not None:  # it names the submission's files: data, not markup
                warning = markdown_code(" ".join(check.lines()))
                lines += ["", f"> **{warning}**" if check.changes else warning]
        return "\n".join(lines) + "\n"

    def junit(self) -> str:
        """JUnit XML: one test case per graded test (the records: a report read back from
        JSON has none), grouped in one suite per chapter, and with ``integrity`` or
        ``workflow`` one more suite whose test cases fail when grading files or the workflow
        file were changed. Messages are cut and hold only what XML can."""
        from xml.etree import ElementTree as ET

        if self.records is None:
            raise ValueError("JUnit needs the graded tests' records; a report read back "
                             "from JSON has only the exercises")
        root = ET.Element("testsuites", name="annotated_transformer grade")
        suites: dict[Any, ET.Element] = {}
        for record in self.records:
            message = _NOT_XML.sub("\ufffd", record.message)
            chapter = record.chapter
            if chapter not in suites:
                suites[chapter] = ET.SubElement(root, "testsuite", name=f"chapter {chapter}")
            case = ET.SubElement(suites[chapter], "testcase", name=record.test,
                                 classname=f"exercise {record.exercise}")
            if record.mistake:  # the known mistake its message names
                properties = ET.SubElement(case, "properties")
                ET.SubElement(properties, "property", name="mistake", value=record.mistake)
            if record.printed:  # what the code under test printed in this test
                ET.SubElement(case, "system-out").text = _NOT_XML.sub("\ufffd", record.printed)
            if record.outcome == Outcome.SKIPPED:
                ET.SubElement(case, "skipped", message=message)
            elif record.outcome != Outcome.PASSED:
                ended = "error" if record.outcome == Outcome.ERROR else "failure"
                ET.SubElement(case, ended, message=message, type=record.outcome.value)
        integrity, workflow = self.integrity, self.workflow
        if integrity is not None or workflow is not None:
            suite = suites["integrity"] = ET.SubElement(root, "testsuite", name="integrity")
        if integrity is not None:
            case = ET.SubElement(suite, "testcase", name="the grading files are the course's",
                                 classname=integrity.manifest)
            if integrity.changes:
                message = _NOT_XML.sub("\ufffd", cut(" ".join(integrity.lines())))
                ET.SubElement(case, "failure", message=message, type="tampered")
        if workflow is not None:
            case = ET.SubElement(suite, "testcase", name="the workflows are the course's",
                                 classname=workflow.folder)
            if workflow.changes:
                message = _NOT_XML.sub("\ufffd", " ".join(workflow.lines()))
                ET.SubElement(case, "failure", message=message, type="workflow-changed")
        for suite in suites.values():
            suite.set("tests", str(len(suite)))
            suite.set("failures", str(sum(c.find("failure") is not None for c in suite)))
            suite.set("errors", str(sum(c.find("error") is not None for c in suite)))
            suite.set("skipped", str(sum(c.find("skipped") is not None for c in suite)))
            if self.seed is not None:
                properties = ET.Element("properties")
                ET.SubElement(properties, "property", name="seed", value=str(self.seed))
                suite.insert(0, properties)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_report(path: Path, text: str) -> None:
    """Write a report whole or not at all: a partial file first, renamed into place."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
