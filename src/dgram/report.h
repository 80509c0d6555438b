// What the datagram receiver reports: per device (what became of every message), per session and
// receiver-wide (what became of every datagram), and the receiver's defences (ReceiverCounters).
// Plain values. Threading: none of their own.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace slotstream::dgram {

struct DeviceReport {
  uint64_t sent = 0;  // from the sender's FIN (0 until it arrives)
  uint64_t bytes_sent = 0;
  uint64_t complete = 0;
  uint64_t partial = 0;      // incomplete, kept
  uint64_t dropped = 0;      // incomplete (or not storable in time), discarded
  uint64_t lost = 0;         // nothing of it arrived
  uint64_t retired = 0;      // of the incomplete ones: displaced by a newer MSN on the STag
  uint64_t valid_bytes = 0;  // bytes of complete and kept partial messages that arrived
};

// Per-datagram counters, for one session or (unattributable datagrams) the whole receiver.
struct DatagramCounters {
  uint64_t datagrams = 0;
  uint64_t bytes = 0;             // payload bytes of segments accepted for placement
  uint64_t crc_errors = 0;        // failed CRC32C: never delivered
  uint64_t malformed = 0;         // other header errors (see dgram/wire.h DecodeError)
  uint64_t truncated = 0;         // longer than the receive buffer
  uint64_t stale = 0;             // for a message already finished
  uint64_t duplicates = 0;        // every byte already there
  uint64_t conflicting = 0;       // of the duplicates: bytes differ from the first writer's (which stay)
  uint64_t out_of_bounds = 0;     // outside the STag's region / past the message's end
  uint64_t no_buffer = 0;         // Send without a free posted receive
  uint64_t unknown = 0;           // unknown STag/queue, or from no session
  uint64_t forged = 0;            // an authenticated session's datagram without a right MAC: dropped
  uint64_t expired = 0;           // messages whose timer fired before they were complete (any service)
  uint64_t rd_duplicates = 0;     // RD: sequence already received (a retransmission that crossed an ack)
  uint64_t rd_beyond_window = 0;  // RD: past the credits granted
  uint64_t acks_sent = 0;         // RD
  uint64_t injected_loss = 0, injected_corrupt = 0, injected_duplicate = 0, injected_reorder = 0;
};

struct SessionReport {
  std::string name;
  std::string peer;
  std::string protocol;
  bool finished = false;  // FIN/FIN_ACK; false: lost (silence, TCP reset), evicted or stopped
  bool authenticated = false;
  std::string reason;
  double seconds = 0;
  std::map<uint16_t, DeviceReport> devices;  // the devices that carried data (or were in a FIN)
  DatagramCounters counters;
};

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
};

// Adds r's device and datagram counters to *into (names and reasons are left as they are).
void accumulate(SessionReport* into, const SessionReport& r);
// Every device of r summed.
DeviceReport device_totals(const SessionReport& r);

}  // namespace slotstream::dgram
