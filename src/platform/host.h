// What this host has free right now, for the platform's records and the edge's load: idle CPU
// cores between two readings of /proc/stat (CpuMeter), and available memory (/proc/meminfo).
#pragma once

#include <cstdint>

namespace slotstream::platform {

// Idle and busy CPU time between calls. Threading: one thread at a time.
class CpuMeter {
 public:
  CpuMeter();
  // Since the last call (or construction): the busy fraction of all CPUs (0..1) and the idle
  // cores (busy fraction's complement times the online CPUs).
  struct Reading {
    double busy = 0;
    double idle_cores = 0;
  };
  Reading read();

 private:
  uint64_t busy_ = 0, total_ = 0;
};

// MemAvailable from /proc/meminfo, bytes (0 when unreadable).
uint64_t available_memory();
// Online CPUs (at least 1).
unsigned online_cpus();

}  // namespace slotstream::platform
