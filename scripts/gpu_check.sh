#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): on the GPU machine, the wheels scripts/gpu_wheels.sh put in .whl/ are
# installed first (that machine reaches no registry and lacks pydantic); harmonyrl runs from src/.
#   bash scripts/gpu_check.sh               # on the GPU machine: every section, ~8 minutes, figures in $OUT
#   bash scripts/gpu_check.sh --dry-run     # on a CPU: every section at tiny sizes (.ci/run runs this)
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " != *" --dry-run "* ]] && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing the carried wheels failed" >&2; exit 1; }
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out="${OUT:-runs/gpu_check}"
# The device tool brings back at most 8 files from $OUT: there the check works in a folder of its own and copies
# into $OUT its report, its log and one archive of the rest (run folders' checkpoints left out).
work="$out"
[[ -n "${OUT:-}" ]] && work="$(mktemp -d /tmp/gpu_check.XXXX)"
mkdir -p "$out" "$work"
python3 scripts/gpu_check.py --out "$work" "$@" 2>&1 | tee "$out/console.log"
rc="${PIPESTATUS[0]}"
if [[ "$work" != "$out" ]]; then
  cp "$work/gpu_check.json" "$work/gpu_check.log" "$out/" 2>/dev/null
  tar czf "$out/gpu_check_files.tgz" -C "$work" --exclude=checkpoints --exclude='synthetic-*' . || true
fi
exit "$rc"
