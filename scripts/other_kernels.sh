#!/usr/bin/env bash
# The README's test command again under the CPU kernels of other processors, on the machine
# at hand: a learner's laptop, Colab or a hosted runner (Intel, AMD, Apple) sums in another
# order, so a softmax's last bits and a training run's digits differ. PyTorch picks its own
# kernels by ATEN_CPU_CAPABILITY (default, avx2, avx512) and MKL its BLAS paths by
# MKL_ENABLE_INSTRUCTIONS (SSE4_2, AVX2, ...); each setting below is one such processor.
# The tests and the notebooks' committed outputs must pass under every one: nbval compares
# only what holds on any processor, and cells tagged check-claims assert what the prose says
# of the rest (CONTRIBUTING.md, "One chapter = five files").
# Extra arguments go to scripts/test.sh (and so to pytest), e.g. `-x`, or `-k ipynb` for the
# notebooks alone.
set -euo pipefail
cd "$(dirname "$0")/.."
settings=("ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2"
          "ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2")
for setting in "${settings[@]}"; do
  echo "== bash scripts/test.sh under $setting"
  # shellcheck disable=SC2086  # the setting is two words on purpose
  env $setting bash scripts/test.sh "$@"
done
