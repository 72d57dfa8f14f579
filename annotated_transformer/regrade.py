"""``python -m annotated_transformer.regrade``: an instructor's re-grade of many submissions;
the code is :mod:`annotated_transformer.grading.regrade`."""

import sys

from annotated_transformer.grading.regrade import main

if __name__ == "__main__":
    sys.exit(main())
