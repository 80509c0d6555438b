// The target side of untagged Sends: receive queues with posted receive buffers.
//
// Patent ("Reliable, In-Order Delivery"): over UD "the incoming messages will be matched to the
// posted receive WRs at the data sink, in order of their arrival at the DDP layer which is not
// necessarily their order of issue at the data source"; the queue number (QN) in the untagged
// DDP header selects the queue ("QP Identification"). A message's segments are told apart by
// (QN, MSN) and placed at their message offset (MO); it completes when its last segment and
// every byte before it are there. Send/Recv delivers whole messages only: a message whose timer
// fires incomplete is dropped (Outcome::kIncomplete; the consumer must not use it) — partial
// placement is what RDMA Write-Record adds.
//
// A queue has `posted` receive buffers: that many messages may be in progress at once; the
// segment of a further message finds no buffer (Placed::kNoBuffer, iWARP's "receiver not
// ready") and is dropped. A completion re-posts its buffer. One ReceiveQueues serves one
// source. post_all() posts on every queue without allocating anything: a queue's bookkeeping
// appears with its first segment. Timers as in engine/dgram/placement/tagged.h (idle mode for RD). Threading: one
// thread.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <vector>

#include "engine/dgram/placement/placement.h"

namespace slotstream::dgram {

class ReceiveQueues {
 public:
  explicit ReceiveQueues(int64_t timeout_ns, bool idle = false) : timeout_ns_(timeout_ns), idle_(idle) {}

  // Posts `count` receive buffers of `capacity` bytes each on queue `qn`.
  void post(uint32_t qn, uint32_t count, uint64_t capacity);
  // The same for every queue not posted on by post() (the caller decides which queue numbers exist).
  void post_all(uint32_t count, uint64_t capacity);

  Placed place(uint32_t qn, uint32_t msn, uint64_t offset, std::span<const std::byte> payload, bool last,
               int64_t now_ns, std::vector<Completion>* out);
  void expire(int64_t now_ns, std::vector<Completion>* out);
  void extend_all(int64_t deadline_ns);
  int64_t next_deadline() const;
  size_t outstanding() const;
  // Queues that have had a segment (each keeps a small record).
  size_t touched() const { return queues_.size(); }

 private:
  struct Queue {
    uint32_t posted = 0;
    uint64_t capacity = 0;
    std::map<uint32_t, Assembly> active;  // by MSN
    // Finished MSNs: all below `floor`, and those in `done` above it (bounded, see finished()).
    uint32_t floor = 0;
    std::set<uint32_t> done;
  };
  static bool finished(const Queue& q, uint32_t msn) { return msn < q.floor || q.done.contains(msn); }
  static void mark_finished(Queue& q, uint32_t msn);

  int64_t timeout_ns_;
  bool idle_;
  uint32_t default_posted_ = 0;
  uint64_t default_capacity_ = 0;
  std::map<uint32_t, Queue> queues_;
};

}  // namespace slotstream::dgram
