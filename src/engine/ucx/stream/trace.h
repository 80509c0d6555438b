// Per-stage timestamps of single packets: where one message's latency goes (read by
// `slotstream bench-peer --trace`). Off unless a process turns it on; then every stage of every
// packet is recorded, up to a fixed number of events, into memory allocated up front.
//
// The stages, in the order a packet passes them (sender, then receiver; CLOCK_MONOTONIC, so two
// processes on one host compare):
//   committed  the filler wrote the block and marked it full (send ring, paper status 1)
//   posted     the protocol's transmit returned (the puts are issued; who issued them — the
//              filler itself or the sending thread — is the hand-off this stage exposes)
//   polled     the receiver found the block (its poll of the protocol returned it)
//   delivered  the sink committed the message (last fragment)
// A packet is named by (device, packet number), which both sides know.
//
// Threading: trace() from any thread; enable_trace() before, trace_events() after the threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace slotstream::stream {

enum class TraceStage : uint8_t { kCommitted, kPosted, kPolled, kDelivered };
const char* trace_stage_name(TraceStage stage);

struct TraceEvent {
  uint64_t ns = 0;  // steady clock
  uint64_t packet = 0;
  uint16_t device = 0;
  TraceStage stage = TraceStage::kCommitted;
};

// Starts recording (up to `capacity` events; later ones are dropped and counted).
void enable_trace(size_t capacity);
// Whether recording is on: one relaxed load, for a caller to skip preparing an event (trace()
// itself returns at once when off).
bool tracing();
void trace(TraceStage stage, uint16_t device, uint64_t packet);
// The events recorded so far (in no particular order) and how many did not fit.
std::vector<TraceEvent> trace_events(uint64_t* dropped = nullptr);

}  // namespace slotstream::stream
