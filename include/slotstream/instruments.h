// Instruments for measuring slotstream from inside a process: what `slotstream bench-peer` reports
// (docs/bench-peer.md) besides what every program sees (SenderStats, SessionReport). Process-wide; meant
// for benchmarks and diagnosis, not for a program's logic.
//
// Time stamps are CLOCK_MONOTONIC nanoseconds (monotonic_ns()), the clock the library stamps with, so the
// stamps of two processes on one host compare.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace slotstream {

// CLOCK_MONOTONIC now, in nanoseconds: the library's own clock (src/clock.h's now_ns).
int64_t monotonic_ns();

// Every block starts with a header of this many bytes (SenderOptions::block_size counts it): a message
// of N bytes fills one block of N + kBlockHeaderBytes.
inline constexpr uint32_t kBlockHeaderBytes = 16;

// What this process asked of UCX since the last reset_transport_counters() (or the start).
struct TransportCounters {
  uint64_t endpoints = 0;         // endpoints created
  uint64_t registered_bytes = 0;  // largest amount of memory registered at once
  uint64_t puts = 0;
  uint64_t gets = 0;
  uint64_t am_sends = 0;
  uint64_t am_received = 0;      // two-sided messages handled
  uint64_t tag_sends = 0;        // tagged two-sided sends
  uint64_t tag_receives = 0;     // tagged receives posted
  uint64_t tag_unexpected = 0;   // ...of which found their message already waiting
  uint64_t max_outstanding = 0;  // most operations in flight at once
  uint64_t completions = 0;      // requests whose completion had to be polled
  // Progress calls (by any thread) and the time spent in them: the CPU a side gives its transport.
  uint64_t progress_calls = 0;
  uint64_t progress_useful = 0;  // calls that found something to do
  uint64_t progress_ns = 0;
  uint64_t setup_progress_calls = 0;  // made only while a peer connected, before the data path
};
TransportCounters transport_counters();
void reset_transport_counters();

// The per-stage trace of single messages: where one message's latency goes. Off unless turned on; then
// every stage of every fragment is recorded, up to `capacity` events held in memory allocated at once
// (later ones are dropped and counted). The stages in the order a fragment passes them: "committed" (the
// filler wrote its block), "posted" (the protocol's transmit returned), "polled" (the receiver found the
// block), "delivered" (the sink committed the message). A fragment is named by (device, packet), which
// both sides know. Threading: enable_trace() before the threads start, trace_events() after they end.
void enable_trace(size_t capacity);

struct TraceEvent {
  int64_t ns = 0;  // monotonic_ns()
  uint64_t packet = 0;
  uint16_t device = 0;
  const char* stage = "";
};
// The events so far, in no particular order (empty when the trace is off); `*dropped`: those that did
// not fit.
std::vector<TraceEvent> trace_events(uint64_t* dropped = nullptr);
bool tracing();

}  // namespace slotstream
