// What the datagram transport (transport udp, dgram_rc) counts, for reports and monitoring. A finished or
// lost sender's SessionReport has, besides its per-device DeviceStats, the transport's own counters in
// protocol_counters; each key is documented here with the /metrics counter family `slotstream recv
// --metrics` turns it into. Receiver::counters() has the receiver-wide ones (refusals, the datagrams of no
// session under "unattributed:<key>"). Plain values; threading: none.
#pragma once

#include <span>

namespace slotstream {

struct DatagramCounterDoc {
  const char* key;     // in SessionReport::protocol_counters
  const char* metric;  // the /metrics family, one sample per sender; nullptr: reports and the recv line only
  const char* help;    // one line for people
};
std::span<const DatagramCounterDoc> datagram_counter_docs();

// Why a receiver on a multicast group refused a sender's ANNOUNCE, each once per sender: malformed,
// protocol, limits, name_taken, full, memory, store. The `reason` label of /metrics'
// slotstream_dgram_announces_refused_total; Receiver::counters() has them as "announces_refused:<reason>".
std::span<const char* const> announce_refusal_reasons();

}  // namespace slotstream
