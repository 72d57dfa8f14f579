"""``python -m annotated_transformer.classroom``: kept so that commands in learners' copies and in
workflows go on working; the code is :mod:`annotated_transformer.grading.classroom`."""

import sys

from annotated_transformer.grading.classroom import main

if __name__ == "__main__":
    sys.exit(main())
