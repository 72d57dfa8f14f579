"""``python -m annotated_transformer.bench``: the code is
:mod:`annotated_transformer.bench.command`."""

import sys

from annotated_transformer.bench.command import main

if __name__ == "__main__":
    sys.exit(main())
