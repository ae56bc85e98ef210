#!/usr/bin/env bash
# servegate's GPU check, in one run of the GPU machine: install the carried wheels, run the `gpu` tests and
# the CUDA throughput benchmark, write everything under $OUT. Budget: under 8 minutes in all.
#
#   OUT=/some/dir bash scripts/gpu_check.sh              # on the GPU machine (wheels from `make gpu-wheels`)
#   OUT=/tmp/gc bash scripts/gpu_check.sh --cpu          # here: the same install step, the gpu tests (they
#                                                        # skip), and the benchmark's --quick CPU run
# Options: --cpu, --wheels DIR (default .gpu-wheels), --python PY (default python3), --site DIR (where the
# wheels and servegate are installed; default /tmp/servegate-site), --no-bench.
#
# The image's python3 is itself a virtual environment (/opt/torch/.venv), so a venv made from it with
# --system-site-packages would sit on the base interpreter without torch: the wheels go into a --target
# folder put first on PYTHONPATH instead, beside the image's own packages (its torch, transformers, ...).
#
# What comes back from $OUT (8 files at most): summary.txt, install.log, nvidia-smi.txt, pip-freeze.txt,
# gpu-tests.txt, gpu-tests.xml (JUnit), throughput.txt, throughput.json.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODE=gpu
WHEELS="$ROOT/.gpu-wheels"
PY="${PYTHON:-python3}"
SITE=/tmp/servegate-site
BENCH=1
while [ $# -gt 0 ]; do
  case "$1" in
    --cpu) MODE=cpu ;;
    --wheels) WHEELS="$(cd "$2" && pwd)"; shift ;;
    --python) PY="$2"; shift ;;
    --site) SITE="$2"; shift ;;
    --no-bench) BENCH=0 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT="${OUT:-$ROOT/out/gpu-check}"
mkdir -p "$OUT"
cd "$ROOT" || exit 2
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
began=$(date +%s)
BUDGET_S="${GPU_CHECK_BUDGET_S:-450}"  # every step's limit is cut to what is left of this; a step stopped
# at its limit gets 20 s more to end (SIGINT, then SIGKILL): 450 + 20 stays under the 8 minutes (480 s)
exec 3>&1  # the console: what a step prints goes to its own file, its outcome line here and to the summary
say() { echo "[$(($(date +%s) - began)) s] $*" | tee -a "$SUMMARY" >&3; }
status=0
step() {  # step NAME SECONDS COMMAND...: run with a time limit, record the outcome
  local name="$1" limit="$2"; shift 2
  local t0=$(date +%s)
  local left=$((BUDGET_S - (t0 - began)))
  [ "$left" -lt "$limit" ] && limit=$left
  [ "$limit" -lt 5 ] && { say "$name: skipped, the ${BUDGET_S} s budget is spent"; status=1; return 124; }
  # SIGINT first: pytest then stops cleanly and still writes its JUnit file and summary
  timeout --signal=INT --kill-after=20 "$limit" "$@"
  local rc=$?
  [ $rc -eq 124 ] && say "$name: TIMED OUT after ${limit} s" || say "$name: exit $rc in $(($(date +%s) - t0)) s"
  [ $rc -ne 0 ] && status=1
  return $rc
}

say "servegate gpu check, mode $MODE, $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
[ -f "$WHEELS/carried.txt" ] || { say "no $WHEELS/carried.txt: run \`make gpu-wheels\` first"; exit 2; }

# --- the machine ---------------------------------------------------------------------------------
{ timeout 20 nvidia-smi || echo "nvidia-smi: not available (exit $?)"; timeout 20 nvidia-smi -q -d CLOCK,MEMORY 2>/dev/null; } \
  >"$OUT/nvidia-smi.txt" 2>&1

# --- install: the carried wheels exactly, then servegate without dependencies ---------------------
rm -rf "$SITE"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
step "install wheels" 60 "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir \
  --find-links "$WHEELS" --target "$SITE" -r "$WHEELS/carried.txt" >"$OUT/install.log" 2>&1 \
  || { say "the wheels did not install (install.log)"; exit 1; }
# built in pip's isolated environment from the carried setuptools and wheel (--no-index: nothing is fetched)
step "install servegate" 60 "$PY" -m pip install --no-index --no-deps --no-compile --no-cache-dir \
  --find-links "$WHEELS" --target "$SITE" . >>"$OUT/install.log" 2>&1 \
  || { say "servegate did not install (install.log)"; exit 1; }
export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
export HF_HOME="${HF_HOME:-$(mktemp -d /tmp/servegate-hf-XXXX)}"
{ echo "## pip check (requirements of every installed package, the image's and the carried)"
  "$PY" -m pip check 2>&1
  echo "## import check"; } >>"$OUT/install.log"
step "import check" 120 "$PY" -c "
import importlib, sys
for name in ('pydantic', 'jsonschema', 'fastapi', 'torchao', 'datasets', 'evaluate', 'servegate.cli.app',
             'servegate.runtime.engine.reference', 'servegate.gates.check'):
    module = importlib.import_module(name)
    print(name, getattr(module, '__version__', ''), module.__file__)
import torch, transformers
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)
" >>"$OUT/install.log" 2>&1 || { say "an import failed (install.log)"; exit 1; }
{ echo "## $PY -m pip freeze (the image)"; "$PY" -m pip freeze 2>&1
  echo "## carried, in $SITE"; "$PY" -m pip freeze --path "$SITE" 2>&1; } >"$OUT/pip-freeze.txt"

if [ "$MODE" = gpu ] && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  say "torch sees no CUDA device: the gpu tests would only skip"; status=1
fi

# --- the gpu tests (skipped without CUDA) ---------------------------------------------------------
# most telling first: if the budget runs out, the quantization gate runs whose verdicts are only recorded
# (the last tests of the last file) are what is cut; the full gate check fills the baseline cache they share
TESTS=(tests/gpu/test_cuda_greedy.py tests/gpu/test_cuda_paged.py tests/gpu/test_cuda_gate_check.py
       tests/gpu/test_cuda_quantization.py)
step "gpu tests" $((BUDGET_S - 140 - ($(date +%s) - began))) "$PY" -m pytest "${TESTS[@]}" -m gpu -q -rfEsP \
  -p no:cacheprovider --timeout 240 --junitxml "$OUT/gpu-tests.xml" -o junit_logging=system-out \
  >"$OUT/gpu-tests.txt" 2>&1  # -rP and junit_logging: what each test printed (agreement shares, verdicts) is kept
tail -n 1 "$OUT/gpu-tests.txt" | tee -a "$SUMMARY"

# --- throughput --------------------------------------------------------------------------------
if [ "$BENCH" = 1 ]; then
  if [ "$MODE" = gpu ]; then
    bench=(--device cuda --requests 48 --solo-runs 3)  # 48 of the default 64: the arrivals fit the budget
  else
    bench=(--quick --requests 8 --solo-runs 1 --threads 1)
  fi
  step "throughput benchmark" 135 "$PY" benchmarks/runtime_throughput.py "${bench[@]}" --json "$OUT/throughput.json" \
    >"$OUT/throughput.txt" 2>&1
  grep -E "ratios|batch-1|roofline" "$OUT/throughput.txt" | tail -n 6 | tee -a "$SUMMARY"
fi

say "done in $(($(date +%s) - began)) s, status $status"
exit $status
