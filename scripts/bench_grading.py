"""How long a learner waits for the grader: wall-clock seconds of the commands a learner
types, on the reference and on the untouched release, as ``python -m annotated_transformer``
runs them (a fresh interpreter each time, the sandbox on where bubblewrap is installed).

    python scripts/bench_grading.py                 # each command, 3 times, median printed
    python scripts/bench_grading.py --busy 2        # beside two processes that spin

``--busy N`` starts N processes that compute without end for the whole run (the machine of a
learner who has other work open), and stops them at the end. Prints a table; asserts
nothing (speed is measured here, never in the tests).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from annotated_transformer.layout import EXERCISES_DIR, ROOT

COMMANDS = {
    "grade --points": ["grade", "--points"],
    "grade --exercise 6.2": ["grade", "--exercise", "6.2", "--no-cache"],
    "grade --chapter 2": ["grade", "--chapter", "2", "--no-cache"],
}


def spin() -> None:
    while True:
        pass


def timed(command: list[str], parts: str) -> float:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "annotated_transformer", *command,
                           *(["--parts", parts] if command[1:] != ["--points"] else [])],
                          cwd=ROOT, capture_output=True, text=True)
    took = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed: {done.stdout[-800:]}{done.stderr[-800:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--busy", type=int, default=0, metavar="N",
                        help="processes that spin beside the grader for the whole run")
    args = parser.parse_args()
    stubs = Path(tempfile.mkdtemp(prefix="bench-stubs-"))
    os.chmod(stubs, 0o755)
    for path in EXERCISES_DIR.glob("ch*.py"):
        (stubs / path.name).write_text(path.read_text())
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for process in spinners:
        process.start()
    load = os.getloadavg()[0]
    try:
        print(f"{'command':24} {'parts':10} {'median s':>9} {'all rounds':>24}")
        for name, command in COMMANDS.items():
            for label, parts in (("reference", "solutions"), ("stubs", str(stubs))):
                if name == "grade --points" and label == "stubs":
                    continue
                rounds = [timed(command, parts) for _ in range(args.rounds)]
                shown = ", ".join(f"{r:.1f}" for r in rounds)
                print(f"{name:24} {label:10} {statistics.median(rounds):9.2f} {shown:>24}",
                      flush=True)
    finally:
        for process in spinners:
            process.terminate()
    print(f"{os.cpu_count()} cores, {args.busy} busy process(es) beside; load average "
          f"{load:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
