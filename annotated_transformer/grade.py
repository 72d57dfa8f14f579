"""``python -m annotated_transformer.grade``: the command that learners' grading workflows
made before ``python -m annotated_transformer grade``, kept for them until the end of the
2026/27 course year (the book's instructor page); everything else uses the one command tree."""

import sys

from annotated_transformer.course.grading.grade import main

if __name__ == "__main__":
    sys.exit(main())
