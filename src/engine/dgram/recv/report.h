// What the datagram receiver counts, and how it shows it in slotstream's one reporting surface: a
// sender's session becomes a SessionReport (include/slotstream/slotstream.h) like a block sender's —
// per device what became of every message (DeviceStats: complete, partial, dropped, lost, gaps,
// duplicates, bytes), and the transport's own counters in protocol_counters, each documented in
// counter_docs() with the /metrics family it becomes. Receiver-wide counters (ReceiverCounters) and the
// datagrams that belong to no session are the receiver's own. Plain values; threading: none.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "slotstream/datagram.h"
#include "slotstream/slotstream.h"

namespace slotstream::dgram {

// One device's messages as the session accounts for them: each exactly once as complete, partial,
// dropped or lost (the sender's FIN says how many there were).
struct DeviceAccount {
  uint64_t sent = 0;  // from the sender's FIN (0 until it arrives)
  uint64_t bytes_sent = 0;
  uint64_t complete = 0;
  uint64_t partial = 0;      // incomplete, kept
  uint64_t dropped = 0;      // incomplete (or not storable in time), discarded
  uint64_t lost = 0;         // nothing of it arrived
  uint64_t retired = 0;      // of the incomplete ones: displaced by a newer MSN on the STag
  uint64_t valid_bytes = 0;  // bytes of complete and kept partial messages that arrived
  uint64_t duplicates = 0;   // segments of this device whose bytes were all there
};

// Per-datagram counters, for one session or (unattributable datagrams) the whole receiver.
struct DatagramCounters {
  uint64_t datagrams = 0;
  uint64_t bytes = 0;          // payload bytes of segments accepted for placement
  uint64_t crc_errors = 0;     // failed CRC32C: never delivered
  uint64_t malformed = 0;      // other header errors (see engine/dgram/wire/wire.h DecodeError), or not the protocol's
  uint64_t truncated = 0;      // longer than the receive buffer
  uint64_t stale = 0;          // for a message already finished
  uint64_t duplicates = 0;     // every byte already there
  uint64_t conflicting = 0;    // of the duplicates: bytes differ from the first writer's (which stay)
  uint64_t out_of_bounds = 0;  // outside the STag's region / past the message's end
  uint64_t no_buffer = 0;      // Send without a free posted receive
  uint64_t unknown = 0;        // unknown STag/queue, or from no session
  uint64_t forged = 0;         // an authenticated session's datagram without a right MAC: dropped
  uint64_t expired = 0;        // messages whose timer fired before they were complete (any service)
  uint64_t rd_duplicates = 0;  // RD: sequence already received (a retransmission that crossed an ack)
  uint64_t rd_beyond_window = 0;  // RD: past the credits granted
  uint64_t acks_sent = 0;         // RD
  uint64_t injected_loss = 0, injected_corrupt = 0, injected_duplicate = 0, injected_reorder = 0;
};

// Why a receiver on a multicast group refused a sender's ANNOUNCE (engine/dgram/recv/admission.h): the `reason` label
// of /metrics' slotstream_dgram_announces_refused_total. A group's sender hears no REFUSE, so these
// counts and the receiver's log are the only place a refusal shows.
enum class AnnounceRefusal : uint8_t {
  kMalformed,  // the ANNOUNCE does not decode, or its STags do not fit 32 bits
  kProtocol,   // a reliable protocol (it acknowledges every datagram; a group cannot)
  kLimits,     // the hello's terms are outside this receiver's limits (check_hello)
  kNameTaken,  // a live session has the name (it may pass once that one has gone silent)
  kFull,       // the session table is full of sessions that may not be evicted
  kMemory,     // recv --max-memory
  kStore,      // the store could not be opened for the name
};
inline constexpr size_t kAnnounceRefusals = size_t(AnnounceRefusal::kStore) + 1;
// The /metrics label: malformed, protocol, limits, name_taken, full, memory, store.
const char* refusal_label(AnnounceRefusal r);

// What the receiver turned away or cut short, receiver-wide.
struct ReceiverCounters {
  uint64_t hellos_refused = 0;         // HELLO/AUTH answered with REFUSE (or not answered: see replies_withheld)
  uint64_t challenges = 0;             // CHALLENGEs sent (a token is set)
  uint64_t auth_failures = 0;          // AUTH with a stale or foreign cookie or a wrong proof
  uint64_t replies_withheld = 0;       // answers not sent: larger than the request before authentication
  uint64_t sessions_evicted = 0;       // unauthenticated sessions ended to make room for a new sender
  uint64_t memory_refusals = 0;        // senders refused for `--max-memory`
  uint64_t connections_refused = 0;    // TCP connections closed at once (cap reached, nothing to evict)
  uint64_t connections_evicted = 0;    // TCP connections not yet authenticated, closed for a newer one
  uint64_t connections_timed_out = 0;  // TCP connections without a session after the hello deadline
  uint64_t accept_errors = 0;          // accept() failed (e.g. the descriptor limit): listener rested 100 ms
  uint64_t log_suppressed = 0;         // log lines not printed (rate limit); the counters still count
  uint64_t sessions_terminated = 0;    // sessions ended by a TERMINATE, sent or received (a protocol error)
  // Multicast senders refused, by AnnounceRefusal: each sender once per reason (its repeated ANNOUNCEs
  // are not counted again).
  std::array<uint64_t, kAnnounceRefusals> announces_refused{};
};

// A key of SessionReport::protocol_counters, what it counts, and the /metrics counter family it
// becomes (public: slotstream/datagram.h).
using CounterDoc = DatagramCounterDoc;
std::span<const CounterDoc> counter_docs();

// The session's counters and its devices' totals (retired, sent, bytes_sent) as protocol_counters.
std::map<std::string, uint64_t> protocol_counters(const DatagramCounters& c,
                                                  const std::map<uint16_t, DeviceAccount>& devices = {});

// Fills the message and datagram accounting of `r` (its sender, outcome and duration are the
// receiver's): per device DeviceStats, the session sums (messages = complete, gaps = lost,
// partial_discarded = dropped, unknown_device = unknown STag or queue, out_of_window = out of bounds,
// bad_headers = malformed) and protocol_counters. Devices' pauses are left as they are.
void fill_report(const std::map<uint16_t, DeviceAccount>& devices, const DatagramCounters& c, SessionReport* r);

// protocol_counters[key] of `r`, 0 if it has none.
uint64_t counter(const SessionReport& r, std::string_view key);

// Every device of `r` summed (the recv line's and the benchmark's totals).
DeviceStats device_totals(const SessionReport& r);

}  // namespace slotstream::dgram
