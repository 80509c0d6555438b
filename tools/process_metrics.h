// The standard process metrics of a Prometheus client (process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
// process_max_fds, process_start_time_seconds, process_threads), read from /proc/self at scrape
// time — prometheus-cpp has no process collector of its own — and slotstream_build_info.
#pragma once

#include <vector>

#include <prometheus/metric_family.h>

namespace slotstream::tools {

// Both families sets, now. Any thread.
std::vector<prometheus::MetricFamily> process_families();
std::vector<prometheus::MetricFamily> build_info_families();

}  // namespace slotstream::tools
