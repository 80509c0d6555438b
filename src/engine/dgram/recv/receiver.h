// The receiving end of the datagram transport: one UDP socket (UD and RD senders) and a TCP
// listener on the same port number (RC senders), any number of sessions.
//
// Per session (a sender: its address and queue pair number, or its TCP connection):
//   - HELLO is checked (engine/dgram/recv/handshake.h) and answered with ACCEPT — the first STag of the
//     device rings (write_record, dgram_rc) or the number of receives posted per device
//     (dgram_send, dgram_rd) — or REFUSE. With a token (`token`), HELLO gets a CHALLENGE and only
//     an AUTH that proves the token starts a session (engine/dgram/wire/auth.h); every datagram of that session
//     then carries a MAC (engine/dgram/wire/mac.h) and one without a right one is dropped and counted (forged).
//     Nothing is kept for a sender before that, and no answer is larger than its request
//     (engine/dgram/recv/admission.h).
//   - a session's memory is promised before it starts (its devices x STags x largest message, against
//     `max_memory`) and allocated only as data arrives (engine/dgram/recv/session.h).
//   - segments are checked (CRC32C first: a corrupted datagram is never delivered, only counted),
//     placed by the session's protocol (engine/dgram/protocol/protocol.h; first writer wins), and finished messages go
//     to the store in order per device (engine/dgram/recv/store_queue.h), each exactly once as complete, partial
//     (kept: Write-Record only, with keep_partial), dropped, or lost.
//   - a store that answers kBusy for a device (its worker is behind) pauses that device: UD drops its
//     messages (counted), RD grants no credits and RC's connection is not read until it goes on.
//   - FIN parts (how many messages each device sent) are answered with FIN_ACK parts once every
//     message is accounted for and stored.
//   - on a multicast group (host 239.x.y.z ...): a sender's ANNOUNCE opens its session (no handshake,
//     nothing sent back; UD protocols only), its FIN ends it, and each receiver accounts on its own.
//   - a sender name is one session at a time; a new UDP session may replace an old one of the same name
//     that has been silent for max(1 s, 2 x message timeout) (a sender that died and was restarted).
//   - at most max_sessions sessions and max_connections TCP connections; a full table makes room by
//     ending an unauthenticated session (those that carried no data first, the longest silent first)
//     or connection (the oldest without a session); a connection without a session after
//     hello_timeout is closed, a session silent for session_timeout is lost.
// Its reports are slotstream's (SessionReport: engine/dgram/recv/report.h says how the datagram counts map).
// Threading: a network thread (engine/dgram/recv/net_loop.h: sockets, placement, timers), a storing thread
// (the stores) and a callback thread (on_session_end and on_event, in order: engine/dgram/recv/callback_thread.h);
// the public functions may be called from any thread, stop() from a callback too (wait_sessions() there would
// wait for the callback it runs in).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/llp/injector.h"
#include "engine/dgram/recv/report.h"
#include "engine/dgram/recv/stores.h"
#include "slotstream/slotstream.h"

namespace slotstream::dgram {

struct DatagramReceiverOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 0;  // 0: a free port (the same number for UDP and TCP)
  // host a multicast group: join it (on this interface; empty: by route) and take ANNOUNCEd UD senders
  // (engine/dgram/wire/control.h), no TCP listener
  std::string interface;
  bool keep_partial = false;                    // store incomplete Write-Record messages as partial
  int64_t message_timeout_ns = 200'000'000;     // a message's timer, from its first segment
  int64_t session_timeout_ns = 30'000'000'000;  // silence after which a sender is lost (also RD/RC messages)
  int64_t hello_timeout_ns = 5'000'000'000;     // a TCP connection without a session is closed after it
  uint64_t max_message = 64ull << 20;           // the largest region a sender may ask for
  uint32_t max_ring = 256;
  std::string token;        // non-empty: senders must prove they have it (recv --token-file)
  uint64_t max_memory = 0;  // what all sessions together may be promised (0: default_max_memory())
  size_t max_sessions = 1024;
  size_t max_connections = 1024;              // TCP connections (dgram_rc), with and without a session
  size_t max_pending_connections = 64;        // of those, without a session yet
  uint32_t rd_window = 512;                   // RD credits: datagrams buffered beyond a hole
  uint64_t max_backlog_bytes = 512ull << 20;  // messages waiting for the store; beyond: UD drops, RD/RC wait
  size_t socket_buffer = 64u << 20;
  InjectOptions inject;  // faults on received datagrams (before the CRC check)
  // Message slots held in a window after each sender's session starts (recv --hold-block; Session::hold).
  std::vector<HoldSpec> holds;
  // Creates the store of a newly accepted sender (nullptr store, or no function: nothing is stored).
  std::function<Status(const SenderInfo& sender, std::unique_ptr<MessageStore>*)> make_store;
  // Both run on the receiver's callback thread, one at a time, in the order the network and storing threads
  // gave them (a finished session's report after its FIN_ACK has gone out). One that blocks (a stdout nobody
  // reads) holds back only the callbacks after it: the network thread, which repeats a lost FIN_ACK and serves
  // every other sender, goes on.
  std::function<void(const SessionReport&)> on_session_end;
  std::function<void(const std::string&)> on_event;
};

class DatagramReceiver {
 public:
  static Status start(DatagramReceiverOptions options, std::unique_ptr<DatagramReceiver>* out);
  ~DatagramReceiver();  // stops
  std::string listen_address() const;
  // Ends every session (their reports say "stopped") and the threads, then runs the callbacks still waiting,
  // those reports among them, before it returns. Any thread; from a callback it returns without waiting for
  // the callbacks after that one (they run once it returns; the destructor waits for them).
  void stop();
  // Senders whose session has ended, and that were senders: authenticated, finished or carried data
  // (a hello that was refused, evicted or never followed by data is not one). A session counts once its
  // on_session_end has returned.
  uint64_t sessions_ended() const;
  // Blocks until `sessions_ended() >= n` or stop() was called. Any thread but the callbacks'.
  void wait_sessions(uint64_t n);
  // Nanoseconds since a FIN was last answered. A receiver about to exit after its last sender waits until
  // this passes a second or so: the FIN_ACK may have been lost, and the sender repeats its FIN until it
  // hears one (a closed port would answer it with "port unreachable" instead).
  int64_t since_last_fin_ack_ns() const;
  // Senders being served now (refreshed about every 100 ms): sessions that authenticated or placed data.
  // A session that ends leaves this list before on_session_end reports it.
  std::vector<SessionReport> live_sessions() const;

  // What the receiver itself counts, besides its senders' reports (for /metrics).
  struct Counters {
    DatagramCounters unattributed;  // datagrams that belonged to no session
    ReceiverCounters receiver;
    uint64_t memory_promised = 0;  // against memory_budget
    uint64_t memory_budget = 0;
    size_t connections = 0;  // TCP connections open
  };
  Counters counters() const;

  struct Impl;

 private:
  explicit DatagramReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream::dgram
