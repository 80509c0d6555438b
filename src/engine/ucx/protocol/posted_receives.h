// The receive side that credit (SDP §2) and carc share: N receive buffers of S bytes, each
// pre-posted as a tagged receive ("the receiver posts N receive WQEs to the NIC pointing to the
// receive flow-control buffers"), handed to the consumer as records, and re-posted when the
// consumer releases them. The buffers are one UCX-allocated region (as every protocol's receiver
// memory is), so the budget the receiver reserves per sender (blocks x block size) covers them.
//
// Order: receives for one tag are matched in the order they were posted, so message k of the
// stream lands in the k-th posted receive; but a large (rendezvous) message completes after a
// small (eager) one matched after it. An RC queue pair reports receive completions in posting
// order; we do the same — a completed receive is handed out only once every receive posted
// before it has completed — so each device's packets reach the stream layer in order.
//
// Threading: one consumer thread per sender calls everything (the session thread); the worker's
// progress thread only completes requests inside UCX.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

// The bookkeeping, independent of UCX so it can be unit-tested: which buffer was posted when,
// which are handed out (exposed), and how many received bytes wait unreleased.
class ReceiveQueue {
 public:
  // Buffers 0..n-1, posted in index order.
  explicit ReceiveQueue(uint32_t buffers);

  // What became of the receive at the front of the posting order.
  enum class Outcome { kPending, kArrived, kFailed };
  // Hands out completed receives from the front of the posting order, stopping at the first one
  // still posted. `check(i, &length)` says what became of buffer i's receive; for kFailed the
  // caller has already posted it again (it goes to the back, never exposed: the message is lost).
  // Looks at most at every buffer once. Returns how many were newly exposed.
  template <typename Check>
  uint32_t advance(Check check) {
    uint32_t exposed = 0;
    for (size_t n = posted_.size(); n > 0; --n) {
      const uint32_t i = posted_.front();
      uint32_t length = 0;
      const Outcome o = check(i, &length);
      if (o == Outcome::kPending) break;
      posted_.pop_front();
      if (o == Outcome::kFailed) {
        posted_.push_back(i);
        continue;
      }
      expose(i, length);
      ++exposed;
    }
    return exposed;
  }
  // Exposed, unreleased buffers with their lengths, oldest first.
  struct Ready {
    uint32_t buffer;
    uint32_t length;
  };
  void exposed(std::vector<Ready>* out);
  // The consumer is done with buffer `i`: it goes to the back of the posting order (the caller
  // posts its receive again). Returns its length, or nullopt if `i` is not an exposed buffer
  // (unknown, still posted, or released twice) — nothing changes then.
  std::optional<uint32_t> release(uint32_t i);
  uint32_t buffers() const { return static_cast<uint32_t>(state_.size()); }
  uint32_t posted() const { return static_cast<uint32_t>(posted_.size()); }
  uint64_t unreleased_bytes() const { return unreleased_bytes_; }
  uint64_t max_unreleased_bytes() const { return max_unreleased_bytes_; }
  uint32_t unreleased() const { return unreleased_; }
  uint32_t max_unreleased() const { return max_unreleased_; }

 private:
  enum class State : uint8_t { kPosted, kExposed };
  void expose(uint32_t i, uint32_t length);

  std::vector<State> state_;
  std::vector<uint32_t> length_;
  std::vector<uint32_t> generation_;  // bumped on release: stale entries in exposed_ are skipped
  std::deque<uint32_t> posted_;       // posting order of the receives still posted
  struct Entry {
    uint32_t buffer;
    uint32_t generation;
  };
  std::vector<Entry> exposed_;  // exposure order; released entries removed lazily
  uint64_t unreleased_bytes_ = 0;
  uint64_t max_unreleased_bytes_ = 0;
  uint32_t unreleased_ = 0;
  uint32_t max_unreleased_ = 0;
};

// N posted receives of S bytes for messages tagged `tag`, over real UCX.
class PostedReceives {
 public:
  // Allocates geometry.blocks x geometry.block_size and posts a receive into every buffer.
  static Status create(ReceiverFabric& fabric, uint64_t tag, std::unique_ptr<PostedReceives>* out);
  // Withdraws every posted receive. One that is being filled (a rendezvous under way) cannot be
  // withdrawn: waits up to a second for it, then parks the region with the context (it stays
  // mapped until the transport shuts down) rather than let UCX write into freed memory.
  ~PostedReceives();
  PostedReceives(const PostedReceives&) = delete;
  PostedReceives& operator=(const PostedReceives&) = delete;

  // Records (id = slot = buffer index, bytes = exactly the message) complete and unreleased.
  void poll(std::vector<Record>* out);
  // Re-posts buffer `id` and returns the length of the message it held; nullopt when `id` is not
  // a handed-out buffer (ignored).
  std::optional<uint32_t> release(uint64_t id);

  uint64_t tag() const { return tag_; }
  const ReceiveQueue& queue() const { return queue_; }
  // Receives that found their message already waiting (sent before a receive was posted: a
  // sender that broke the credit rule; UCX buffered it and it is delivered in order all the same).
  uint64_t unexpected() const { return unexpected_; }
  // Receives that failed (message longer than a buffer, or a transport error): message lost.
  uint64_t failed() const { return failed_; }
  // Re-posts that UCX refused: that buffer is out of use for the rest of the session.
  uint64_t repost_failures() const { return repost_failures_; }
  // Records the consumer released (their buffers re-posted).
  uint64_t released() const { return released_; }
  // The above, for ProtocolStats::counters: unexpected_messages (should stay 0), failed_receives,
  // repost_failures, max_unreleased_records, max_unreleased_bytes (received, not yet released).
  std::map<std::string, uint64_t> counters() const;

 private:
  PostedReceives(ReceiverFabric& fabric, uint64_t tag, std::unique_ptr<fabric::MemoryRegion> region);
  Status post(uint32_t i);
  ReceiveQueue::Outcome check(uint32_t i, uint32_t* length);
  std::byte* buffer(uint32_t i) const { return region_->data() + size_t(i) * geometry_.block_size; }

  fabric::Context& context_;
  fabric::Worker& worker_;
  Geometry geometry_;
  uint64_t tag_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::vector<fabric::TagReceive> receives_;
  ReceiveQueue queue_;
  std::vector<ReceiveQueue::Ready> ready_;  // scratch
  uint64_t unexpected_ = 0;
  uint64_t failed_ = 0;
  uint64_t repost_failures_ = 0;
  uint64_t released_ = 0;
};

// Tags for tagged messages: unique within this process (one per receiving session), so the
// receiver's shared worker can tell its senders' messages apart. Any thread.
uint64_t next_receive_tag();

}  // namespace slotstream::protocol
