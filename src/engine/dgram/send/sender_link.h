// The datagram sender's lower layers (engine/dgram/llp/llp.h): a connected UDP socket with batched sends
// (sendmmsg) and send-side fault injection (`send --inject-*`), with RD's sequencing, credits and
// retransmission (engine/dgram/llp/rd.h) for a sequenced protocol — or, for dgram_rc, one TCP stream. The link
// encodes and signs segments (once the session has keys), and hands every datagram that comes back to
// the session (set_receiver). Threading: one thread at a time (the sender's mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/dgram/llp/injector.h"
#include "engine/dgram/llp/llp.h"
#include "engine/dgram/llp/rd.h"
#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram {

class SegmentMac;

struct LinkOptions {
  std::string host;
  uint16_t port = 0;
  size_t socket_buffer = 8u << 20;
  InjectOptions inject;  // faults on the datagrams this end sends (UDP only)
  int64_t connect_timeout_ns = 5'000'000'000;
  int ttl = 0;            // a multicast group's hop limit (0: 1); only with a group
  std::string interface;  // where multicast leaves (empty: by route); only with a group
};

class SenderLink {
 public:
  // Resolves the receiver and connects to it: a UDP socket, or a TCP stream (over_tcp).
  static Status open(const Descriptor& proto, const LinkOptions& o, std::unique_ptr<SenderLink>* out);

  const Address& peer() const { return peer_; }
  bool over_tcp() const { return tcp_ != nullptr; }
  // The peer is an IP multicast group (engine/dgram/wire/control.h ANNOUNCE): nothing comes back.
  bool multicast() const { return multicast_; }
  uint32_t qp() const { return qp_; }
  // Where datagrams from the receiver go (progress() calls it).
  void set_receiver(std::function<void(std::span<const std::byte>)> on) { on_datagram_ = std::move(on); }
  // Signs every segment from now on (the session's key towards the receiver).
  void set_mac(SegmentMac* mac) { mac_ = mac; }

  // A data segment (`h.service` is the protocol's): RD sequences it, waiting for a credit first.
  Status emit(SegmentHeader h, std::span<const std::byte> payload);
  // A control message (engine/dgram/wire/control.h): out at once; unsequenced over UDP (the sender repeats it
  // until answered), in order over TCP.
  Status send_control(std::span<const uint8_t> payload);
  // TERMINATE (engine/dgram/wire/control.h) to the receiver, out at once (best effort: it may be lost over UDP).
  Status send_terminate(const Terminate& t);
  // The session is over (the receiver terminated it): every later send and progress() returns `why`.
  void abort(Status why) { aborted_ = std::move(why); }
  // Sends what is batched or queued.
  Status flush();
  // Sends the batch once a message is out (TCP: once its queue is large, or the message's last).
  Status end_message();
  // Waits up to timeout_ms for input and hands it to the receiver; RD retransmits what is due.
  Status progress(int timeout_ms);
  // An RD acknowledgement from the receiver (a segment whose MAC was checked).
  void on_ack(const SegmentHeader& h);
  bool all_acked() const { return rd_.all_acked(); }

  struct Stats {
    uint64_t datagrams = 0;     // segments sent, retransmissions and control included
    uint64_t credit_waits = 0;  // RD: sends that waited for credits
  };
  const Stats& stats() const { return stats_; }
  const RdSender::Stats& rd_stats() const { return rd_.stats(); }
  const Injector::Stats* injected() const { return faults_ ? &faults_->stats() : nullptr; }

 private:
  SenderLink(const Descriptor& proto) : proto_(proto) {}
  Status put_datagram(std::span<const std::byte> d);
  void batch_add(std::span<const std::byte> d);
  Status emit_tcp(const SegmentHeader& h, std::span<const std::byte> payload);
  Status emit_rd(SegmentHeader h, std::span<const std::byte> payload);
  Status wait_credit();
  Status receive_tcp(int timeout_ms);
  Status receive_udp(int timeout_ms);
  Status open_udp(const LinkOptions& o);
  Status retransmit();
  void encode(const SegmentHeader& h, std::span<const std::byte> payload);

  const Descriptor& proto_;
  Address peer_;
  uint32_t qp_ = 0;
  SegmentMac* mac_ = nullptr;
  std::function<void(std::span<const std::byte>)> on_datagram_;
  // UD and RD
  std::unique_ptr<UdpSocket> udp_;
  UdpSocket::Batch batch_;
  UdpSocket::Inbox inbox_{16};
  std::optional<FaultyLink> faults_;
  RdSender rd_;
  // RC
  std::unique_ptr<FramedStream> tcp_;
  uint32_t control_msn_ = 0;
  uint32_t terminate_msn_ = 0;
  bool multicast_ = false;
  Status aborted_;
  std::vector<std::byte> scratch_;
  Stats stats_;
};

}  // namespace slotstream::dgram
