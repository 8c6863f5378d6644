#!/usr/bin/env bash
# allreduce_bench, cold ops: 3 ranks (the shared barrier on more ranks than cores), the buffer
# rewritten, 1 MiB evicted and 20 us idle before each op, 4 KiB only. It must finish, report
# every chosen variant's median, and record the options in its context.
# Usage: allreduce_bench_smoke.sh ALLREDUCE_BENCH WITH_FABRIC(yes|no)
set -euo pipefail
bench=$1
with_fabric=$2
variants='ddp_gloo'
[[ $with_fabric == yes ]] && variants='ddp_gloo|ddp_fabric_shm'
out=$(mktemp)
trap 'rm -f "$out"' EXIT
# timeout's own limit, under CTest's: a hang shows as this message, not as a killed test.
if ! timeout --kill-after=10 120 "$bench" --ranks=3 --rewrite-buffer --evict-bytes=1048576 \
    --idle-us=20 --interleave="^(${variants})\$" --benchmark_filter='/4KiB/' \
    --benchmark_format=json >"$out" 2>&1; then
  echo "allreduce_bench failed or ran past 120 s; its output:" >&2
  cat "$out" >&2
  exit 1
fi
fail=0
for variant in ${variants//|/ }; do
  if ! grep -Eq "\"${variant}_p50_us\": [0-9.e+]+" "$out"; then
    echo "no median reported for ${variant}" >&2
    fail=1
  fi
done
for context in '"evict_bytes": "1048576"' '"idle_us": "20"' '"rewrite_buffer": "yes"' \
    '"ranks": "3"'; do
  grep -q "$context" "$out" || { echo "context lacks ${context}" >&2; fail=1; }
done
if ((fail)); then cat "$out" >&2; exit 1; fi
echo "allreduce_bench cold ops on 3 ranks: ok (${variants})"
