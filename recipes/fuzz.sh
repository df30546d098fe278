#!/usr/bin/env bash
# Fuzz loip's parsers for longer than CI does: builds the libFuzzer targets (tests/fuzz/fuzz_*.c,
# and tests/fuzz/lua/*.lua under the LuaJIT driver tests/fuzz/lua_target.c) with clang into build-fuzz (-DLOIP_FUZZ=ON: ASan + UBSan + coverage) and runs each for SECONDS
# (default 300) over its committed seeds and what earlier runs found (build-fuzz/fuzz-corpus),
# then prints the executions per target. A crash stops its target with the input saved as
# build-fuzz/crash-* and the script fails.
#   recipes/fuzz.sh [SECONDS] [TARGET...]      (needs: clang libclang-rt-14-dev)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-300}
shift || true
CC=clang cmake -S . -B build-fuzz -DLOIP_FUZZ=ON -DLOIP_CUDA=OFF >/dev/null
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c | sed 's/^fuzz_//')"); done
  for f in tests/fuzz/lua/*.lua; do targets+=("$(basename "$f" .lua)"); done
fi
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}" >/dev/null
total=0
status=0
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/fuzz-corpus/$t"
  log="build-fuzz/fuzz-$t.log"
  if ! (cd build-fuzz && "./fuzz_$t" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        "fuzz-corpus/$t" "../tests/fuzz/corpus/$t" >"fuzz-$t.log" 2>&1); then
    echo "fuzz_$t: FAILED (see $log)"; status=1
  fi
  n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  echo "fuzz_$t: ${n:-0} executions in ${seconds} s"
  total=$((total + ${n:-0}))
done
echo "total: $total executions"
exit $status
