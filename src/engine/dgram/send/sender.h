// The sending end of the datagram transport: a queue pair bound to its own UDP socket (UD, RD)
// or TCP connection (RC), one session with one receiver.
//
//   connect (HELLO -> ACCEPT: the receiver's STags and region length; with a token HELLO ->
//            CHALLENGE -> AUTH -> ACCEPT, the receiver's proof checked, engine/dgram/wire/auth.h)
//   send(device, message) ...          messages of one device are numbered 0, 1, 2, ... (the MSN)
//   finish (FIN parts -> FIN_ACK parts: what the receiver made of every message)
//
// To an IP multicast group (host 239.x.y.z ...; UD protocols only) there is no handshake and no
// FIN_ACK: the sender ANNOUNCEs itself to the group and sends its FIN parts a few times
// (engine/dgram/wire/control.h ANNOUNCE); every receiver on the group accounts for the stream on its own.
//
// With a token every datagram after ACCEPT carries a MAC under the session's key (engine/dgram/wire/mac.h), and
// datagrams from the receiver without a right one are dropped (DatagramSenderStats::forged).
//
// How a message travels is the protocol's (engine/dgram/protocol/protocol.h: Descriptor::data_header and ::notice;
// protocol/write_record.h, protocol/send_recv.h, protocol/rc_write.h): its segments carry its bytes at their offsets,
// the last flagged L, and a write_record message completes at the sender when the last segment is handed to UDP
// (patent: "the source completes the operation at the moment that the last bit of the message is passed to transport
// layer"). Below it, the link (engine/dgram/send/sender_link.h): UDP datagrams — sequenced and kept until acknowledged
// for dgram_rd (a send waits while the receiver's credits are used up) — or dgram_rc's TCP stream. The handshake is
// engine/dgram/send/sender_handshake.h. Threading: every public function may be called from any thread; calls are
// serialised internally. Messages of one device must not be sent from two threads at once (their order would be
// undefined).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/llp/injector.h"
#include "engine/dgram/wire/control.h"
#include "slotstream/status.h"

namespace slotstream::dgram {

struct DatagramSenderOptions {
  std::string host;
  uint16_t port = 0;
  std::string name;
  std::string protocol = "write_record";
  std::vector<uint16_t> devices;
  uint32_t ring = 4;                // STags per device (receives posted per device for Send)
  uint64_t max_message = 1u << 20;  // the largest message this sender will send
  uint32_t segment_size = 8192;     // payload bytes per segment (one datagram)
  std::string token;                // non-empty: authenticate (send --token-file); the receiver must have it
  InjectOptions inject;             // faults on the datagrams this end sends
  size_t socket_buffer = 8u << 20;
  int64_t handshake_timeout_ns = 5'000'000'000;
  int64_t finish_timeout_ns = 30'000'000'000;  // for FIN_ACK after the last message
  int ttl = 0;                                 // host a multicast group: its hop limit (0: 1)
  std::string interface;                       // host a multicast group: where it leaves (empty: by route)
};

struct DatagramSenderStats {
  uint64_t messages = 0;
  uint64_t bytes = 0;
  uint64_t datagrams = 0;     // segments sent, retransmissions and control included
  uint64_t retransmits = 0;   // RD
  uint64_t timeouts = 0;      // RD: retransmission timer fired
  uint64_t credit_waits = 0;  // RD: sends that waited for credits
  uint64_t forged = 0;        // datagrams from the receiver's address without a right MAC: dropped
  uint64_t injected_loss = 0, injected_corrupt = 0, injected_duplicate = 0, injected_reorder = 0;
  std::map<uint16_t, uint64_t> per_device;
};

class DatagramSender {
 public:
  using FillFn = std::function<Status(uint64_t offset, std::span<std::byte> dst)>;

  // What connect() checks before it touches the network (the protocol, devices, ring, segment size).
  static Status validate(const DatagramSenderOptions& options);
  // Resolves, binds, and runs the handshake. *out is set only on success.
  static Status connect(const DatagramSenderOptions& options, std::unique_ptr<DatagramSender>* out);
  ~DatagramSender();

  Status send(uint16_t device, std::span<const std::byte> message);
  // A message of `length` bytes written by `fill` (called once, for the whole message).
  Status send_with(uint16_t device, uint64_t length, const FillFn& fill);
  // FIN, then waits for the receiver's FIN_ACK parts (RD: after every datagram is acknowledged); *report
  // holds every device's counts.
  Status finish(FinAck* report);

  DatagramSenderStats stats() const;
  const std::string& protocol() const;
  // Sending to an IP multicast group: finish() reports no receiver's counts (each receiver has its own).
  bool multicast() const;
  uint32_t segment_size() const;

  struct Impl;

 private:
  explicit DatagramSender(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream::dgram
