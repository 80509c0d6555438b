// The datagram engine measured from inside, for the benchmark's datagram experiments (`slotstream
// dgram-peer`, bench/dgram_experiments.py, docs/bench-peer.md): a receiver that stores nothing and times
// every message at the moment the engine finished it (complete, or its timer fired), and the engine's
// own sender, without the Sender facade (its retransmissions and credit waits counted). A program moves
// its data with Sender and Receiver (transport udp); this is for measuring them.
//
// Time stamps are CLOCK_MONOTONIC nanoseconds (monotonic_ns(), slotstream/instruments.h): a sender that
// writes its send time into a message's first 8 bytes gives the receiver its latency, both ends on one
// host. Threading: as Sender and Receiver.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"

namespace slotstream {

// One sender's messages as the probe receiver saw them.
struct DatagramProbeTimes {
  int64_t first_ns = 0;               // the earliest first segment of any of its messages
  std::vector<int64_t> arrivals_ns;   // per message: when the engine finished it
  std::vector<int64_t> latencies_ns;  // per complete message of 8 bytes or more: finished - its first 8 bytes
};

struct DatagramProbeReceiverOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 0;  // 0: a free port
  bool keep_partial = false;
  std::chrono::nanoseconds message_timeout = std::chrono::milliseconds(200);
  std::chrono::nanoseconds session_timeout = std::chrono::seconds(10);
  DatagramFaults faults;  // on the datagrams this end receives
  std::string token;      // non-empty: senders must prove it
  // Each ended sender, with its times. Both callbacks run on the engine's callback thread, one at a time and in
  // order, never on its network thread: one that waits (for a reader of a pipe, say) holds back only the
  // callbacks after it, while senders are served and a FIN_ACK a sender did not get is repeated. sessions_ended()
  // counts a sender once this has returned.
  std::function<void(const SessionReport&, const DatagramProbeTimes&)> on_session_end;
  std::function<void(const std::string&)> on_event;
};

class DatagramProbeReceiver {
 public:
  static Status start(DatagramProbeReceiverOptions options, std::unique_ptr<DatagramProbeReceiver>* out);
  ~DatagramProbeReceiver();  // stops
  std::string listen_address() const;
  uint64_t sessions_ended() const;
  // Since a FIN was last answered: a receiver about to exit waits until this passes a second or so (a
  // lost FIN_ACK makes the sender repeat its FIN).
  std::chrono::nanoseconds since_last_fin_ack() const;
  // Ends every session; returns once the callbacks still waiting (the reports of those sessions too) have run,
  // or at once when called from a callback.
  void stop();

  struct Impl;

 private:
  explicit DatagramProbeReceiver(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct DatagramProbeSenderOptions {
  std::string host;
  uint16_t port = 0;
  std::string name = "probe";
  std::string protocol = "write_record";  // a datagram protocol (docs/datagram.md)
  uint32_t slots = 4;                     // message slots per device (SenderOptions::blocks)
  uint32_t segment_size = 8192;           // payload bytes per datagram
  uint64_t max_message = 1u << 20;
  std::chrono::nanoseconds finish_timeout = std::chrono::seconds(30);  // for the FIN_ACK after the last message
  DatagramFaults faults;                                               // on the datagrams this end sends
  std::string token;
};

struct DatagramProbeSenderStats {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  uint64_t datagrams = 0;     // segments sent, retransmissions and control included
  uint64_t retransmits = 0;   // dgram_rd
  uint64_t credit_waits = 0;  // dgram_rd: sends that waited for credits
};

// Sends device 0's messages.
class DatagramProbeSender {
 public:
  static Status connect(const DatagramProbeSenderOptions& options, std::unique_ptr<DatagramProbeSender>* out);
  ~DatagramProbeSender();
  Status send(std::span<const std::byte> message);
  // FIN, then the receiver's FIN_ACK (dgram_rd: after every datagram is acknowledged).
  Status finish();
  DatagramProbeSenderStats stats() const;

  struct Impl;

 private:
  explicit DatagramProbeSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream
