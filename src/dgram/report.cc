#include "dgram/report.h"

namespace slotstream::dgram {
namespace {

void add_device(DeviceReport* a, const DeviceReport& x) {
  for (auto f : {&DeviceReport::sent, &DeviceReport::bytes_sent, &DeviceReport::complete, &DeviceReport::partial,
                 &DeviceReport::dropped, &DeviceReport::lost, &DeviceReport::retired, &DeviceReport::valid_bytes}) {
    a->*f += x.*f;
  }
}

}  // namespace

DeviceReport device_totals(const SessionReport& r) {
  DeviceReport t;
  for (const auto& [_, d] : r.devices) add_device(&t, d);
  return t;
}

void accumulate(SessionReport* into, const SessionReport& r) {
  for (const auto& [d, x] : r.devices) add_device(&into->devices[d], x);
  DatagramCounters& a = into->counters;
  const DatagramCounters& c = r.counters;
  for (auto f : {&DatagramCounters::datagrams,
                 &DatagramCounters::bytes,
                 &DatagramCounters::crc_errors,
                 &DatagramCounters::malformed,
                 &DatagramCounters::truncated,
                 &DatagramCounters::stale,
                 &DatagramCounters::duplicates,
                 &DatagramCounters::conflicting,
                 &DatagramCounters::out_of_bounds,
                 &DatagramCounters::no_buffer,
                 &DatagramCounters::unknown,
                 &DatagramCounters::forged,
                 &DatagramCounters::expired,
                 &DatagramCounters::rd_duplicates,
                 &DatagramCounters::rd_beyond_window,
                 &DatagramCounters::acks_sent,
                 &DatagramCounters::injected_loss,
                 &DatagramCounters::injected_corrupt,
                 &DatagramCounters::injected_duplicate,
                 &DatagramCounters::injected_reorder}) {
    a.*f += c.*f;
  }
}

}  // namespace slotstream::dgram
