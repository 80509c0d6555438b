// The public instruments (include/slotstream/instruments.h) over the fabric's counters and the stream's
// trace.
#include "slotstream/instruments.h"

#include "clock.h"
#include "engine/ucx/fabric/fabric.h"
#include "engine/ucx/stream/trace.h"
#include "wire/block_header.h"

namespace slotstream {

static_assert(kBlockHeaderBytes == wire::kBlockHeaderSize);

int64_t monotonic_ns() { return now_ns(); }

TransportCounters transport_counters() {
  const fabric::Counters c = fabric::counters();
  return {c.endpoints,
          c.registered_bytes,
          c.puts,
          c.gets,
          c.am_sends,
          c.am_received,
          c.tag_sends,
          c.tag_receives,
          c.tag_unexpected,
          c.max_outstanding,
          c.completions,
          c.progress_calls,
          c.progress_useful,
          c.progress_ns,
          c.setup_progress_calls};
}

void reset_transport_counters() { fabric::reset_counters(); }

void enable_trace(size_t capacity) { stream::enable_trace(capacity); }

bool tracing() { return stream::tracing(); }

std::vector<TraceEvent> trace_events(uint64_t* dropped) {
  std::vector<TraceEvent> out;
  for (const stream::TraceEvent& e : stream::trace_events(dropped)) {
    out.push_back({int64_t(e.ns), e.packet, e.device, stream::trace_stage_name(e.stage)});
  }
  return out;
}

}  // namespace slotstream
