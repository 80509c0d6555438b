#include "engine/ucx/stream/trace.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include "clock.h"

namespace slotstream::stream {
namespace {

struct Buffer {
  explicit Buffer(size_t n) : events(new TraceEvent[n]), capacity(n) {}
  std::unique_ptr<TraceEvent[]> events;
  size_t capacity;
  std::atomic<size_t> next{0};
};

std::atomic<Buffer*> g_buffer{nullptr};  // set once, never freed (a tracing process is short-lived)

}  // namespace

const char* trace_stage_name(TraceStage stage) {
  switch (stage) {
    case TraceStage::kCommitted:
      return "committed";
    case TraceStage::kPosted:
      return "posted";
    case TraceStage::kPolled:
      return "polled";
    case TraceStage::kDelivered:
      return "delivered";
  }
  return "?";
}

void enable_trace(size_t capacity) {
  if (g_buffer.load() == nullptr) g_buffer.store(new Buffer(capacity), std::memory_order_release);
}

bool tracing() { return g_buffer.load(std::memory_order_relaxed) != nullptr; }

void trace(TraceStage stage, uint16_t device, uint64_t packet) {
  Buffer* b = g_buffer.load(std::memory_order_acquire);
  if (!b) return;
  const size_t i = b->next.fetch_add(1, std::memory_order_relaxed);
  if (i >= b->capacity) return;
  b->events[i] = {uint64_t(now_ns()), packet, device, stage};
}

std::vector<TraceEvent> trace_events(uint64_t* dropped) {
  Buffer* b = g_buffer.load(std::memory_order_acquire);
  if (!b) return {};
  const size_t n = std::min(b->next.load(), b->capacity);
  if (dropped) *dropped = b->next.load() - n;
  return {b->events.get(), b->events.get() + n};
}

}  // namespace slotstream::stream
