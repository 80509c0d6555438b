// The receiving shim's recombination of large datagrams. The sending shim turns an application datagram
// larger than one MTU into one RDMA Write-Record message (UD): MTU-sized DDP segments to STag
// kShimFirstStag + msn % kShimRing, each with its MSN and tagged offset, the last flagged L
// (engine/dgram/wire/segments.h, the Write-Record descriptor's data_header). Here each source — a peer address and
// the source QP its shim gave the socket — has its own Write-Record placement (engine/dgram/protocol/write_record.h,
// the receiver's own code: RangeSet of valid bytes, first writer wins, one MSN per STag, a timer from the first
// segment). A message that completes becomes a datagram for the application; one whose timer fires (or that a newer MSN
// on its STag retires) is delivered with its holes zero-filled when the options say so
// (SLOTSTREAM_UDP_PARTIAL=deliver), else dropped and counted (patent: "we can then either deliver a partial message
// after the timeout or not deliver the completion and just declare the data as invalid").
//
// Bounded: at most max_sources sources per socket (the least recently heard is ended first, its messages
// handled as timed out), each with kShimRing messages in progress of at most kShimRegion bytes; a source
// silent for kForgetAfter timeouts with nothing in progress is forgotten. Threading: one thread at a time
// (the shim holds the socket's lock); counters are atomics that several sockets may share.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "engine/dgram/placement/placement.h"
#include "engine/dgram/wire/wire.h"

namespace slotstream::dgram {

// The shim's Write-Record addressing: part of its wire format (both ends must agree).
inline constexpr uint32_t kShimFirstStag = 1;
inline constexpr uint32_t kShimRing = 8;        // STags per source: large datagrams that may overlap in flight
inline constexpr uint64_t kShimRegion = 65536;  // a region: the largest UDP payload fits
inline constexpr int kForgetAfter = 10;         // timeouts of silence before an idle source is forgotten

// A datagram for the application: a small one taken off the queue early (readiness checks), or a
// recombined large one.
struct ShimDatagram {
  sockaddr_storage from{};
  socklen_t from_len = 0;
  Buffer data;           // data.size() bytes
  bool partial = false;  // holes are zero
  bool counted = false;  // the shim's counters already have it (read ahead in a batch)
  // The ancillary data the kernel gave with the datagram (a recombined one: with its first placed segment),
  // e.g. IP_PKTINFO naming the multicast group it was sent to; empty when the socket asked for none.
  std::vector<std::byte> control;
};

struct ReassemblyCounters {
  std::atomic<uint64_t> reassembled{0};        // large datagrams recombined whole
  std::atomic<uint64_t> partial_delivered{0};  // incomplete ones handed over, holes zero-filled
  std::atomic<uint64_t> partial_dropped{0};    // incomplete ones dropped (the default)
  std::atomic<uint64_t> late_segments{0};      // segments of a message already finished (stale)
  std::atomic<uint64_t> duplicate_segments{0};
  std::atomic<uint64_t> bad_segments{0};  // outside the shim's STags or region, or past a message's end
};

struct ReassemblyOptions {
  int64_t timeout_ns = 200'000'000;
  bool deliver_partial = false;
  size_t max_sources = 32;
};

class Reassembly {
 public:
  Reassembly(ReassemblyOptions o, ReassemblyCounters* counters);
  ~Reassembly();
  // A checked Write-Record segment from `from` (the caller verified CRC and MAC), with the ancillary data
  // the kernel gave with it. Datagrams it finishes are appended to *out.
  void feed(const Segment& seg, const sockaddr_storage& from, socklen_t from_len, std::span<const std::byte> control,
            int64_t now_ns, std::deque<ShimDatagram>* out);
  // Ends the messages whose timer has fired.
  void expire(int64_t now_ns, std::deque<ShimDatagram>* out);
  // When expire() may next hand the application something (INT64_MAX: never; without partial delivery
  // a timer only frees memory, so it wakes no one).
  int64_t wake_ns() const;
  size_t sources() const { return sources_.size(); }
  size_t outstanding() const;  // sources with a message in progress

 private:
  struct Source;
  Source* source(const sockaddr_storage& from, socklen_t from_len, uint32_t qp, std::deque<ShimDatagram>* out);
  void finish(Source& s, std::vector<Completion>& done, std::deque<ShimDatagram>* out);

  ReassemblyOptions o_;
  ReassemblyCounters* counters_;
  std::vector<std::unique_ptr<Source>> sources_;
};

}  // namespace slotstream::dgram
