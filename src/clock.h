// The one clock of the tree: CLOCK_MONOTONIC in nanoseconds. Timers, durations and the time stamps
// that travel between the processes of one host (sync-latency samples in ACKs, the benchmark's send
// times) all read it, so they agree with each other. Header-only: the preload shim and the fuzz
// targets, which link no more of slotstream than they must, can use it too.
#pragma once

#include <cstdint>
#include <ctime>

namespace slotstream {

inline int64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

}  // namespace slotstream
