// Reliable datagram (RD) service: the lower layer that makes UDP reliable and in order per source.
//
// Patent ("Reliable, In-Order Delivery"): "For the RD service, the LLP is assumed to guarantee that
// messages from a specific data source are delivered correctly and in-order ... To keep the
// scalability advantages of using a connection-less transport, the LLP reliability service is
// assumed ... to be lightweight and should require no or minimal buffering for individual remote
// sockets." So: per source a sequence number on every data datagram, a cumulative acknowledgement
// with a 64-bit selective-ack bitmap and a credit count flowing back, retransmission on timeout
// (RTO from smoothed RTT samples, Karn's rule, exponential back-off) and on three later sequences
// acknowledged (fast retransmit), and no congestion control — the credits are flow control (the
// receiver's buffer), nothing more. Sequence numbers are 32-bit and compared modulo 2^32.
//
// Pure logic: the caller sends and receives the datagrams. Threading: one thread per object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram {

// Signed distance from a to b (b - a) in sequence space.
inline int32_t seq_diff(uint32_t a, uint32_t b) { return static_cast<int32_t>(b - a); }

class RdSender {
 public:
  struct Options {
    uint32_t initial_credits = 64;  // until the receiver's first ack says otherwise
    // RFC 6298 starts at 1 s with a 1 s floor; a datagram RDMA network is a LAN, but the floor
    // must stay above the queueing delay of a receiver that is briefly behind a burst (on
    // loopback a 3 MB burst queues ~5 ms), or every burst is retransmitted for nothing.
    int64_t rto_initial_ns = 30'000'000;
    int64_t rto_min_ns = 10'000'000;
    int64_t rto_max_ns = 1'000'000'000;
    int64_t give_up_ns = 10'000'000'000;  // a datagram unacknowledged this long: the peer is gone
  };
  RdSender() : RdSender(Options{}) {}
  explicit RdSender(Options o);

  // The sequence number the next new datagram takes.
  uint32_t next_seq() const { return next_; }
  // True if the receiver's credits allow one more new datagram.
  bool window_open() const { return seq_diff(ack_, next_) < int64_t(credits_); }
  // Records datagram `next_seq()` (a copy is kept until acknowledged) and advances next_seq().
  void sent(std::vector<std::byte> datagram, int64_t now_ns);
  // Processes an acknowledgement; returns how many datagrams it newly acknowledged.
  size_t on_ack(uint32_t ack, uint32_t credits, uint64_t sack, int64_t now_ns);
  // Datagrams to send again now (timed out, or passed by three acknowledged later ones).
  void due(int64_t now_ns, std::vector<const std::vector<std::byte>*>* out);
  // True when the window is closed by zero credits with nothing in flight for an RTO: the
  // caller should send a probe (an ack with kRdProbe) so that a lost credit update cannot stall us.
  bool wants_probe(int64_t now_ns);

  bool all_acked() const { return unacked_.empty(); }
  size_t in_flight() const { return unacked_.size(); }
  // A datagram has gone unacknowledged for give_up_ns.
  bool failed(int64_t now_ns) const;
  int64_t next_timer_ns() const;  // INT64_MAX if nothing is in flight
  int64_t rto_ns() const { return rto_; }

  struct Stats {
    uint64_t sent = 0;
    uint64_t retransmits = 0;
    uint64_t timeouts = 0;
    uint64_t fast_retransmits = 0;
    uint64_t probes = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  struct Entry {
    std::vector<std::byte> datagram;
    int64_t first_sent_ns = 0;
    int64_t last_sent_ns = 0;
    int64_t deadline_ns = 0;
    int retransmits = 0;
    bool sacked = false;
  };
  void rtt_sample(int64_t rtt_ns);

  Options o_;
  uint32_t base_ = 0;  // oldest unacknowledged (= seq of unacked_.front())
  uint32_t next_ = 0;
  uint32_t ack_ = 0;  // the receiver's cumulative ack
  uint32_t credits_;
  std::deque<Entry> unacked_;
  int64_t srtt_ = 0, rttvar_ = 0, rto_;
  int64_t closed_since_ns_ = -1;
  Stats stats_;
};

class RdReceiver {
 public:
  // `window`: datagrams buffered beyond the next expected one (the credits it grants).
  explicit RdReceiver(uint32_t window) : window_(window) {}

  enum class Result {
    kInOrder,       // the next expected: process it now, then pop() what it unblocked
    kBuffered,      // ahead of a hole: kept until the hole is filled
    kDuplicate,     // already received
    kBeyondWindow,  // more than `window` ahead: dropped (the sender ignored its credits)
  };
  Result on_segment(uint32_t seq, std::span<const std::byte> datagram);
  // The next buffered datagram that is now in order, if any.
  bool pop(std::vector<std::byte>* out);
  // The acknowledgement to send now, granting `credits` (the window, or 0 under back-pressure).
  RdFields ack(uint32_t credits) const;
  uint32_t expected() const { return expected_; }
  uint32_t window() const { return window_; }

 private:
  uint32_t window_;
  uint32_t expected_ = 0;
  // [i] holds sequence expected_ + i once received ([0] never: it would be in order).
  std::deque<std::vector<std::byte>> ahead_;
  std::deque<bool> have_;
};

}  // namespace slotstream::dgram
