#include "engine/dgram/recv/report.h"

#include <array>

namespace slotstream::dgram {
namespace {

struct Field {
  CounterDoc doc;
  uint64_t DatagramCounters::*field;
};

// The session counters: key, /metrics family (the names the datagram receiver has always exported),
// help. `bytes` is internal (placement's own bookkeeping).
constexpr Field kFields[] = {
    {{"datagrams", "slotstream_dgram_datagrams_total", "Datagrams (segments) received."}, &DatagramCounters::datagrams},
    {{"crc_errors", "slotstream_dgram_crc_errors_total", "Datagrams that failed their CRC32C: never delivered."},
     &DatagramCounters::crc_errors},
    {{"malformed", "slotstream_dgram_malformed_total", "Datagrams with a bad header."}, &DatagramCounters::malformed},
    {{"truncated", "slotstream_dgram_truncated_total", "Datagrams too long to receive."}, &DatagramCounters::truncated},
    {{"stale", "slotstream_dgram_stale_total", "Segments of messages already finished."}, &DatagramCounters::stale},
    {{"duplicate_segments", "slotstream_dgram_duplicate_segments_total", "Segments whose bytes were all there."},
     &DatagramCounters::duplicates},
    {{"conflicting_segments", "slotstream_dgram_conflicting_segments_total",
      "Duplicate segments with different bytes (the first writer's bytes stay)."},
     &DatagramCounters::conflicting},
    {{"out_of_bounds", "slotstream_dgram_out_of_bounds_total", "Segments outside their region or message."},
     &DatagramCounters::out_of_bounds},
    {{"no_buffer", "slotstream_dgram_no_buffer_total", "Sends that found no posted receive."},
     &DatagramCounters::no_buffer},
    {{"unknown", "slotstream_dgram_unknown_total", "Segments for no session, STag or queue."},
     &DatagramCounters::unknown},
    {{"forged", "slotstream_dgram_forged_total", "Datagrams of an authenticated session without a valid MAC: dropped."},
     &DatagramCounters::forged},
    {{"expired", "slotstream_dgram_expired_total", "Messages whose timer fired before they were complete."},
     &DatagramCounters::expired},
    {{"rd_duplicates", "slotstream_dgram_rd_duplicates_total", "RD sequences received twice."},
     &DatagramCounters::rd_duplicates},
    {{"rd_beyond_window", "slotstream_dgram_rd_beyond_window_total", "RD sequences beyond the credits."},
     &DatagramCounters::rd_beyond_window},
    {{"acks_sent", "slotstream_dgram_acks_sent_total", "RD acknowledgements sent."}, &DatagramCounters::acks_sent},
    {{"injected_loss", "slotstream_dgram_injected_loss_total", "Datagrams dropped by --inject-loss."},
     &DatagramCounters::injected_loss},
    {{"injected_corrupt", "slotstream_dgram_injected_corrupt_total", "Datagrams corrupted by --inject-corrupt."},
     &DatagramCounters::injected_corrupt},
    {{"injected_duplicate", "slotstream_dgram_injected_duplicate_total", "Datagrams duplicated by --inject-duplicate."},
     &DatagramCounters::injected_duplicate},
    {{"injected_reorder", "slotstream_dgram_injected_reorder_total", "Datagrams reordered by --inject-reorder."},
     &DatagramCounters::injected_reorder},
};

// The devices' totals that only the datagram transport has.
struct DeviceField {
  CounterDoc doc;
  uint64_t DeviceAccount::*field;
};
constexpr DeviceField kDeviceFields[] = {
    {{"retired", "slotstream_dgram_retired_total",
      "Incomplete messages displaced by a newer MSN on their STag (counted in dropped)."},
     &DeviceAccount::retired},
    {{"sent", nullptr, "Messages the sender's FIN says it sent."}, &DeviceAccount::sent},
    {{"bytes_sent", nullptr, "Bytes the sender's FIN says it sent."}, &DeviceAccount::bytes_sent},
};

constexpr auto kDocs = [] {
  std::array<CounterDoc, std::size(kFields) + std::size(kDeviceFields)> docs{};
  size_t i = 0;
  for (const auto& f : kFields) docs[i++] = f.doc;
  for (const auto& f : kDeviceFields) docs[i++] = f.doc;
  return docs;
}();

}  // namespace

std::span<const CounterDoc> counter_docs() { return kDocs; }

const char* refusal_label(AnnounceRefusal r) {
  switch (r) {
    case AnnounceRefusal::kMalformed:
      return "malformed";
    case AnnounceRefusal::kProtocol:
      return "protocol";
    case AnnounceRefusal::kLimits:
      return "limits";
    case AnnounceRefusal::kNameTaken:
      return "name_taken";
    case AnnounceRefusal::kFull:
      return "full";
    case AnnounceRefusal::kMemory:
      return "memory";
    case AnnounceRefusal::kStore:
      return "store";
  }
  return "?";
}

std::map<std::string, uint64_t> protocol_counters(const DatagramCounters& c,
                                                  const std::map<uint16_t, DeviceAccount>& devices) {
  std::map<std::string, uint64_t> out;
  for (const auto& f : kFields) out[f.doc.key] = c.*f.field;
  for (const auto& f : kDeviceFields) {
    uint64_t sum = 0;
    for (const auto& [_, a] : devices) sum += a.*f.field;
    out[f.doc.key] = sum;
  }
  return out;
}

void fill_report(const std::map<uint16_t, DeviceAccount>& devices, const DatagramCounters& c, SessionReport* r) {
  for (const auto& [d, a] : devices) {
    DeviceStats& s = r->per_device[d];
    s.messages = a.complete;
    s.bytes = a.valid_bytes;
    s.gaps = s.lost = a.lost;
    s.duplicates = a.duplicates;
    s.partial = a.partial;
    s.dropped = a.dropped;
  }
  const DeviceStats t = device_totals(*r);
  r->messages = t.messages;
  r->bytes = t.bytes;
  r->gaps = t.gaps;
  r->duplicates = c.duplicates;
  r->partial_discarded = t.dropped;
  r->unknown_device = c.unknown;
  r->out_of_window = c.out_of_bounds;
  r->bad_headers = c.malformed;
  r->protocol_counters = protocol_counters(c, devices);
}

uint64_t counter(const SessionReport& r, std::string_view key) {
  const auto it = r.protocol_counters.find(std::string(key));
  return it == r.protocol_counters.end() ? 0 : it->second;
}

DeviceStats device_totals(const SessionReport& r) {
  DeviceStats t;
  for (const auto& [_, s] : r.per_device) t.add(s);
  return t;
}

}  // namespace slotstream::dgram

namespace slotstream {

std::span<const DatagramCounterDoc> datagram_counter_docs() { return dgram::counter_docs(); }

std::span<const char* const> announce_refusal_reasons() {
  static const auto kReasons = [] {
    std::array<const char*, dgram::kAnnounceRefusals> out{};
    for (size_t i = 0; i < out.size(); ++i) out[i] = dgram::refusal_label(dgram::AnnounceRefusal(i));
    return out;
  }();
  return kReasons;
}

}  // namespace slotstream
