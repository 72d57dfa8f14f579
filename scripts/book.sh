#!/usr/bin/env bash
# Install everything (into .venv) and build the web book from the committed notebooks
# (they are not re-executed: the book shows exactly the outputs that nbval checks).
source "$(dirname "$0")/env.sh"
rm -rf _build/html
jupyter-book build . --config book/_config.yml --toc book/_toc.yml --warningiserror --keep-going
echo
echo "The book is built: $PWD/_build/html/index.html"
