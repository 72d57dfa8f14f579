"""Blame only what blocks: a later exercise is told to fix an earlier one only when it called
it while its tests ran and that one's values are wrong; the learner's own named mistake comes
first. Learners written as the reference with edits. (A cosmetic 2.2 under a 3.3 with its
own mistake, and a 1.1 without its ValueError under a wrong 1.2, are graded once, in a class:
tests/instructor/test_realistic_class.py.)"""

from __future__ import annotations

import re
import shutil

import pytest
from grading_run import grade_run

from annotated_transformer.course.authoring import stubs
from annotated_transformer.course.grading import engine
from annotated_transformer.course.grading.results import TestRecord
from annotated_transformer.course.grading.runspec import RunSpec


def learner(tmp_path, chapters, edits):
    """The reference's chapter files ``chapters``, with ``edits``: {file: [(old, new)]}."""
    for chapter in chapters:
        shutil.copy(next(stubs.SOLUTIONS_DIR.glob(f"ch{chapter:02d}_*.py")), tmp_path)
    for name, changes in edits.items():
        path = tmp_path / name
        text = path.read_text()
        for old, new in changes:
            assert old in text, (name, old)
            text = text.replace(old, new, 1)
        path.write_text(text)
    return str(tmp_path)


def rows_of(parts, exercises):
    return {r.id: r for r in grade_run(None, parts, exercises=exercises).rows()}


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_each_exercise_is_graded_on_its_own_code(tmp_path):
    """4.1 and 4.2 wrong; a 4.3 written without them (and wrong on its own) is told only its
    own mistake; a 6.3 that calls the wrong 4.1 is graded with the grader's masks in their
    place: it earns its points, and says that a model of the learner's parts will not
    work until 4.1 is fixed."""
    parts = learner(tmp_path, [1, 2, 3, 4, 5, 6], {"ch04_masking.py": [
        ("return (tokens != pad_id)[:, None, None, :]  # [B, 1, 1, L]",
         "return (tokens == pad_id)[:, None, None, :]"),
        ("return padding_mask(tokens, pad_id) & causal_mask(tokens.size(-1), "
         "device=tokens.device)",
         "return (tokens != pad_id)[:, None, None, :] | torch.ones(tokens.size(-1), "
         "tokens.size(-1), dtype=torch.bool, device=tokens.device).tril()")]})
    rows = rows_of(parts, ["4.1", "4.3", "6.3"])
    assert rows["4.3"].mistake == "4.3/or-for-and", rows["4.3"].message
    assert "fix 4.1" not in rows["4.3"].message and "4.2" not in rows["4.3"].message
    assert rows["6.3"].status == "passed" and rows["6.3"].points == rows["6.3"].max_points
    assert rows["6.3"].message.startswith(
        "Graded with the grader's padding_mask (4.1) and target_mask (4.3) in place of yours"), (
        rows["6.3"].message)


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_a_part_the_code_never_called_is_never_named(tmp_path):
    """The same wrong 4.1, under a 6.3 that writes its masks out itself and so never calls
    4.1 or 4.3: it passes, and its message says nothing of parts it did not use."""
    parts = learner(tmp_path, [1, 2, 3, 4, 5, 6], {"ch04_masking.py": [
        ("return (tokens != pad_id)[:, None, None, :]  # [B, 1, 1, L]",
         "return (tokens == pad_id)[:, None, None, :]")], "ch06_training.py": [
        ("src_mask=parts.padding_mask(src, pad_id),",
         "src_mask=(src != pad_id)[:, None, None, :],"),
        ("tgt_mask=parts.target_mask(tgt_input, pad_id),",
         "tgt_mask=(tgt_input != pad_id)[:, None, None, :] & torch.ones(\n"
         "            tgt_input.size(-1), tgt_input.size(-1), dtype=torch.bool,\n"
         "            device=tgt.device).tril(),")]})
    rows = rows_of(parts, ["4.1", "6.3"])
    assert rows["4.1"].status == "failed", rows["4.1"]
    assert rows["6.3"].status == "passed" and rows["6.3"].points == rows["6.3"].max_points
    assert "4.1" not in rows["6.3"].message and "in place of yours" not in rows["6.3"].message, (
        rows["6.3"].message)


@pytest.mark.slow  # a chapter graded
def test_what_the_code_calls_never_orders_more_tests(tmp_path):
    """A chapter 2 whose 2.2 fails and calls a function it exports as ``Capstone`` (the
    name of 6.6's and 8.6's tests): only chapter 2's tests run, as for a learner who does
    not, and nothing outside chapter 2 is blamed."""
    parts = learner(tmp_path, [1, 2], {"ch02_attention.py": [
        ("    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)",
         "    Capstone()\n    scores = query @ key.transpose(-2, -1)"),
        ("\ndef softmax_jacobian", "\nclass Capstone:\n    pass\n\n\ndef softmax_jacobian")]})
    run = grade_run([2], parts)
    records, rows = run.records, run.rows()
    assert {r.chapter for r in records} == {2}
    assert {r.id for r in rows} == {"2.1", "2.2", "2.3"} and rows[1].status == "failed"
    assert "6.6" not in rows[1].message and "8.6" not in rows[1].message


def test_a_stub_is_never_blamed_and_a_name_another_input_contradicts_is_not_given():
    """The release's stub of 8.3 (entered by the package's decoding, which catches its
    NotImplementedError) is no part to fix first; a 5.4 whose post-LN input fails with no
    name while its pre-LN input looks like "norm_first not passed on" (what a swapped 5.3
    computes there) keeps no name: the message of the input that names none is shown."""
    def record(exercise, outcome, mistake="", message=""):
        return TestRecord("t", exercise, int(exercise[0]), "", 1, outcome, message,
                          values=True, mistake=mistake)

    records = [record("8.3", "not implemented"),
               record("5.4", "failed", message="post-LN differs"),
               record("5.4", "failed", "5.4/norm-first-not-passed-on", "pre-LN: post-LN"),
               record("3.3", "failed", "3.3/one-head"), record("3.3", "failed", "3.3/one-head")]
    assert engine.values_right(records) == {"8.3": None, "5.4": False, "3.3": False}
    assert engine.unsure_names(records) == {"5.4": "post-LN differs"}


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_an_error_in_another_chapter_names_the_graded_line_that_led_there(tmp_path):
    """The capstone 8.6 runs the learner's own parts (no stand-in), and their split_heads
    (3.1) raises: the row names the line of chapter 3 that raised and the line of chapter 8
    that led there."""
    parts = learner(tmp_path, range(1, 9), {"ch03_multi_head.py": [
        ("    # BEGIN SOLUTION 3.1\n",
         "    # BEGIN SOLUTION 3.1\n    raise ValueError(\"bad inputs\")\n")]})
    row = rows_of(parts, ["8.6"])["8.6"]
    assert row.status == "error" and "ValueError: bad inputs" in row.message, row.message
    raised = next(n for n, text in enumerate((tmp_path / "ch03_multi_head.py").read_text()
                                             .splitlines(), 1) if "bad inputs" in text)
    assert f"at ch03_multi_head.py:{raised}, called from ch08_generation.py:" in row.message, (
        row.message)
    line = int(re.search(r"called from ch08_generation\.py:(\d+)", row.message)[1])
    assert "(" in (tmp_path / "ch08_generation.py").read_text().splitlines()[line - 1]


@pytest.mark.slow  # seconds of grading: CI runs it (the README's command stays short)
def test_a_cross_attention_on_x_with_the_memory_s_mask_is_told_it_ignores_the_memory(tmp_path):
    """cross_attn(y, y, y, src_mask) fails on the masks' sizes only; it is not a swap of the
    masks but a cross-attention that never reads the memory, and the row says so."""
    parts = learner(tmp_path, [1, 2, 3, 4, 5], {"ch05_layers.py": [
        ("self.cross_attn(y, memory, memory, src_mask)", "self.cross_attn(y, y, y, src_mask)")]})
    row = rows_of(parts, ["5.5"])["5.5"]
    assert row.status == "failed" and row.mistake == "5.5/memory-unused", row.message


def test_a_folder_without_the_chapter_s_file_is_named_as_given(tmp_path):
    """The worker reads a staged copy of the folder; its messages name the learner's folder."""
    parts = learner(tmp_path, [1, 2], {})
    row = rows_of(parts, ["5.1"])["5.1"]
    assert f"{str(tmp_path)!r} has no file for chapter 5" in row.message, row.message
    assert "grading-learner-" not in row.message


def test_a_contract_fault_inherited_from_a_called_part_is_that_part_s():
    """A right 8.2 that calls a 8.1 leaving the device (8.1 has no stand-in: it would be its
    answer) fails its device test as 8.1 does: it is told to fix 8.1, and no mistake of its
    own is named; an 8.2 named for another contract than 8.1's keeps its name."""
    def record(exercise, mistake, calls=()):
        return TestRecord("t", exercise, 8, "", 1, "failed", f"{exercise}: on the CPU",
                          mistake=mistake, calls=calls)

    def rows(*records):
        graded = engine.Graded(RunSpec.new("solutions"), list(records))
        return {r.id: r for r in graded.rows()}

    calls_8_1 = ("ch08_generation.py:next_token_distribution",)
    inherited = rows(record("8.1", "8.1/device-not-kept"),
                     record("8.2", "8.2/device-not-kept", calls_8_1))["8.2"]
    assert inherited.mistake == "" and inherited.blocked_by == "8.1"
    assert inherited.message.startswith("8.2 uses your next_token_distribution (8.1), which "
                                        "does not pass yet: fix 8.1 first."), inherited.message
    own = rows(record("8.1", "8.1/device-not-kept"),
               record("8.2", "8.2/not-int64", calls_8_1))["8.2"]
    assert own.mistake == "8.2/not-int64" and own.message.startswith("8.2: on the CPU")
    uncalled = rows(record("8.1", "8.1/device-not-kept"),
                    record("8.2", "8.2/device-not-kept"))["8.2"]
    assert uncalled.mistake == "8.2/device-not-kept"
