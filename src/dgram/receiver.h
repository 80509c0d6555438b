// The receiving end of the datagram transport: one UDP socket (UD and RD senders) and a TCP
// listener on the same port number (RC senders), any number of sessions.
//
// Per session (a sender: its address and queue pair number, or its TCP connection):
//   - HELLO is answered with ACCEPT: a ring of STags per device (write_record, dgram_rc; each
//     names a region of the largest message's size, allocated when a message starts) or posted
//     receives per device (dgram_send, dgram_rd); REFUSE says why not.
//   - segments are checked (CRC32C first: a corrupted datagram is never delivered, only counted),
//     placed (dgram/tagged.h, dgram/recv_queue.h; RD segments first pass dgram/rd.h), and
//     finished messages go through dgram/device_order.h so the store sees each device's messages
//     in order, each exactly once as complete, partial (kept: Write-Record only, with
//     keep_partial), dropped, or lost.
//   - FIN (how many messages each device sent) is answered with FIN_ACK once every message is
//     accounted for and stored.
//   - a sender name is one session at a time; a new UDP session may replace an old one of the same name
//     that has been silent for max(1 s, 2 x message timeout) (a sender that died and was restarted).
// Threading: a network thread (sockets, placement, timers) and a storing thread (the stores);
// the public functions may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "dgram/control.h"
#include "dgram/injector.h"
#include "dgram/placement.h"
#include "slotstream/status.h"

namespace slotstream::dgram {

// A message handed to a store.
struct Delivered {
  uint16_t device = 0;
  uint32_t msn = 0;      // the sender's message number for this device (0, 1, 2, ...)
  bool partial = false;  // an incomplete Write-Record message kept under keep_partial
  std::span<const std::byte> data;
  const RangeSet* valid = nullptr;  // partial: the bytes that arrived (others are zero)
  bool length_known = true;         // partial: false if the last segment never came (length = highest valid end)
  int64_t first_ns = 0;             // first segment's arrival (CLOCK_MONOTONIC)
  int64_t done_ns = 0;              // complete, or its timer fired
};

// Where one session's messages go. Called from the receiver's storing thread only. A failing
// call is retried with the same message every 100 ms (the error is reported through on_event).
class MessageStore {
 public:
  virtual ~MessageStore() = default;
  virtual Status store(const Delivered& m) = 0;
};

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
  uint64_t out_of_bounds = 0;     // outside the STag's region / past the message's end
  uint64_t no_buffer = 0;         // Send without a free posted receive
  uint64_t unknown = 0;           // unknown STag/queue, or from no session
  uint64_t rd_duplicates = 0;     // RD: sequence already received (a retransmission that crossed an ack)
  uint64_t rd_beyond_window = 0;  // RD: past the credits granted
  uint64_t acks_sent = 0;         // RD
  uint64_t injected_loss = 0, injected_corrupt = 0, injected_duplicate = 0, injected_reorder = 0;
};

struct SessionReport {
  std::string name;
  std::string peer;
  std::string protocol;
  bool finished = false;  // FIN/FIN_ACK; false: lost (silence, TCP reset) or stopped
  std::string reason;
  double seconds = 0;
  std::map<uint16_t, DeviceReport> devices;
  DatagramCounters counters;
};

struct ReceiverOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 0;                            // 0: a free port (the same number for UDP and TCP)
  bool keep_partial = false;                    // store incomplete Write-Record messages as partial
  int64_t message_timeout_ns = 200'000'000;     // a message's timer, from its first segment
  int64_t session_timeout_ns = 30'000'000'000;  // silence after which a UDP sender is lost
  uint64_t max_message = 64ull << 20;           // the largest region a sender may ask for
  uint32_t max_ring = 256;
  uint32_t rd_window = 512;                   // RD credits: datagrams buffered beyond a hole
  uint64_t max_backlog_bytes = 512ull << 20;  // messages waiting for the store; beyond: UD drops, RD/RC wait
  size_t socket_buffer = 64u << 20;
  InjectOptions inject;  // faults on received datagrams (before the CRC check)
  // Creates the store of a newly accepted sender.
  std::function<Status(const std::string& name, std::unique_ptr<MessageStore>*)> make_store;
  std::function<void(const SessionReport&)> on_session_end;
  std::function<void(const std::string&)> on_event;
};

class DatagramReceiver {
 public:
  static Status start(ReceiverOptions options, std::unique_ptr<DatagramReceiver>* out);
  ~DatagramReceiver();  // stops
  std::string listen_address() const;
  // Ends every session (their reports say "stopped") and the threads. Any thread.
  void stop();
  uint64_t sessions_ended() const;
  // Nanoseconds since a FIN was last answered. A receiver about to exit after its last sender waits until
  // this passes a second or so: the FIN_ACK may have been lost, and the sender repeats its FIN until it
  // hears one (a closed port would answer it with "port unreachable" instead).
  int64_t since_last_fin_ack_ns() const;
  // Sessions being served now (refreshed about every 100 ms).
  std::vector<SessionReport> live_sessions() const;

  // Everything a metrics endpoint shows, taken at one instant: a session that ends moves from
  // `live` to `ended` at once, so a counter never shows it twice or not at all.
  struct Snapshot {
    std::vector<SessionReport> live;
    std::map<std::string, SessionReport> ended;  // per sender name, every ended session summed
    uint64_t sessions_ended = 0;
    DatagramCounters unattributed;  // datagrams that belonged to no session
  };
  Snapshot snapshot() const;

  struct Impl;

 private:
  explicit DatagramReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Adds r's device and datagram counters to *into (names and reasons are left as they are).
void accumulate(SessionReport* into, const SessionReport& r);
// Every device of r summed.
DeviceReport device_totals(const SessionReport& r);

// Writes the valid ranges as the `<SEQ>.valid` JSON text: [[offset, length], ...].
std::string valid_ranges_json(const RangeSet& valid);

}  // namespace slotstream::dgram
