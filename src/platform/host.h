// What this host has free right now, for the platform's records and the edge's load: idle CPU
// cores between two readings of /proc/stat (CpuMeter), and available memory (/proc/meminfo).
#pragma once

#include <cstdint>

#include "slotstream/platform.h"

namespace slotstream::platform {

// Idle and busy CPU time between calls: public (slotstream/platform.h).
using CpuMeter = slotstream::CpuMeter;

// MemAvailable from /proc/meminfo, bytes (0 when unreadable).
uint64_t available_memory();
// Online CPUs (at least 1).
unsigned online_cpus();

}  // namespace slotstream::platform
