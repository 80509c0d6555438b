// Receiver side of the stream layer: turns the protocol's records (a block header and its
// payload, in a block of its own or packed in a ring) into complete, in-order messages per
// device and hands them to a MessageSink.
//
// Ordering (paper §3.4: "arranges the data in sequence based on the packet number"): the sender
// writes each device's packets in order, and every status byte is fenced after the previous
// one, so when packet p+1 is visible, packet p is visible too — at worst one scan later (a scan
// may read p's byte just before it flips). A block ahead of its device's expected packet is
// therefore left in place (not copied) and picked up on the next pass. If a device makes no
// progress over two consecutive passes while a later packet waits, the missing packets can
// only be a gap: they are counted, the broken message is discarded and delivery moves on.
//
// Back-pressure per device: a sink that answers kBusy when a message of device D begins (its
// worker is behind) pauses D alone — D's records stay where they are, every other device goes
// on, D is tried again every kBusyRetry, and `on_pause` tells the session (which tells the
// sender to stop filling D). Any other sink error stops the whole pass as before (a full disk
// concerns every device).
//
// Threading: one consumer thread per connected sender.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "protocol/protocol.h"
#include "slotstream/slotstream.h"
#include "wire/block_header.h"

namespace slotstream::stream {

struct DeliveryCounters {
  uint64_t messages = 0;
  uint64_t bytes = 0;  // payload bytes of complete messages
  uint64_t gaps = 0;   // packets that never arrived
  uint64_t duplicates = 0;
  uint64_t unknown_device = 0;
  uint64_t out_of_window = 0;
  uint64_t bad_headers = 0;
  uint64_t broken_messages = 0;  // discarded because a fragment was missing
  uint64_t partial_discarded = 0;
  // Buffer utilisation (SDP Fig. 6), time-weighted between passes: receiver memory held by
  // unreleased records (Record::bytes) and the payload bytes in them, in byte-nanoseconds, and
  // the time observed (from the first pass to the last). Averages: *_byte_ns / observed_ns.
  double buffer_held_byte_ns = 0;
  double buffer_useful_byte_ns = 0;
  double buffer_observed_ns = 0;
  // Complete messages, from the pass that first took up the first block to the sink's commit.
  LatencyHistogram store_latency;
};

class Delivery {
 public:
  Delivery(protocol::ReceiverProtocol& proto, MessageSink& sink, const std::vector<uint16_t>& devices);

  static constexpr std::chrono::milliseconds kBusyRetry{100};
  // Called when a device is paused (true) or resumes (false).
  void set_pause_handler(std::function<void(uint16_t device, bool paused)> fn) { on_pause_ = std::move(fn); }

  // One pass over the records complete now. `*consumed` = records released. A sink error is
  // returned as is; the record stays unreleased (back-pressure) and the next pass retries it
  // exactly where it failed.
  // `now`: when the pass began (the caller's clock read; buffer utilisation and paused devices'
  // retries are timed with it).
  Status pass(size_t* consumed, std::chrono::steady_clock::time_point now);
  Status pass(size_t* consumed) { return pass(consumed, std::chrono::steady_clock::now()); }
  // Discards every partially received message (the sender is gone). Returns how many.
  uint64_t abort_partials();
  bool has_open_message() const;
  // Whether some device is paused (its records wait for its sink).
  bool any_paused() const;
  // Leaves records in receiver block `slot` unprocessed while blocked (holding a block in
  // protocols that have no per-block hold of their own).
  void set_blocked(uint32_t slot, bool blocked) { blocked_[slot] = blocked; }
  uint64_t messages(uint16_t device) const;
  std::map<uint16_t, DeviceStats> per_device() const;
  const DeliveryCounters& counters() const { return counters_; }

  // Packets further ahead than this are not believed (a corrupt or hostile header): four times
  // what the protocol can have unreleased at once.
  static uint64_t window(uint64_t max_records) { return 4 * (max_records < 64 ? 64 : max_records); }

 private:
  struct DeviceState {
    uint32_t expected = 0;
    bool open = false;
    uint64_t open_bytes = 0;
    uint32_t stuck_passes = 0;
    std::chrono::steady_clock::time_point retry_at{};  // while paused: when to try its sink again
    // When the pass that first tried to begin the open message began (store latency).
    std::optional<std::chrono::steady_clock::time_point> taken_up;
    DeviceStats counters;
    // Within one pass (reset at its end; no per-pass allocation): a packet was delivered, and the
    // distance of the nearest packet waiting behind a missing one (-1: none).
    bool pass_progressed = false;
    int64_t pass_waiting = -1;
  };
  struct Entry {
    protocol::Record record;
    wire::BlockHeader header;
  };
  enum class Stage { kBegin, kAppend, kCommit };

  // Applies one in-order fragment from `stage` on; on error records where to resume.
  Status apply(const Entry& e, Stage stage);

  protocol::ReceiverProtocol& proto_;
  MessageSink& sink_;
  std::map<uint16_t, DeviceState> devices_;
  DeliveryCounters counters_;
  struct Pending {
    Entry entry;
    Stage stage;
  };
  std::optional<Pending> pending_;
  std::map<uint32_t, bool> blocked_;
  std::vector<protocol::Record> records_;  // scratch, reused across passes
  std::function<void(uint16_t, bool)> on_pause_;
  std::vector<Entry> entries_;
  bool pass_interrupted_ = false;  // a pass returned early: the devices' pass_* marks are stale
  // What the last pass found held (buffer utilisation is integrated from one pass to the next).
  std::optional<std::chrono::steady_clock::time_point> last_pass_;
  std::chrono::steady_clock::time_point pass_now_{};  // when the current pass began
  uint64_t last_held_ = 0;
  uint64_t last_useful_ = 0;
};

}  // namespace slotstream::stream
