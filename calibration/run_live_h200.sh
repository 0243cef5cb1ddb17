#!/usr/bin/env bash
# Live calibration + end-to-end check of one model on a lent H200, in one device call.
#
#   bash calibration/run_live_h200.sh MODEL          # MODEL: llama-3.1-8b or qwen3-30b-a3b (any preset)
#
# Run from the repository root on the device machine, carrying .whl/ (simpy and tqdm
# wheels: the image has torch, transformers, numpy, pandas, scipy, click, matplotlib).
# One model per call keeps each call under the device's 10-minute command limit:
# calibration at most ~6.5 min (--budget-s 330), the e2e check at most ~3.5 min.
# Everything lands in $OUT: run-MODEL.log and results-MODEL.tar.gz (the profile
# directory and the e2e outputs), two files per call. CAL_BUDGET_S and E2E_BUDGET_S
# shorten the two steps (a smoke run).
set -uo pipefail
MODEL="${1:?usage: run_live_h200.sh MODEL}"
OUT="${OUT:-/tmp/pipesim-live-out}"
WORK=/tmp/pipesim-live/$MODEL
mkdir -p "$OUT" "$WORK"
LOG="$OUT/run-$MODEL.log"
cd "$(dirname "$0")/.."

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || { echo "wheel install failed" | tee "$LOG"; exit 1; }
export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TQDM_MININTERVAL=10
{
  echo "== $(date -u +%FT%TZ) $MODEL on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
  python3 -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
  echo "== calibrate live"
  timeout 400 python3 -m pipesim.cli calibrate live --model "$MODEL" --hf-config --budget-s "${CAL_BUDGET_S:-330}" --out "$WORK/profile"
  echo "calibrate exit code $?"
  echo "== e2e check"
  timeout 230 python3 calibration/e2e_check.py --profile "$WORK/profile" --model "$MODEL" --box h200-1x \
    --batches 1,4,16,64 --input-len 128 --output-len 64 --repeats 3 --budget-s "${E2E_BUDGET_S:-140}" --out-dir "$WORK/e2e"
  echo "e2e exit code $?"
  echo "== predict from the new profile (TP1 x PP1, C=16)"
  python3 -m pipesim.cli predict --profile "$WORK/profile" --model "$MODEL" --conc 16 --input-len 128 --output-len 64
} 2>&1 | tee "$LOG"
tar -czf "$OUT/results-$MODEL.tar.gz" -C "$WORK" .
ls -l "$OUT"
