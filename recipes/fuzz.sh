#!/usr/bin/env bash
# Fuzz loip's parsers for longer than CI does: builds the libFuzzer targets (tests/fuzz/fuzz_*.c,
# and tests/fuzz/lua/*.lua under the LuaJIT driver tests/fuzz/lua_target.c) with clang into build-fuzz (-DLOIP_FUZZ=ON: ASan + UBSan + coverage) and runs each for SECONDS
# (default 300) over its committed seeds and what earlier runs found (build-fuzz/fuzz-corpus),
# then prints the executions per target. A crash stops its target with the input saved as
# build-fuzz/crash-* and the script fails.
# LOIP_FUZZ_BUILD names another build directory (absolute, or relative to the checkout).
# LOIP_FUZZ_MERGE=1 merges what a run found into the committed corpus (tests/fuzz/corpus/TARGET,
# libFuzzer's -merge=1: only inputs that add coverage, named by their SHA-1), so that the next
# run, anyone's, starts where this one ended.
#   recipes/fuzz.sh [SECONDS] [TARGET...]      (needs: clang libclang-rt-14-dev)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${LOIP_FUZZ_BUILD:-build-fuzz}
seconds=${1:-300}
shift || true
CC=clang cmake -S . -B "$build" -DLOIP_FUZZ=ON -DLOIP_CUDA=OFF >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c | sed 's/^fuzz_//')"); done
  for f in tests/fuzz/lua/*.lua; do targets+=("$(basename "$f" .lua)"); done
fi
cmake --build "$build" -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
total=0
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/fuzz-corpus/$t"
  log="$build/fuzz-$t.log"
  if ! (cd "$build" && "./fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        "fuzz-corpus/$t" "$root/tests/fuzz/corpus/$t" >"fuzz-$t.log" 2>&1); then
    echo "fuzz_$t: FAILED (see $log)"; status=1
  fi
  if [ "${LOIP_FUZZ_MERGE:-0}" = 1 ] && [ $status -eq 0 ]; then
    (cd "$build" && "./fuzz_$t" -merge=1 -timeout=20 -rss_limit_mb=2048 "$root/tests/fuzz/corpus/$t" "fuzz-corpus/$t" \
      >"fuzz-$t-merge.log" 2>&1) || { echo "fuzz_$t: merge FAILED (see $build/fuzz-$t-merge.log)"; status=1; }
  fi
  n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  echo "fuzz_$t: ${n:-0} executions in ${seconds} s"
  total=$((total + ${n:-0}))
done
echo "total: $total executions"
exit $status
