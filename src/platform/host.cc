#include "platform/host.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>

namespace slotstream {

namespace {

// The "cpu" line of /proc/stat: busy and total jiffies (iowait counts as idle).
bool cpu_times(uint64_t* busy, uint64_t* total) {
  FILE* f = std::fopen("/proc/stat", "r");
  if (!f) return false;
  unsigned long long v[8] = {};
  const int n = std::fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                            &v[6], &v[7]);
  std::fclose(f);
  if (n < 4) return false;
  *total = 0;
  for (auto x : v) *total += x;
  *busy = *total - v[3] - v[4];
  return true;
}

}  // namespace

CpuMeter::CpuMeter() { (void)cpu_times(&busy_, &total_); }

CpuMeter::Reading CpuMeter::read() {
  uint64_t busy = 0, total = 0;
  Reading r;
  if (!cpu_times(&busy, &total) || total <= total_) {
    r.idle_cores = platform::online_cpus();
    return r;
  }
  r.busy = double(busy - busy_) / double(total - total_);
  r.idle_cores = (1 - r.busy) * platform::online_cpus();
  busy_ = busy;
  total_ = total;
  return r;
}

}  // namespace slotstream

namespace slotstream::platform {

uint64_t available_memory() {
  FILE* f = std::fopen("/proc/meminfo", "r");
  if (!f) return 0;
  char line[256];
  unsigned long long kb = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "MemAvailable: %llu kB", &kb) == 1) break;
  }
  std::fclose(f);
  return uint64_t(kb) * 1024;
}

unsigned online_cpus() {
  const long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? unsigned(n) : 1;
}

}  // namespace slotstream::platform
