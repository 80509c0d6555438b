#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, into build-fuzz/) and runs each for a bounded time.
#   bash fuzz/run.sh [--seconds S] [--runs N] [--max-len BYTES] [--jobs J] [TARGET...]
#                                                  (default: every target, 10 s each, one at a time;
#                                                   --jobs 2: two targets at once, each on a core of its own)
# Targets are the fuzz/*_fuzz.cc files (TARGET: control, block_header, delivery, options, ...).
# Each starts from its checked-in seeds (fuzz/corpus/TARGET, read only) plus what earlier runs
# found (build-fuzz/corpus/TARGET). A crash, leak, UB or broken invariant stops that target and
# leaves the input in build-fuzz/artifacts/TARGET/; the script then exits non-zero. Reproduce
# with `build-fuzz/fuzz/TARGET_fuzz FILE` (delivery: FUZZ_TRACE=1 prints every event).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=10
runs=-1
max_len=()
jobs=1
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --runs) runs="$2"; seconds=0; shift 2 ;;
    --max-len) max_len=(-max_len="$2"); shift 2 ;;  # shorter inputs: more executions per second
    --jobs) jobs="$2"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) targets+=("${1%_fuzz}"); shift ;;
  esac
done
if ((${#targets[@]} == 0)); then
  for f in fuzz/*_fuzz.cc; do t="${f#fuzz/}"; targets+=("${t%_fuzz.cc}"); done
fi

build=build-fuzz
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DSLOTSTREAM_FUZZ=ON -DBUILD_TESTING=OFF >/dev/null
fi
cmake --build "$build" --target fuzz_targets

for t in "${targets[@]}"; do
  [ -x "$build/fuzz/${t}_fuzz" ] || { echo "fuzz: no target '$t' (fuzz/${t}_fuzz.cc)"; exit 2; }
done

run_target() {  # prints one line; fails on a finding
  local t=$1 bin="$build/fuzz/$1_fuzz" work="$build/corpus/$1" art="$build/artifacts/$1" log limit=()
  mkdir -p "$work" "$art" "fuzz/corpus/$t"
  log=$(mktemp "$build/fuzz-$t.XXXXXX.log")  # one per run: runs may overlap (CI and a long campaign)
  ((seconds > 0)) && limit=(-max_total_time="$seconds")
  # -timeout: one input may take at most 10 s; -rss_limit_mb: the default, said aloud.
  if "$bin" "${limit[@]}" "${max_len[@]}" -runs="$runs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
       -artifact_prefix="$art/" "$work" "fuzz/corpus/$t" >"$log" 2>&1; then
    local execs secs cov
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    secs=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz: $t: ${execs:-?} executions in ${secs:-?} s, ${cov:-cov: ?}, no finding"
    rm -f "$log"
  else
    echo "fuzz: $t: FINDING (input in $art/, log $log):"
    grep -E "invariant violated|ERROR: |SUMMARY: " "$log" | head -5 | sed 's/^/  /'
    return 1
  fi
}

# --jobs J: J targets at a time (each libFuzzer process is single-threaded); each still gets its S seconds.
failed=()
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
  batch=("${targets[@]:i:jobs}")
  pids=()
  for t in "${batch[@]}"; do
    run_target "$t" >"$build/fuzz-$t.line" &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    wait "${pids[$k]}" || failed+=("${batch[$k]}")
    cat "$build/fuzz-${batch[$k]}.line"
    rm -f "$build/fuzz-${batch[$k]}.line"
  done
done
if ((${#failed[@]})); then
  echo "fuzz: findings in ${failed[*]}"
  exit 1
fi
echo "fuzz: ${#targets[@]} targets, no finding"
