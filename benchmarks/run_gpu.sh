#!/usr/bin/env bash
# Lightning's built-in strategies and ours, side by side in one session, each capped to 24 GiB per GPU.
#   bash benchmarks/run_gpu.sh OUT_CSV [SHAPE] [CASES_FILE] [STEPS] [WARMUP_STEPS]
# Each line of CASES: label strategy batch zero-overrides-json. A run that hangs after an OOM on the other
# rank is killed by `timeout` and recorded as "OOM (timeout)".
set -u
out="${1:?usage: run_gpu.sh OUT_CSV [SHAPE] [CASES_FILE]}"
shape="${2:-deberta-v2-xlarge}"
cases="${3:-benchmarks/cases_deberta.txt}"
steps="${4:-40}"
warmup="${5:-15}"
while read -r label strategy batch zero; do
  [ -z "$label" ] || [ "${label:0:1}" = "#" ] && continue
  log=$(mktemp)
  extra=()
  [ -n "${zero:-}" ] && extra=(--zero "$zero")
  timeout -k 10 240 python benchmarks/throughput.py --shape "$shape" --strategy "$strategy" --label "$label" \
    --batch-size "$batch" --steps "$steps" --warmup "$warmup" --out "$out" "${extra[@]}" </dev/null >"$log" 2>&1
  if ! grep -q '^RESULT' "$log"; then
    echo "$shape,$label,$batch,2,16-mixed,128,24.0,OOM (timeout or crash),,," >>"$out"
    tail -5 "$log"
  fi
  grep '^RESULT' "$log" || true
  pkill -9 -f benchmarks/throughput.py 2>/dev/null || true
done <"$cases"
