#!/usr/bin/env bash
# For authors: re-execute notebooks in place (all of chapters/, or the ones named), so that
# their committed outputs are fresh. Then run `bash scripts/test.sh` to check them with nbval.
source "$(dirname "$0")/env.sh"
if [ "$#" -eq 0 ]; then set -- chapters/*.ipynb; fi
for notebook in "$@"; do
  echo "Executing $notebook"
  SECONDS=0
  jupyter nbconvert --to notebook --execute --inplace \
    --ExecutePreprocessor.timeout=600 --ExecutePreprocessor.kernel_name=python3 \
    --ExecutePreprocessor.record_timing=False "$notebook"
  echo "  done in ${SECONDS} s"
done
