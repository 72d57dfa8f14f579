"""A class as an instructor meets one, graded through the command line: learners' git
repositories (one complete; mistakes of their own in chapters 1-6; one who started nothing;
an endless loop; one who prints a great deal; one repository broken the ways real ones are),
re-graded by ``python -m annotated_transformer regrade`` in bubblewrap into one class folder,
a run per group of chapters (each learner graded only on the chapters they need).

Asserted: the blame, the named mistakes and the points an instructor would give (a cosmetic
failure blocks nothing; the learner's own mistake comes first), and that every output (the
gradebook's CSV and JSON, the wide CSV, the feedback files, the class summary) agrees."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from test_regrade import course_copy

from annotated_transformer.course.grading import boundary, manifest
from annotated_transformer.layout import ROOT, SOLUTIONS_DIR

pytestmark = [pytest.mark.slow, pytest.mark.alone,  # regrade --jobs 2
              pytest.mark.skipif(boundary.unavailable() is not None,
                                 reason=f"no bubblewrap: {boundary.unavailable()}")]


def _simulate_class():
    spec = importlib.util.spec_from_file_location(
        "simulate_class", ROOT / "scripts" / "simulate_class.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(chapter: int) -> Path:
    return next(SOLUTIONS_DIR.glob(f"ch{chapter:02d}_*.py"))


def edited(chapter: int, *changes: tuple[str, str], text: str | None = None) -> str:
    """The reference's chapter file (or ``text``) with each ``(old, new)`` replaced once."""
    text = reference(chapter).read_text() if text is None else text
    for old, new in changes:
        assert old in text, (chapter, old)
        text = text.replace(old, new, 1)
    return text


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=learner", "-c",
                    "user.email=learner@example.com", *args], check=True, capture_output=True)


# A 2.2 right in its values whose ValueErrors name neither d_k nor the tensors.
COSMETIC_2_2 = [
    ('f"query and key must share d_k (their last dimension): query has "\n'
     '                         f"shape {tuple(query.shape)}, key has shape {tuple(key.shape)}"',
     '"the shapes do not fit"'),
    ('f"key and value must have the same length Lk: key has shape "\n'
     '                         f"{tuple(key.shape)}, value has shape {tuple(value.shape)}"',
     '"the shapes do not fit"')]
# A 3.3 of one head over d_model (so scaled by sqrt(d_model)).
ONE_HEAD_3_3 = [
    ("q = split_heads(self.q_proj(query), self.num_heads)", "q = self.q_proj(query).unsqueeze(1)"),
    ("k = split_heads(self.k_proj(key), self.num_heads)", "k = self.k_proj(key).unsqueeze(1)"),
    ("v = split_heads(self.v_proj(value), self.num_heads)", "v = self.v_proj(value).unsqueeze(1)"),
    ("merge_heads(heads)", "heads.squeeze(1)")]
NO_VALUE_ERROR_1_1 = ("    _check_d_model(d_model)\n    if not isinstance(max_len",
                      "    if not isinstance(max_len")
DROPOUT_FIRST_1_2 = ("return self.dropout(x + self.pe[:length].to(x.dtype))",
                     "return self.dropout(x) + self.pe[:length].to(x.dtype)")
PE_BODY = "    _check_d_model(d_model)\n    if not isinstance(max_len"


def the_class(tmp: Path) -> dict[str, Path]:
    """Each learner's repository; ``{name: path}``."""
    sim = _simulate_class()
    pristine = course_copy(tmp / "pristine")
    files: dict[str, dict[int, str]] = {
        "complete": {c: reference(c).read_text() for c in (1, 2, 3)},
        "dana": {1: reference(1).read_text(), 2: edited(2, *COSMETIC_2_2),
                 3: edited(3, *ONE_HEAD_3_3)},
        "eli": {1: edited(1, NO_VALUE_ERROR_1_1, DROPOUT_FIRST_1_2)},
        "fay": {c: reference(c).read_text() for c in (1, 2, 3)} | {4: edited(
            4, ("return (tokens != pad_id)[:, None, None, :]  # [B, 1, 1, L]",
                "return (tokens == pad_id)[:, None, None, :]"),
            # nn.Transformer's convention: True hides
            ("return torch.ones(size, size, dtype=torch.bool, device=device).tril()",
             "return torch.ones(size, size, dtype=torch.bool, device=device).triu(1)"),
            # 4.3 written on its own, calling neither 4.1 nor 4.2, with | for &
            ("return padding_mask(tokens, pad_id) & causal_mask(tokens.size(-1), "
             "device=tokens.device)",
             "return (tokens != pad_id)[:, None, None, :] | torch.ones(tokens.size(-1), "
             "tokens.size(-1), dtype=torch.bool, device=tokens.device).tril()"))},
        "gus": {c: reference(c).read_text() for c in (1, 2, 3, 4)} | {5: edited(
            5, ("mean = x.mean(dim=-1, keepdim=True)", "mean = x.mean(dim=-2, keepdim=True)"),
            ("variance = (x - mean).pow(2).mean(dim=-1, keepdim=True)",
             "variance = (x - mean).pow(2).mean(dim=-2, keepdim=True)"))},
        "hal": {c: reference(c).read_text() for c in (1, 2, 3, 4)} | {5: edited(
            5, ("        if self.norm_first:\n", "        if not self.norm_first:\n"))},
        "ivy": {c: reference(c).read_text() for c in (1, 2, 3, 4)} | {
            5: sim.learner_file(5, {"DecoderLayer": "SelfAttentionUnmasked"}),
            6: sim.learner_file(6, {"make_batch": "shift_reversed"})},
        # The mistakes of the grader's first class of ten, each beside correct later work:
        # LayerNorm's weight and bias swapped (5.5 right)
        "jo": {c: reference(c).read_text() for c in (1, 2, 3, 4)} | {5: edited(
            5, ("* self.weight + self.bias", "* self.bias + self.weight"))},
        # a softmax with no maximum subtracted (2.2, 3.3 and 5.5 right)
        "kim": {c: reference(c).read_text() for c in (1, 3, 4, 5)} | {2: edited(
            2, ("maximum = torch.where(torch.isfinite(maximum), maximum, "
                "torch.zeros_like(maximum))", "maximum = torch.zeros_like(maximum)"))},
        # a LayerNorm without eps (an error of about 1e-5)
        "lee": {c: reference(c).read_text() for c in (1, 2, 3, 4)} | {5: edited(
            5, ("torch.sqrt(variance + self.eps)", "torch.sqrt(variance)"))},
        # an inverted padding mask (4.3, which calls it, right)
        "max": {c: reference(c).read_text() for c in (1, 2, 3)} | {4: edited(
            4, ("return (tokens != pad_id)[:, None, None, :]  # [B, 1, 1, L]",
                "return (tokens == pad_id)[:, None, None, :]"))},
        # an attention_step without out_proj (3.3 right); a sample_next that draws at T = 0
        "ned": {c: reference(c).read_text() for c in (1, 2, 3)} | {8: edited(
            8, ("return attn.out_proj(parts.merge_heads(heads)), (k, v)",
                "return parts.merge_heads(heads), (k, v)"),
            ("    if temperature == 0:  # one-hot on the argmax, the arguments checked: "
             "nothing to draw\n        return next_token_distribution(logits, 0.0, top_k, "
             "top_p).argmax(dim=-1)\n", ""))},
        "nobody": {},
        "ben": {},  # works on the branch "dev", which the roster names
        "loop": {1: edited(1, (PE_BODY, "    while True:  # my loop\n        pass\n" + PE_BODY))},
        "loud": {1: edited(1, (PE_BODY, "    for _ in range(300):\n        print('debugging "
                                        "the table ' * 20, d_model, max_len)\n" + PE_BODY))},
        "broken": {2: reference(2).read_text()}}
    repos = {}
    for name, chapters in files.items():
        repo = course_copy(tmp / "repos" / name, pristine)
        for chapter, text in chapters.items():
            (repo / "exercises" / reference(chapter).name).write_text(text)
        git(repo, "init", "--quiet", "--initial-branch=main")
        git(repo, "add", "-A")
        git(repo, "commit", "--quiet", "-m", "my work")
        repos[name] = repo
    git(repos["ben"], "checkout", "--quiet", "-b", "dev")
    (repos["ben"] / "exercises" / reference(4).name).write_text(reference(4).read_text())
    git(repos["ben"], "commit", "--quiet", "-am", "chapter 4, on dev")
    git(repos["ben"], "checkout", "--quiet", "main")
    broken = repos["broken"]
    # work committed only on another branch: chapter 3 solved there
    git(broken, "checkout", "--quiet", "-b", "mine")
    shutil.copyfile(reference(3), broken / "exercises" / reference(3).name)
    git(broken, "commit", "--quiet", "-am", "chapter 3 at last")
    git(broken, "checkout", "--quiet", "main")
    # a merge-conflict marker left in chapter 1, chapter 2 renamed, a test edited, a report
    (broken / "exercises" / reference(1).name).write_text(edited(1, (
        PE_BODY, "<<<<<<< HEAD\n    _check_d_model(d_model)\n=======\n    check(d_model)\n"
                 ">>>>>>> mine\n    if not isinstance(max_len")))
    git(broken, "mv", f"exercises/{reference(2).name}", "exercises/ch02_attention_final.py")
    test_file = next((broken / "tests" / "graded").glob("test_ch01_*.py"))
    test_file.write_text(test_file.read_text().replace("assert ", "assert True or ", 1))
    (broken / "grade.json").write_text(json.dumps({"points": 999, "max_points": 999}))
    git(broken, "add", "-A")
    git(broken, "commit", "--quiet", "-m", "fixed everything")
    (tmp / "manifest.json").write_text(json.dumps(manifest.compute(pristine)))
    return repos


# (chapters, learners): each learner graded on the chapters they need only
RUNS = [((1,), ("complete", "eli", "nobody", "loop", "loud", "broken")),
        ((2, 3), ("complete", "dana", "broken")),
        ((4,), ("fay", "max")),
        ((2, 3, 5), ("kim",)),
        ((5,), ("gus", "hal", "jo", "lee")),
        ((8,), ("ned",)),
        ((5, 6), ("ivy",))]


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("class")
    repos = the_class(tmp)
    out = tmp / "out"
    for chapters, names in RUNS:
        done = subprocess.run(
            [sys.executable, "-m", "annotated_transformer", "regrade",
             *(repos[n].as_uri() for n in names), "--out", str(out), "--seed", "7",
             "--jobs", "2", "--manifest", str(tmp / "manifest.json"),
             *(f"--chapter={c}" for c in chapters)],
            cwd=ROOT, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    roster = tmp / "roster.csv"  # a learner's own branch, from the class's roster
    roster.write_text(f"learner,repository,branch,lms_id,section\nben,{repos['ben'].as_uri()},"
                      f"dev,2001,B\n")
    done = subprocess.run(
        [sys.executable, "-m", "annotated_transformer", "regrade", "--roster", str(roster),
         "--out", str(out), "--jobs", "1", "--manifest", str(tmp / "manifest.json"),
         "--chapter=4"], cwd=ROOT, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    seeds = {r["seed"] for r in long_rows(out).values() if r["learner"] == "ben"}
    assert len(seeds) == 1 and seeds != {"7"}, seeds  # each run draws its own, never the last
    return out


def long_rows(out: Path) -> dict[tuple[str, str], dict]:
    with (out / "gradebook.csv").open(newline="") as handle:
        return {(r["learner"], r["exercise"]): r for r in csv.DictReader(handle)}


def mine(out: Path, learner: str) -> dict[str, dict]:
    return {e: r for (who, e), r in long_rows(out).items() if who == learner}


def learners_json(out: Path) -> dict[str, dict]:
    return {w["learner"]: w for w in json.loads((out / "gradebook.json").read_text())["learners"]}


def test_the_complete_learner_and_the_loud_one_earn_every_point(graded):
    for name, chapters in (("complete", {"1", "2", "3"}), ("loud", {"1"})):
        rows = mine(graded, name)
        assert {e.split(".")[0] for e in rows} == chapters
        assert all(r["status"] == "passed" and float(r["points"]) == float(r["max_points"])
                   and not r["message"] and not r["mistake"] for r in rows.values()), rows
        # the reference's files are handed in by several learners here: that flag only
        assert set(learners_json(graded)[name]["flags"]) <= {"identical-file"}
    assert "debugging the table" not in (graded / "feedback" / "loud.md").read_text()


def test_the_learner_who_started_nothing_earns_nothing_and_is_told_so(graded):
    rows = mine(graded, "nobody")
    assert rows and all(r["status"] == "not implemented" and float(r["points"]) == 0
                        for r in rows.values())


def test_a_cosmetic_2_2_blocks_nothing_and_3_3_s_own_mistake_is_named(graded):
    rows = mine(graded, "dana")
    assert 0 < float(rows["2.2"]["points"]) < float(rows["2.2"]["max_points"])
    assert rows["3.3"]["mistake"] == "3.3/one-head", rows["3.3"]["message"]
    assert not any("2.2" in r["blocked_by"] for r in rows.values())
    assert "fix 2.2" not in rows["3.3"]["message"]
    line = next(x for x in (graded / "class-summary.md").read_text().splitlines()
                if x.startswith("| 3.3 |"))
    assert "`3.3/one-head` (1)" in line, line


def test_a_missing_value_error_of_1_1_does_not_hide_the_mistake_of_1_2(graded):
    rows = mine(graded, "eli")
    assert rows["1.1"]["status"] != "passed" and float(rows["1.1"]["points"]) > 0
    assert rows["1.2"]["mistake"] == "1.2/dropout-before-the-table"
    assert not rows["1.2"]["blocked_by"] and "fix 1.1" not in rows["1.2"]["message"]


def test_a_4_3_that_calls_neither_4_1_nor_4_2_is_told_only_its_own_mistake(graded):
    rows = mine(graded, "fay")
    assert (rows["4.1"]["mistake"], rows["4.2"]["mistake"], rows["4.3"]["mistake"]) == (
        "4.1/inverted", "4.2/true-hides", "4.3/or-for-and")
    assert not rows["4.3"]["blocked_by"]
    assert "4.1" not in rows["4.3"]["message"] and "4.2" not in rows["4.3"]["message"]


def test_chapters_5_and_6_name_the_mistake_each_learner_made(graded):
    gus, hal, ivy = (mine(graded, n) for n in ("gus", "hal", "ivy"))
    assert gus["5.1"]["mistake"] == "5.1/statistics-over-positions", gus["5.1"]["message"]
    assert gus["5.2"]["status"] == "passed"  # calls no LayerNorm: nothing to blame
    assert hal["5.3"]["mistake"] == "5.3/placements-swapped", hal["5.3"]["message"]
    # hal's 5.4 is right: graded with the grader's 5.3, it earns its points, and says that
    # hal's own 5.3 would break the model
    assert hal["5.4"]["status"] == "passed" and not hal["5.4"]["mistake"], hal["5.4"]
    assert hal["5.4"]["message"].startswith("Graded with the grader's ResidualConnection (5.3)")
    assert ivy["5.5"]["mistake"] == "5.5/self-attention-unmasked", ivy["5.5"]["message"]
    assert ivy["6.3"]["mistake"] == "6.3/shift-reversed", ivy["6.3"]["message"]
    # the capstone (the learner's own parts together) fails with them, and is never blamed
    # on chapter 8's stub, whose NotImplementedError the package's decoding catches
    assert ivy["6.6"]["status"] == "failed" and not ivy["6.6"]["mistake"], ivy["6.6"]
    assert "8." not in ivy["6.6"]["blocked_by"], ivy["6.6"]
    assert {e for e, r in gus.items() if r["status"] == "passed"} >= {"5.2"}
    assert all(r["status"] == "passed" for e, r in ivy.items() if e in ("5.1", "5.2", "5.3"))


def test_no_correct_exercise_pays_for_an_earlier_one(graded):
    """The first class of ten's learners: each correct exercise earns every point and no
    mistake name beside a wrong earlier one it builds on; the wrong one is named."""
    jo, kim, lee, fella, ned = (mine(graded, n) for n in ("jo", "kim", "lee", "max", "ned"))
    assert jo["5.1"]["status"] == "failed" and float(jo["5.1"]["points"]) == 0
    assert kim["2.1"]["status"] == "failed", kim["2.1"]
    assert lee["5.1"]["status"] == "failed"
    for rows, right in ((jo, ("5.2", "5.3", "5.4", "5.5")), (lee, ("5.2", "5.3", "5.4", "5.5")),
                        (kim, ("2.2", "2.3", "3.3", "5.1", "5.2", "5.3", "5.4", "5.5")),
                        (fella, ("4.2", "4.3"))):
        for exercise in right:
            row = rows[exercise]
            assert row["status"] == "passed" and not row["mistake"], row
            assert float(row["points"]) == float(row["max_points"]), row
    assert jo["5.5"]["message"].startswith("Graded with the grader's LayerNorm (5.1)")
    assert "4.3/causal-only" not in {r["mistake"] for r in fella.values()}
    # ned's 8.3 is wrong on its own (no out_proj): its failure names no earlier part
    assert ned["8.3"]["status"] == "failed" and "fix 3.3" not in ned["8.3"]["message"]
    assert not ned["8.3"]["blocked_by"]
    assert ned["8.2"]["mistake"] == "8.2/draws-at-temperature-zero", ned["8.2"]
    # the class summary counts only the mistakes made: nobody's correct 5.5 is named
    summary = (graded / "class-summary.md").read_text()
    assert "5.5/cross-attention-queries" not in summary and "5.5/memory-unused" not in summary


def test_the_roster_s_branch_is_graded(graded):
    rows = mine(graded, "ben")
    assert {e for e in rows} == {"4.1", "4.2", "4.3"}
    assert all(r["status"] == "passed" for r in rows.values()), rows
    assert "other-branch" not in learners_json(graded)["ben"]["flags"]


def test_the_own_mistake_always_comes_before_the_blame(graded):
    both = [r for r in long_rows(graded).values() if r["mistake"] and r["blocked_by"]]
    for row in both:
        assert not row["message"].startswith(f"{row['exercise']} uses your"), row


def test_an_endless_loop_costs_its_exercises_only(graded):
    rows = mine(graded, "loop")
    assert float(rows["1.1"]["points"]) == 0 and "Timeout" in rows["1.1"]["message"]
    assert learners_json(graded)["loop"]["status"] != "error"


def test_a_broken_repository_is_graded_as_committed_and_flagged(graded):
    rows = mine(graded, "broken")
    flags = learners_json(graded)["broken"]["flags"]
    assert {"tests-changed", "committed-report", "extra-file", "missing-chapter",
            "other-branch"} <= set(flags), flags
    assert all(float(r["points"]) == 0 for r in rows.values())  # the forged 999 is ignored
    assert "<<<<<<<" in rows["1.1"]["message"] or "syntax" in rows["1.1"]["message"].lower()
    assert all(rows[e]["status"] == "not implemented" for e in rows if e[0] in "23")


def test_every_output_agrees(graded):
    long = long_rows(graded)
    data = json.loads((graded / "gradebook.json").read_text())
    assert {(r["learner"], r["exercise"]): (r["points"], r["status"], r["mistake"])
            for r in data["rows"]} == {
        k: (float(r["points"]), r["status"], r["mistake"]) for k, r in long.items()}
    with (graded / "grades-wide.csv").open(newline="") as handle:
        wide = {r["learner"]: r for r in csv.DictReader(handle)}
    learners = {who for who, _ in long}
    assert set(wide) == learners | {"Points Possible"}
    for name in learners:
        rows = {e: r for (who, e), r in long.items() if who == name}
        total = round(sum(float(r["points"]) for r in rows.values()), 2)
        possible = round(sum(float(r["max_points"]) for r in rows.values()), 2)
        assert float(wide[name]["total"]) == total == data_total(data, name)
        for exercise, row in rows.items():
            assert float(wide[name][exercise]) == float(row["points"])
            assert float(wide["Points Possible"][exercise]) == float(row["max_points"])
        feedback = (graded / "feedback" / f"{name}.md").read_text()
        assert f"**{total:g}/{possible:g} points.**" in feedback
        for exercise, row in rows.items():
            assert re.search(rf"\| {re.escape(exercise)} [^|]* \| {float(row['points']):g}/"
                             rf"{float(row['max_points']):g} \| {row['status']} \|", feedback)
            if row["mistake"]:
                assert f"`{row['mistake']}`" in feedback
    summary = (graded / "class-summary.md").read_text()
    assert f"{len(learners)} submission(s)" in summary
    for exercise in {e for _, e in long}:
        rows = [r for (_, e), r in long.items() if e == exercise]
        passed = sum(r["status"] == "passed" for r in rows)
        named = Counter(r["mistake"] for r in rows if r["status"] != "passed" and r["mistake"])
        line = next(x for x in summary.splitlines() if x.startswith(f"| {exercise} |"))
        assert f"| {passed}/{len(rows)} |" in line, line
        for mistake, count in named.items():
            assert f"`{mistake}` ({count})" in line, line


def data_total(data: dict, name: str) -> float:
    return next(w["points"] for w in data["learners"] if w["learner"] == name)
