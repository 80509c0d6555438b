// Shared by the fabric's own .cc files (it includes UCX): nothing outside src/engine/ucx/fabric uses it.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>

#include "engine/ucx/fabric/fabric.h"

#include "slotstream/status.h"

namespace slotstream::fabric::internal {

// A UCX status as ours: in progress is not an error; a vanished peer is kPeerGone.
Status from_ucs(ucs_status_t st, const char* what);

// Counters (fabric.h) for active messages the fabric sends and handles itself (soft_rma.cc: the
// requests and replies that carry tcp puts and gets). Any thread.
void count_am_send();
void count_am_received();

// The fabric's counters (fabric.h Counters) as its .cc files update them: relaxed atomics, any thread.
// Hidden: internal to the library, reached without the GOT as the one file's globals were.
#pragma GCC visibility push(hidden)
struct AtomicCounters {
  std::atomic<uint64_t> endpoints{0}, registered_now{0}, registered_max{0}, puts{0}, gets{0}, am_sends{0},
      am_received{0}, tag_sends{0}, tag_receives{0}, tag_unexpected{0}, outstanding{0}, max_outstanding{0},
      completions{0}, progress_calls{0}, progress_useful{0}, progress_ns{0}, setup_progress_calls{0};
};
extern AtomicCounters g_counters;
// pinned_estimate(): rdma workers alive, bytes registered by contexts that pin (rdma).
extern std::atomic<uint64_t> g_pinned_workers, g_pinned_regions;

inline void raise_max(std::atomic<uint64_t>& max, uint64_t value) {
  uint64_t seen = max.load(std::memory_order_relaxed);
  while (value > seen && !max.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

inline void op_started() { raise_max(g_counters.max_outstanding, g_counters.outstanding.fetch_add(1) + 1); }
inline void op_finished() { g_counters.outstanding.fetch_sub(1); }

// A UCX operation's outcome as `req`: done, failed, or in flight (counted). `get_of`: the endpoint, for a
// get (Request::release). Defined in endpoint.cc.
Status track(ucs_status_ptr_t ptr, const char* what, Request* req, Endpoint* get_of = nullptr);
#pragma GCC visibility pop

}  // namespace slotstream::fabric::internal
