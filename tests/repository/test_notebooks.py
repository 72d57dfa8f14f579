"""Every chapter notebook is committed fully executed, in order, without errors.

nbval (run by the README's test command) re-executes the notebooks and compares
outputs; it silently skips cells that were never executed, which this test forbids.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

CHAPTERS_DIR = Path(__file__).resolve().parents[2] / "chapters"
NOTEBOOKS = sorted(CHAPTERS_DIR.glob("[0-9][0-9]_*.ipynb"))


def test_chapters_are_present():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert numbers[:2] == [0, 1], numbers
    assert numbers == list(range(len(numbers))), f"chapter numbers have gaps: {numbers}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_code_cell_executed_in_order_without_errors(path):
    notebook = json.loads(path.read_text())
    assert notebook["metadata"]["kernelspec"]["name"] == "python3"
    code = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert code, "a chapter without code"
    counts = [cell["execution_count"] for cell in code]
    assert counts == list(range(1, len(code) + 1)), (
        f"{path.name}: execution counts {counts}; re-execute it with "
        f"`bash scripts/execute_notebooks.sh {path.relative_to(CHAPTERS_DIR.parent)}`"
    )
    for number, cell in enumerate(code, start=1):
        errors = [o for o in cell["outputs"] if o["output_type"] == "error"]
        assert not errors, f"{path.name}, code cell {number} raised {errors[0]['ename']}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_chapters_use_earlier_parts_through_the_package(path):
    sources = "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
                        if cell["cell_type"] == "code")
    direct = re.findall(r"^\s*(?:from|import)\s+(solutions|exercises)\b", sources, re.MULTILINE)
    assert not direct, (
        f"{path.name} imports {direct[0]} directly; use annotated_transformer.Parts so that "
        "the reader can switch between the reference and their own parts"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_exercise_box_says_how_to_grade_it(path):
    markdown = "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"]
                         if cell["cell_type"] == "markdown")
    boxes = re.findall(r"^(:{3,4})\{admonition\} Exercise (\d+)\.(\d+)(.*?)^\1\s*$", markdown,
                       re.MULTILINE | re.DOTALL)
    for _, chapter, number, body in boxes:
        assert f"annotated_transformer grade --chapter {int(chapter)}" in body, (
            f"{path.name}: the box of exercise {chapter}.{number} does not say how to grade it")
    if int(path.name[:2]) > 0:
        assert boxes, f"{path.name}: no exercise boxes (':::{{admonition}} Exercise N.M: ...')"
        assert "Check yourself" in markdown and "{dropdown}" in markdown, (
            f"{path.name}: no 'Check yourself' section with answers in dropdowns")
    assert "Learning goals" in markdown, f"{path.name}: no learning goals"


GLUE_ROLE = re.compile(r"\{glue(?::[a-z]+)?\}`(?:[^`:]+::)?([A-Za-z0-9_]+)(?::[^`]*)?`")


def glue_names(notebook: dict) -> tuple[set[str], set[str]]:
    """(names glued in the code cells' outputs, names cited by `{glue:...}` roles in the prose)."""
    glued = {output["metadata"]["scrapbook"]["name"]
             for cell in notebook["cells"] if cell["cell_type"] == "code"
             for output in cell["outputs"] if "scrapbook" in output.get("metadata", {})}
    cited = {name for cell in notebook["cells"] if cell["cell_type"] == "markdown"
             for name in GLUE_ROLE.findall("".join(cell["source"]))}
    return glued, cited


def test_glue_names_are_found_in_prose_and_outputs():
    notebook = {"cells": [
        {"cell_type": "code", "outputs": [{"output_type": "display_data", "data": {},
                                           "metadata": {"scrapbook": {"name": "loss"}}}]},
        {"cell_type": "markdown", "source": ["ends at {glue:text}`loss:.2f` and "
                                             "{glue:text}`other` {glue}`plot`"]}]}
    assert glue_names(notebook) == ({"loss"}, {"loss", "other", "plot"})


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_every_number_cited_in_the_prose_is_glued_and_every_glued_one_cited(path):
    """A number the prose takes from a computation comes from that computation's output
    (`glue(name, value)` in the code, `{glue:text}`name`` in the markdown), so re-executing
    the notebook updates the prose; a name on one side only is a stale or a lost number."""
    glued, cited = glue_names(json.loads(path.read_text()))
    assert not cited - glued, (
        f"{path.name}: the prose cites {sorted(cited - glued)} but no code cell glues them "
        "(glue(name, value) from annotated_transformer.glue, then re-execute the notebook)")
    assert not glued - cited, (
        f"{path.name}: {sorted(glued - cited)} are glued but never cited in the prose "
        "({glue:text}`name`): cite them or stop gluing them")


# Claims the book once made that were wrong, or numbers typed from runs nobody can repeat
# from the page: each must stay out of every chapter's prose.
REMOVED_CLAIMS = (
    "points most nearly along the query",  # river's key wins by its length (Chapter 2)
    "ended at 98.2%", "stalled near 82%", "about 20 seconds",
    "a quarter of the decoding time", "a sixth less time",
    "random logits are spread widely",  # the untrained model reads its own token (Chapter 8)
    "Chapter 7 uses a GPU",  # Chapter 8 too
    "on every token looks at the one before it",  # "." and "$" look further back
    "Nadaraya and Watson, 1964",  # cited from references.bib instead
    "the larger $d_k$, the slower",  # run at one d_k only
    "Two details come from the paper's section 3.4",  # Xavier is the authors' code's (Chapter 5)
    "The paper's base model has {glue:text}`base_tied`",  # the paper says 65 M; ours counts 63 M
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_removed_claims_stay_out_of_the_prose(path):
    prose = " ".join(" ".join("".join(cell["source"]).split())
                     for cell in json.loads(path.read_text())["cells"]
                     if cell["cell_type"] == "markdown")
    found = [claim for claim in REMOVED_CLAIMS if claim in prose]
    assert not found, f"{path.name} says again what was corrected: {found}"


def test_chapter_0_s_map_has_a_row_for_every_chapter():
    """Chapter 0's "Which chapter builds what" table names every chapter after it."""
    markdown = "\n".join("".join(cell["source"]) for cell in json.loads(NOTEBOOKS[0].read_text())[
        "cells"] if cell["cell_type"] == "markdown")
    table = markdown.split("### Which chapter builds what", 1)[1].split("\n#", 1)[0]
    rows = [int(number) for number in re.findall(r"^\| (\d+) \|", table, flags=re.MULTILINE)]
    assert rows == [int(path.name[:2]) for path in NOTEBOOKS[1:]], (
        f"{NOTEBOOKS[0].name}'s table of which chapter builds what has the rows {rows}")


def test_the_capstone_s_held_out_progressions_are_never_trained_on():
    from annotated_transformer.language_model import HELD_OUT, SEEN, progressions

    assert len(HELD_OUT) == 20 and len(SEEN) == 80 and not set(HELD_OUT) & set(SEEN)
    seen = {tuple(row.tolist()) for row in progressions()[list(SEEN)]}
    assert not any(tuple(row.tolist()) in seen for row in progressions()[list(HELD_OUT)])


def code_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def tags(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_numbers_that_move_with_the_processor_have_their_claims_checked(path):
    """A training run's digits depend on the processor's kernels (the order of a sum), so a
    cell that prints them is tagged `nbval-ignore-output`: nbval runs it but compares
    nothing. If it glues numbers for the prose, the next code cell is tagged `check-claims`
    and `remove-cell` (the book leaves it out) and asserts what the prose says of them,
    so that every machine that runs the notebook checks the claims nbval no longer compares
    digit by digit. A timing is this machine's measurement, which the prose must say
    (`measured-here`), and is never asserted."""
    cells = code_cells(json.loads(path.read_text()))
    for number, (cell, after) in enumerate(zip(cells, cells[1:] + [{}], strict=True), start=1):
        if "nbval-ignore-output" not in tags(cell) or "glue(" not in "".join(cell["source"]):
            continue
        if "measured-here" in tags(cell):
            continue
        assert {"check-claims", "remove-cell"} <= tags(after), (
            f"{path.name}, code cell {number}: its glued numbers move with the processor and "
            "nbval does not compare them; follow it with a cell tagged check-claims and "
            "remove-cell that asserts what the prose says of them")
        assert "assert " in "".join(after["source"]), (
            f"{path.name}, code cell {number + 1} is tagged check-claims but asserts nothing")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_claim_checks_print_nothing(path):
    """A check-claims cell is left out of the book: what it prints would be lost there."""
    for number, cell in enumerate(code_cells(json.loads(path.read_text())), start=1):
        if "check-claims" in tags(cell):
            assert not cell["outputs"], f"{path.name}, code cell {number}: a claim check printed"
