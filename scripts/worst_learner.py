"""What one hostile learner costs a class's regrade, measured.

    python scripts/worst_learner.py [--chapter N ...] [--out DIR]

Builds three submissions in a temporary folder: ``alice`` (the reference), ``bob`` (the
untouched release) and ``mallory``, whose chapter files are the reference's but for four
attacks on the grader's bounds: 2.3 writes half a reply frame and waits; chapter 4's file
starts a thousand processes when it is imported (and keeps the reference's code); chapter
7's allocates all the memory it can when imported; chapter 8's import waits for ever on
``torch.futures.Future().wait()``. The course is copied with its source rules off (as if
mallory had found a way past them) and ``regrade`` runs on alice alone, on mallory alone,
then on the three.
Prints each run's wall time and mallory's rows; exits 1 when a bound did not hold (a run
that did not finish, alice's rows not all passed, bob's not all 0, an attacked exercise
credited). Needs bubblewrap; a cgroup bounds the memory where the grader may make one.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the course of this script, installed or not

from annotated_transformer.course.authoring import stubs  # noqa: E402
from annotated_transformer.course.grading import source_rules  # noqa: E402
from annotated_transformer.layout import (  # noqa: E402
    EXERCISES_DIR,
    GRADED_DIR,
    PACKAGE_DIR,
    SOLUTIONS_DIR,
    relative,
)

HALF_REPLY = '''

def softmax_jacobian(p):  # half a reply frame, then a wait
    import sys
    frame = sys._getframe()
    while "replies" not in frame.f_locals:
        frame = frame.f_back
    frame.f_locals["replies"].write((1000).to_bytes(8, "big") + b"half")
    frame.f_locals["replies"].flush()
    torch.futures.Future().wait()
'''
FORKS = '''
import os as _os
import time as _time

for _ in range(1000):  # a thousand processes that sleep, started at import
    try:
        if _os.fork() == 0:
            _time.sleep(3600)
            _os._exit(0)
    except OSError:
        break
'''
HOGS = '''
_blocks = []
while True:  # all the memory it can get, at import
    _blocks.append(torch.ones(2**27, dtype=torch.uint8))
'''
BLOCKS = '''
torch.futures.Future().wait()  # at import, for ever, without using CPU
'''
# chapter: (the exercise attacked, None for all; the attack; what its rows must say)
ATTACKS = {2: ("2.3", HALF_REPLY, "without computing"), 4: (None, FORKS, None),
           7: (None, HOGS, "of memory"), 8: (None, BLOCKS, "without computing")}


def course_copy(folder: Path) -> Path:
    """The course with its source rules off."""
    course = folder / "copy"
    for path in (PACKAGE_DIR, SOLUTIONS_DIR, EXERCISES_DIR, GRADED_DIR):
        shutil.copytree(path, course / relative(path), ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, course)
    rules = course / relative(Path(source_rules.__file__))
    rules.write_text(rules.read_text() + "\n\ndef check_folder(folder, forbidden=None):  # off\n"
                     "    return {}\n")
    return course


def submissions(folder: Path) -> dict[str, Path]:
    made = {name: folder / "submissions" / name / relative(EXERCISES_DIR)
            for name in ("mallory", "alice", "bob")}
    for path in made.values():
        path.mkdir(parents=True)
    stubs.write_stubs(made["bob"])
    for source in sorted(SOLUTIONS_DIR.glob("ch*.py")):
        shutil.copy(source, made["alice"])
        text = source.read_text()
        chapter = int(source.name[2:4])
        if chapter in ATTACKS:
            text += ATTACKS[chapter][1]
        (made["mallory"] / source.name).write_text(text)
    return {name: path.parent for name, path in made.items()}


def regrade(course: Path, learners: dict[str, Path], chapters: list[str], out: Path,
            limit: float = 4 * 3600) -> float:
    """The wall time of one ``regrade``; stops the script when it wrote no gradebook or did
    not finish in ``limit`` seconds (a bound that did not hold)."""
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-m", "annotated_transformer", "regrade",
                               *map(str, learners.values()), "--names", ",".join(learners),
                               "--out", str(out), "--seed", "4", *chapters], cwd=course,
                              capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired as stopped:
        tail = (stopped.stderr or b"")[-2000:]
        sys.exit(f"regrade of {', '.join(learners)} did not finish in {limit:g} s: a bound did "
                 f"not hold. {tail.decode(errors='replace') if isinstance(tail, bytes) else tail}")
    took = time.monotonic() - start
    if not (out / "gradebook.json").exists():
        sys.exit(f"regrade wrote no gradebook (exit {done.returncode}): {done.stderr[-2000:]}")
    return took


def verdict(rows: list[dict]) -> list[str]:
    """What did not hold in the three learners' rows (printing mallory's)."""
    wrong = []
    for row in rows:
        if not row["exercise"]:  # a submission that could not be graded: one error row
            wrong.append(f"{row['learner']} was not graded: {row['message'][:200]}")
            continue
        attack = ATTACKS.get(int(row["exercise"].split(".")[0]))
        if row["learner"] == "mallory":
            print(f"  {row['exercise']:5} {row['points']:>5g}/{row['max_points']:<5g} "
                  f"{row['status']:15} {row['message'][:110]}")
            attacked = attack and attack[2] and attack[0] in (None, row["exercise"])
            if attacked and (row["points"] > 0 or attack[2] not in row["message"]):
                wrong.append(f"mallory's {row['exercise']}: {row['points']:g} points, "
                             f"{row['message'][:200]}")
        elif (row["learner"] == "alice") != (row["status"] == "passed") or (
                row["learner"] == "bob" and row["points"] > 0):
            wrong.append(f"{row['learner']}'s {row['exercise']}: {row['status']}")
    return wrong


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chapter", type=int, action="append", help="only this chapter")
    parser.add_argument("--out", type=Path, help="keep the gradebooks here")
    args = parser.parse_args()
    chapters = [f"--chapter={c}" for c in args.chapter or []]
    with tempfile.TemporaryDirectory(prefix="worst-learner-") as temporary:
        folder = Path(temporary)
        folder.chmod(0o755)
        course, learners = course_copy(folder), submissions(folder)
        out = args.out or folder / "grades"
        for name in ("alice", "mallory"):
            alone = regrade(course, {name: learners[name]}, chapters, out / name)
            print(f"{name} alone: {alone / 60:.1f} minutes", flush=True)
        three = regrade(course, learners, chapters, out / "three")
        print(f"mallory, alice and bob: {three / 60:.1f} minutes")
        rows = json.loads((out / "three" / "gradebook.json").read_text())["rows"]
    wrong = verdict(rows)
    print("\n".join(wrong) or "every bound held")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
