#!/usr/bin/env bash
# Builds and runs the unit tests, the protocol tests (tests/engine/ucx/protocol: every protocol over real
# UCX, shm and tcp), the platform's etcd tests, the GStreamer plugin's core (tests/gst) and the library
# examples (hello_stream; zero_copy_recv --self-send: zero-copy views) under a sanitizer, each in a build directory of its own:
#   bash scripts/sanitize.sh thread     ThreadSanitizer                     -> build-tsan/
#   bash scripts/sanitize.sh address    AddressSanitizer + UBSan (+ leaks)  -> build-asan/
#   bash scripts/sanitize.sh            both
# Without further arguments each gtest binary runs whole, one process each; arguments after the kind go to
# ctest instead (e.g. -R Delivery: that subset, each test in a process of its own). Any report fails the run.
# UCX is Debian's, not instrumented: scripts/tsan.supp silences reports whose other side is inside
# libucp only — never slotstream code. (AddressSanitizer and LeakSanitizer need no suppression.)
set -euo pipefail
cd "$(dirname "$0")/.."
kinds=(thread address)
if (($#)) && [[ "$1" != -* ]]; then kinds=("$1"); shift; fi
root=$PWD
for kind in "${kinds[@]}"; do
  case "$kind" in
    thread) dir=build-tsan ;;
    address) dir=build-asan ;;
    *) echo "sanitize: unknown kind '$kind' (thread or address)" >&2; exit 2 ;;
  esac
  echo "sanitize: $kind: building into $dir/"
  py=(); [ -x /usr/bin/python3 ] && py=(-DPython3_EXECUTABLE=/usr/bin/python3)
  # -O1 -g1: what the sanitizers recommend (usable stacks with file:line), and a quicker build.
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DSLOTSTREAM_SANITIZE="$kind" "${py[@]}" >/dev/null
  cmake --build "$dir" --target unit_tests protocol_tests platform_tests gst_tests hello_stream zero_copy_recv
  # halt_on_error / abort: the first report fails the test that caused it. history_size=7 (the
  # most): with less, the other stack of a report is often lost, and a suppression (which matches
  # either stack) cannot apply.
  # UCX's memory hooks (libucm) patch mmap/madvise to take a pthread rwlock; glibc calls madvise as
  # a thread exits, after the sanitizer has dropped that thread's state, and the intercepted lock
  # crashes. They matter only for registration caches of RDMA NICs; shm and tcp do not use them.
  export UCX_MEM_MMAP_HOOK_MODE=none
  export TSAN_OPTIONS="suppressions=$root/scripts/tsan.supp halt_on_error=1 second_deadlock_stack=1 history_size=7"
  export ASAN_OPTIONS="abort_on_error=1 detect_leaks=1 strict_string_checks=1 detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1 halt_on_error=1"
  echo "sanitize: $kind: unit, protocol and example tests"
  # Not the integration and Python tests: they run the CLI binary and a pip-built extension, which
  # these builds do not make instrumented (python.install alone took 96 s here, to no purpose).
  # One test at a time: two at a time (as the main CTest runs) saved ~35 s of each subset's ~70 s, but
  # failed a timing-dependent protocol test in both of two clean-clone runs (HeldWhilePacking under
  # ThreadSanitizer, then Credit.ASenderThatIgnoresItsCredits... over shm), never seen one at a time.
  if (($#)); then
    # A subset (ctest's -R and the like): each test in a process of its own, as the main CTest runs them.
    ctest --test-dir "$dir" --output-on-failure -E '^(integration|python)\.' "$@"
    continue
  fi
  # The whole set: each gtest binary as one process, in the directory CTest runs it in. The same tests,
  # one at a time, without a process start and a UCX context per test: under ThreadSanitizer 78 s instead
  # of 154 s as 636 CTest entries (the 380 unit tests alone: 5 s instead of ~30). The main CTest still
  # runs every test in a process of its own. `timeout`: a hang fails the run instead of stalling CI.
  for binary in unit_tests protocol_tests platform_tests gst_tests; do
    echo "sanitize: $kind: $binary"
    if ! (cd "$dir/tests" && timeout 900 "./$binary" --gtest_brief=1); then
      echo "sanitize: $kind: $binary failed (the report or the failed tests are above)" >&2
      exit 1
    fi
  done
  ctest --test-dir "$dir" --output-on-failure -R '^example\.'
done
