// What the ring protocols of the SDP paper (§3 "RDMA-based", §4 "NIC-assisted" flow control) share:
// one receive ring managed by the sender, records packed back to back, notifications that emulate
// RDMA write-with-immediate, and ACKs that return freed bytes (or credits). packed_ring.h and
// nic_assisted.h hold each protocol's own decisions; this file holds the ring itself.
//
// Ring layout. The receiver registers one region of R = N x S bytes (the `--blocks` x
// `--block-size` geometry; no status bytes). Positions are monotonic byte counts (u64) on both
// sides; a position lies at offset position % R in the ring. The sender writes a *segment* — one
// record, or several coalesced records back to back — at the ring's tail with one put and then,
// behind a fence, notifies (position, length). Records keep their 16-byte block header
// (wire/block_header.h), whose payload length is how the receiver finds the next record in a
// segment. A segment never straddles the ring's end: when the next one does not fit before the
// end, the sender first sends a *wrap marker* — a notification with the padding flag for the
// bytes from the tail to the end, and no data. The receiver counts the padding as used and frees
// it as soon as everything before it is released (it holds no record), so both sides' space
// accounting stays exact and the padding costs one notification per lap.
//
//     0                                                                        R
//     | rec | rec | rec rec rec rec (one coalesced segment) | rec | wrap marker |
//
// The receiver frees in ring order (a ring can only move its head over a released prefix) and
// tells the sender its head: the ACK carries the cumulative bytes freed, so a lost ordering or a
// duplicate ACK cannot free anything twice.
//
// Wire formats (active-message headers, little-endian, copied as structs):
//
//   Notice (sender -> receiver, id kRingNoticeAm), 24 bytes:
//     byte 0         8          16        20       24
//         | session  | position | length  | flags  |
//     session  u64  the random id the receiver handed out in its set-up (ACCEPT); a notice that
//                   carries another one is not for this ring and is dropped
//     position u64  where the segment starts; must equal the receiver's tail
//     length   u32  segment bytes (records back to back), or padding bytes
//     flags    u32  bit 0: wrap marker (no data; length = R - position % R); other bits zero
//
//   Ack (receiver -> sender, id kRingAckAm), 24 bytes:
//     byte 0       8          16             24
//         | freed  | credits  | generated_ns |
//     freed        u64  the receiver's head: bytes freed since the start, in ring order
//     credits      u64  nic_assisted: credits granted after the initial R / W (cumulative); else 0
//     generated_ns u64  the receiver's CLOCK_MONOTONIC when it sent the ACK (sync-latency samples)
//
// Receiver set-up (ACCEPT): u64 ring address | u64 session | u64 R | u64 W (0: no credits) |
// blob32 packed rkey.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

inline constexpr unsigned kRingNoticeAm = 21;
inline constexpr unsigned kRingAckAm = 22;
inline constexpr uint32_t kNoticePadding = 1u << 0;

struct RingNotice {
  uint64_t session;
  uint64_t position;
  uint32_t length;
  uint32_t flags;
};
struct RingAck {
  uint64_t freed;
  uint64_t credits;
  uint64_t generated_ns;
};
static_assert(sizeof(RingNotice) == 24 && sizeof(RingAck) == 24, "fixed AM layouts");

// Largest segment one write may carry (the notice's length is 32 bits).
inline constexpr uint64_t kMaxSegment = uint64_t(1) << 30;

// ------------------------------------------------------------------------------ pure logic

// The sender's view of the receiver ring: its own tail and the head the receiver last reported.
class RingSpace {
 public:
  explicit RingSpace(uint64_t bytes) : bytes_(bytes) {}
  uint64_t bytes() const { return bytes_; }
  uint64_t head() const { return head_; }
  uint64_t tail() const { return tail_; }
  uint64_t free() const { return bytes_ - (tail_ - head_); }
  // Bytes from the tail to the ring's end: the longest segment that can start at the tail.
  uint64_t to_end() const { return bytes_ - tail_ % bytes_; }
  // Padding a segment of `length` needs first (0: it fits before the end).
  uint64_t padding_for(uint64_t length) const { return length > to_end() ? to_end() : 0; }
  // Takes `length` bytes at the tail (the caller checked free() and to_end()); returns their position.
  uint64_t take(uint64_t length) {
    const uint64_t at = tail_;
    tail_ += length;
    return at;
  }
  // The receiver reports its head at `freed`. False (and ignored) when that is behind what is
  // known already (a late ACK) or beyond anything written (a bogus one).
  bool freed(uint64_t freed);

 private:
  uint64_t bytes_;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

// Records waiting in a sender-side buffer (SDP's send buffer), appended back to back and sent
// from the front in runs of whole records. Linear, not circular: its space is reused only once
// everything in it has been sent (reset()), so a record is never split and the source of a put
// still in flight is never overwritten.
class CoalesceBuffer {
 public:
  explicit CoalesceBuffer(uint64_t capacity) : capacity_(capacity) {}
  uint64_t capacity() const { return capacity_; }
  bool empty() const { return lengths_.empty(); }  // nothing unsent
  bool fits(uint64_t length) const { return end_ + length <= capacity_; }
  // Reserves `length` bytes at the end; returns the offset to copy the record to.
  uint64_t append(uint32_t length);
  uint64_t front_offset() const { return sent_; }
  uint32_t front_length() const { return lengths_.front(); }
  // Bytes of the longest run of whole unsent records from the front that fits in `limit`, and
  // (in *count) how many records it holds. 0 when the first record alone is larger.
  uint64_t run(uint64_t limit, size_t* count) const;
  // The first `count` unsent records (`bytes` in all) were sent.
  void sent(uint64_t bytes, size_t count);
  // Starts again at offset 0; only when empty() (and the caller's puts from it completed).
  void reset();
  uint64_t pending_bytes() const { return end_ - sent_; }
  size_t pending_records() const { return lengths_.size(); }

 private:
  uint64_t capacity_;
  uint64_t sent_ = 0;             // offset of the first unsent record
  uint64_t end_ = 0;              // offset after the last record
  std::deque<uint32_t> lengths_;  // unsent records, in order
};

// Splits a segment (records back to back) into its records: each is a 16-byte block header plus
// the payload length the header names. Bytes that do not start with a valid header, or whose
// payload would run past the segment, become one last record of all the remaining bytes — the
// stream layer counts it as a bad header and releases it, so the ring's accounting stays whole.
void split_records(std::span<const std::byte> segment, std::vector<std::span<const std::byte>>* out);

// The receiver's account of its ring, independent of UCX: where the next segment must start,
// which bytes hold unreleased records, how far the head can move (in ring order) and, with a
// virtual window W (nic_assisted, SDP §4.1), how many credits it may grant.
class RingLedger {
 public:
  enum class Verdict {
    kOk,
    kWrongPosition,  // not at the tail: a notice was lost, duplicated or invented
    kEmpty,          // a data segment of 0 bytes
    kCrossesEnd,     // a data segment across the ring's end
    kBadPadding,     // a wrap marker that does not end exactly at the ring's end
    kOverrun,        // more than the free space: it would overwrite unreleased records
    kOverWindow,     // nic_assisted: longer than W
    kNoCredit,       // nic_assisted: the sender has no credit for it
  };
  static const char* verdict_name(Verdict v);

  // `window` 0: no credits (packed_ring). Else the sender starts with bytes / window credits.
  RingLedger(uint64_t bytes, uint64_t window);

  // Checks a notice against the rules; kOk counts it as used (a wrap marker also as released).
  Verdict accept(uint64_t position, uint64_t length, bool padding);
  // One record of the data segment accepted last, in order, covering the segment; returns its id.
  uint64_t add_record(uint64_t position, uint32_t length);
  // Record `id` is done with. False for an unknown id or one released already.
  bool release(uint64_t id);
  bool released(uint64_t id) const;

  uint64_t bytes() const { return bytes_; }
  uint64_t head() const { return head_; }
  uint64_t tail() const { return tail_; }
  uint64_t used() const { return tail_ - head_; }
  // Credits: grants as many as free space not promised yet allows (one per W); returns how many.
  uint64_t grant();
  uint64_t initial_credits() const { return window_ ? bytes_ / window_ : 0; }
  uint64_t granted() const { return granted_; }  // cumulative, after the initial ones
  uint64_t outstanding() const { return outstanding_; }

 private:
  struct Entry {
    uint32_t length;
    bool released;
  };
  void advance();

  uint64_t bytes_;
  uint64_t window_;
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
  uint64_t filled_ = 0;  // end of the records added so far (<= tail_)
  // From head_ to filled_, in ring order: records and padding. A record's id is its entry's
  // index in the sequence of all entries (so ids grow, with gaps where padding was).
  std::deque<Entry> entries_;
  uint64_t first_entry_ = 0;  // index of entries_.front()
  uint64_t granted_ = 0;
  uint64_t outstanding_ = 0;
};

// What a ring sender does to the network, apart from its decisions: the UCX link below, or a
// fake ring in unit tests.
class RingWire {
 public:
  virtual ~RingWire() = default;
  // Puts `length` bytes at ring position `position`, then (behind a fence) notifies the segment.
  // If the put is still running on return, *req holds it and `src` must stay untouched until then.
  virtual Status write(const std::byte* src, uint32_t length, uint64_t position, fabric::Request* req) = 0;
  // Notifies a wrap marker: padding of `length` bytes from `position` to the ring's end.
  virtual Status pad(uint64_t position, uint32_t length) = 0;
};

// What every ring sender core counts (its stats() reports them by these names).
struct RingCounters {
  uint64_t direct_writes = 0;      // records written straight from their send block
  uint64_t coalesced_records = 0;  // records copied into the sender-side (coalescing) buffer
  uint64_t coalesced_writes = 0;   // writes that carried coalesced records
  uint64_t coalesced_bytes = 0;
  uint64_t wrap_markers = 0;
};

// Requests for puts from a sender-side buffer: the buffer may be reused once all completed.
class PutTracker {
 public:
  void add(fabric::Request req);
  // Whether every tracked put completed (frees the finished ones). Errors are returned.
  Status all_done(bool* done);

 private:
  std::vector<fabric::Request> pending_;
};

// A sender-side buffer with its memory: records are copied in and written out, in runs of whole
// records, at the ring's tail. Shared by packed_ring's sender buffer and nic_assisted's
// software-handled buffer; when to write (space, credits) is theirs to decide.
class Coalescer {
 public:
  explicit Coalescer(std::span<std::byte> memory) : buffer_(memory.size()), memory_(memory) {}
  bool empty() const { return buffer_.empty(); }
  uint32_t front_length() const { return buffer_.front_length(); }
  // Copies the record in; *added is false when the buffer has no room for it.
  Status add(const std::byte* src, uint32_t length, bool* added);
  // Writes the longest run of whole records that fits in `limit`, the ring's end and kMaxSegment
  // at the ring's tail (one write); *bytes: how much (0: the first record does not fit).
  Status write_run(RingWire& wire, RingSpace& space, uint64_t limit, uint64_t* bytes, RingCounters* counters);

 private:
  Status reclaim();
  CoalesceBuffer buffer_;
  std::span<std::byte> memory_;
  PutTracker puts_;
};

// ------------------------------------------------------------------------------- over UCX

// The receiver's set-up as the sender reads it from ACCEPT.
struct RingSetup {
  uint64_t address = 0;
  uint64_t session = 0;
  uint64_t bytes = 0;
  uint64_t window = 0;
  std::vector<uint8_t> rkey;
};
Status parse_ring_setup(std::span<const uint8_t> setup, RingSetup* out);

// The UCX side of a ring sender (sending thread only): puts, fences and notices (RingWire), and
// ACKs, which arrive inside worker progress and are handed to `on_ack`.
class RingLink final : public RingWire {
 public:
  using AckHandler = std::function<void(const RingAck& ack, uint64_t received_ns)>;
  static Status create(SenderFabric& fabric, const RingSetup& setup, AckHandler on_ack, std::unique_ptr<RingLink>* out);
  ~RingLink() override;

  Status write(const std::byte* src, uint32_t length, uint64_t position, fabric::Request* req) override;
  Status pad(uint64_t position, uint32_t length) override;
  // Registered sender-side memory (a put source UCX can read without copying).
  Status allocate(size_t bytes, std::unique_ptr<fabric::MemoryRegion>* out);
  // Frees the headers of notices that completed.
  void reap();
  uint64_t notices() const { return notices_; }
  uint64_t acks_ignored() const { return acks_ignored_; }

 private:
  struct Pending {
    fabric::Request req;
    RingNotice notice;
  };
  RingLink(SenderFabric& fabric, const RingSetup& setup) : fabric_(fabric), setup_(setup) {}
  Status notify(uint64_t position, uint32_t length, uint32_t flags);

  SenderFabric& fabric_;
  RingSetup setup_;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  AckHandler on_ack_;
  std::deque<Pending> pending_;  // notice headers still owned by UCX (a deque never moves them)
  uint64_t notices_ = 0;
  uint64_t acks_ignored_ = 0;
  fabric::AmRegistration ack_handler_;  // last: unhooked before the rest goes
};

// What both ring senders share over UCX: the link, ACK handling and statistics, liveness.
class RingSender : public SenderProtocol {
 protected:
  explicit RingSender(SenderFabric& fabric) : fabric_(fabric) {}
  // Connects the link: each ACK goes to apply_ack(), which says whether it changed anything.
  Status connect(const RingSetup& setup);
  virtual bool apply_ack(const RingAck& ack) = 0;
  Status check_alive();
  // stats_ plus the counters every ring sender reports: the core's, idle_writes (segments written
  // from idle_st, i.e. while the application sent nothing), notices_sent, acks_ignored (stale or
  // bogus). sync_ops: ACKs that changed something; sync_op_samples_ns: per such ACK, from the
  // receiver sending it until the sender handled it (both ends read CLOCK_MONOTONIC; one host).
  ProtocolStats ring_stats(const RingCounters& c) const;

  SenderFabric& fabric_;
  std::unique_ptr<RingLink> link_;
  ProtocolStats stats_;
  uint64_t idle_writes_ = 0;

 private:
  void on_ack(const RingAck& ack, uint64_t now);
  uint64_t acks_ignored_ = 0;
};

// The sender-side buffer's size: `option` (0: the ring's size, SDP's send buffer of the receive
// buffer's size); at least one block, or a record could never be coalesced.
Status sender_buffer_size(std::string_view protocol, uint64_t option, const Geometry& g, uint64_t* out);

// The receiver half of both ring protocols (`window` 0: packed_ring; else nic_assisted's W).
Status make_ring_receiver(ReceiverFabric& fabric, uint64_t window, std::unique_ptr<ReceiverProtocol>* out);

}  // namespace slotstream::protocol
