#!/usr/bin/env bash
# scripts/gpu-check-vllm.sh SECONDS: scripts/gpu-check.sh's vLLM step (docs/engines.md,
# "On a GPU"). `vllm serve` of a small random Llama (scripts/lib/vllm_check.py model:
# about 1.1 GB of bf16 in two shards, written once under $OUT) with --load-format
# safetensors, fastsafetensors and pinstage in turn, each stopped as soon as vLLM reports
# the model loaded; their load times side by side in $OUT/vllm.txt and vllm.json, each
# run's log in $OUT/vllm-<format>.log. SECONDS bounds the whole step: each run gets an
# equal share of what is left.
#
# Settings: PINSTAGE_CHECK_VLLM_PYTHON, an interpreter with vLLM and pinstage importable
# (pinstage pip-installed, or on PYTHONPATH from a build with its Python module and the
# cuda backend); unset, or lacking either, the step says "skipped" and exits 0.
# PINSTAGE_CHECK_VLLM, the vllm command (default: vllm beside that interpreter).
# PINSTAGE_CHECK_VLLM_MODEL, "HIDDEN LAYERS" of the model (default "2048 8").
# Exit status: 0 when every format loaded (or skipped), 1 when one failed or ran out of time.
set -uo pipefail
# shellcheck source=scripts/lib/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
budget=${1:?usage: gpu-check-vllm.sh SECONDS}
OUT=${OUT:?set OUT}
py=${PINSTAGE_CHECK_VLLM_PYTHON:-}
read -r hidden layers <<<"${PINSTAGE_CHECK_VLLM_MODEL:-2048 8}"
start=$SECONDS

if [ -z "$py" ]; then
  echo "vllm: skipped: set PINSTAGE_CHECK_VLLM_PYTHON to an interpreter with vLLM and pinstage"
  exit 0
fi
if ! "$py" -c "import vllm, pinstage" >/dev/null 2>&1; then
  echo "vllm: skipped: $py cannot import vllm and pinstage (requirements/engines.txt's pins)"
  exit 0
fi
vllm=${PINSTAGE_CHECK_VLLM:-$(dirname "$py")/vllm}
helper=("$py" "$ROOT/scripts/lib/vllm_check.py")
"${helper[@]}" model "$OUT/vllm-model" --hidden "$hidden" --layers "$layers" || exit 1
# A pinstage that is importable but not installed has no entry point: declare it.
plugin_path=""
if ! "$py" -c 'from importlib.metadata import entry_points as e
import sys; sys.exit(not any(p.name == "pinstage" for p in e(group="vllm.general_plugins")))'; then
  "${helper[@]}" plugin "$OUT/vllm-plugin" || exit 1
  plugin_path="$OUT/vllm-plugin:"
fi
cat "$OUT"/vllm-model/*.safetensors >/dev/null  # warm for every format alike

# One `vllm serve`, in a session of its own so that its engine processes go with it.
serve() {
  local fmt=$1 t=$2 log="$OUT/vllm-$1.log" pid
  PYTHONPATH="$plugin_path${PYTHONPATH:-}" setsid timeout "$t" "$vllm" serve \
    "$OUT/vllm-model" --load-format "$fmt" --enforce-eager --skip-tokenizer-init \
    --max-model-len 256 --gpu-memory-utilization 0.5 --port $((18000 + RANDOM % 1000)) \
    >"$log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && ! grep -q "Model loading took" "$log"; do
    sleep 0.5
  done
  kill -TERM -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  grep -q "Model loading took" "$log" && return 0
  echo "vllm: --load-format $fmt did not load the model within $t s; the end of its log:"
  tail -n 15 "$log"
  return 1
}

failed=0
formats=(safetensors fastsafetensors pinstage)
for i in "${!formats[@]}"; do
  left=$((budget - (SECONDS - start)))
  share=$((left / (${#formats[@]} - i)))
  if [ "$share" -lt 20 ]; then
    echo "vllm: no time left for --load-format ${formats[$i]} ($left s of $budget)"
    failed=1
    break
  fi
  echo "-- vllm serve --load-format ${formats[$i]} (at most $share s)"
  serve "${formats[$i]}" "$share" || failed=1
done
rm -rf "$OUT/vllm-model"
"${helper[@]}" summary "$OUT" || failed=1
exit $failed
