// Receiver side of the stream layer: turns the protocol's units (a record, or several records
// packed behind a packed header: wire/block_header.h; in a block of their own or in a ring) into
// complete, in-order messages per device and hands them to a MessageSink.
//
// Ordering (paper §3.4: "arranges the data in sequence based on the packet number"): the sender
// writes each device's packets in order, and every status byte is fenced after the previous
// one, so when packet p+1 is visible, packet p is visible too — at worst one scan later (a scan
// may read p's byte just before it flips). A record ahead of its device's expected packet is
// therefore left in place (not copied) and picked up on the next pass. If a device makes no
// progress over two consecutive passes while a later packet waits, the missing packets can
// only be a gap: they are counted, the broken message is discarded and delivery moves on.
//
// One pass (every ready unit in one pass, no allocation, system call or lock per message): poll, unpack every unit,
// deliver each device's next records in the order found (sorting only what came ahead of its predecessor), hand every
// whole message to the sink in one MessageSink::deliver batch (messages spanning blocks go piece by piece, after the
// batch so far), then release each unit whose records are all consumed — one release per unit. A unit some of whose
// records must wait (ahead of a missing packet; a sink failure) stays unreleased, and the records of it already
// consumed are remembered so the next pass skips them.
//
// Back-pressure per device: a sink that answers kBusy for a message of device D (its worker is
// behind) pauses D alone — D's records stay where they are, every other device goes on, D is
// tried again every kBusyRetry, and `on_pause` tells the session (which tells the sender to stop
// filling D). A paused device's records that share a packed unit with other devices' are copied
// aside (up to the park limit) so that the unit can be released: otherwise one slow device would
// hold every block. Any other sink error stops the whole pass as before (a full disk concerns
// every device).
//
// Threading: one consumer thread per connected sender.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/stream/lending.h"
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
  uint64_t units = 0;         // units released (blocks, ring records: several records when packed)
  uint64_t parked = 0;        // records of a paused device copied out of a shared unit
  uint64_t lend_limited = 0;  // passes that stopped lending at the held-blocks limit (zero-copy)
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
  // `block_size`: the geometry's (a unit holds at most block_size / 16 records); 0 for a protocol
  // whose records are never packed (tests).
  Delivery(protocol::ReceiverProtocol& proto, MessageSink& sink, const std::vector<uint16_t>& devices,
           uint32_t block_size = 0);

  static constexpr std::chrono::milliseconds kBusyRetry{100};
  // Called when a device is paused (true) or resumes (false).
  void set_pause_handler(std::function<void(uint16_t device, bool paused)> fn) { on_pause_ = std::move(fn); }
  // Most bytes of paused devices' records copied out of shared units at once (default 16 MiB);
  // beyond it they wait in their units.
  void set_park_limit(uint64_t bytes) { park_limit_ = bytes; }
  // Zero-copy receive (engine/ucx/stream/lending.h): whole messages are lent in place through `sink` (the
  // sink given to the constructor) under leases from `lending`; a unit with lent messages is
  // retained (not released) once all its records are consumed. At the lending limit the rest of
  // a batch waits in its units.
  void set_lending(std::shared_ptr<Lending> lending, LendingSink* sink) {
    lending_ = std::move(lending);
    lender_ = sink;
  }
  // Whether the last pass stopped lending at the limit (the application holds max_held blocks).
  bool lend_limited() const { return lend_limited_; }

  // One pass over the units complete now. `*consumed` = records consumed (delivered or dropped).
  // A sink error is returned as is; the record stays unreleased (back-pressure) and the next pass
  // retries it exactly where it failed.
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
  // Whether any pass has found a record yet (the sender's first data; --hold-block counts from it).
  bool seen_data() const { return seen_data_; }

  // Packets further ahead than this are not believed (a corrupt or hostile header): four times
  // what the protocol can have unreleased at once (`per_unit` records in each of its units), at
  // most 2^30 (packet distances are 32-bit).
  static uint64_t window(uint64_t max_records, uint64_t per_unit = 1);

 private:
  static constexpr uint32_t kParked = 0xFFFFFFFFu;  // Entry::unit of a record copied aside

  struct Parked {
    wire::BlockHeader header;
    std::vector<std::byte> payload;
    bool taken = false;
  };
  struct DeviceState {
    uint16_t id = 0;
    uint32_t expected = 0;
    bool open = false;
    uint64_t open_bytes = 0;
    uint32_t stuck_passes = 0;
    std::chrono::steady_clock::time_point retry_at{};  // while paused: when to try its sink again
    // When the pass that first tried to begin the open message began (store latency).
    std::optional<std::chrono::steady_clock::time_point> taken_up;
    DeviceStats counters;
    std::vector<Parked> parked;  // records copied out of shared units while paused
    // Within one pass (reset at its end; no per-pass allocation): a packet was delivered, and the
    // distance of the nearest packet waiting behind a missing one (-1: none).
    bool pass_progressed = false;
    int64_t pass_waiting = -1;
  };
  // One record of this pass: in unit `unit` (this pass's units_) with consumed-flag `mark`, or
  // (unit == kParked) parked record `mark` of its device.
  struct Entry {
    wire::BlockHeader header;
    std::span<const std::byte> payload;
    uint32_t dev = 0;  // index into devices_
    uint32_t unit = 0;
    uint32_t mark = 0;
    uint32_t index = 0;  // position in its unit (for a record that must be remembered)
  };
  struct UnitState {
    protocol::Record record;
    uint32_t first_mark = 0;  // its records' consumed flags are marks_[first_mark, +records)
    uint32_t records = 0;
    uint32_t left = 0;                  // not consumed yet
    std::shared_ptr<BlockLease> lease;  // zero-copy: some of its messages are lent
  };
  // Records of a unit consumed in earlier passes while others of it had to wait.
  struct Partial {
    uint64_t id = 0;
    std::vector<uint8_t> consumed;  // by record position
    bool has(uint32_t i) const { return i < consumed.size() && consumed[i]; }
  };
  enum class Stage { kBegin, kAppend, kCommit };
  struct Pending {
    Entry entry;
    uint64_t unit_id = 0;  // the unit it lies in (unless parked)
    Stage stage;
  };

  int32_t find_device(uint16_t id) const;
  Status retry_pending(size_t* consumed);
  void collect(std::chrono::steady_clock::time_point now, size_t* consumed);
  void collect_parked();
  void collect_unit(const protocol::Record& rec, size_t* consumed);
  Status order(std::chrono::steady_clock::time_point now, size_t* consumed);
  Status consider(uint32_t i, std::chrono::steady_clock::time_point now, bool defer, size_t* consumed);
  Status deliver_piece(const Entry& e, std::chrono::steady_clock::time_point now, size_t* consumed);
  Status flush(std::chrono::steady_clock::time_point now, size_t* consumed);
  void pause(DeviceState& dev, std::chrono::steady_clock::time_point now);
  void resumed(DeviceState& dev);
  void roll_back(size_t from);
  void park_paused();
  void release_units();
  void release_unit(UnitState& u);
  size_t gather_leases(size_t pos);
  std::shared_ptr<BlockLease> unit_lease(uint32_t unit);
  void compact_parked();
  void remember(uint64_t unit_id, uint32_t index);
  void detect_gaps();
  void consume(const Entry& e, size_t* consumed);
  void delivered(DeviceState& dev, uint64_t bytes, uint32_t packet, std::chrono::steady_clock::time_point stored_at);
  void counted(DeviceState& dev, uint64_t bytes, uint32_t packet);
  bool is_consumed(const Entry& e) const;
  // Applies one in-order fragment from `stage` on; on error records where to resume.
  Status apply(const Entry& e, Stage stage, uint64_t unit_id);

  protocol::ReceiverProtocol& proto_;
  MessageSink& sink_;
  std::vector<DeviceState> devices_;
  std::vector<int32_t> device_table_;  // device id -> index when ids are small, else empty
  uint64_t window_ = 0;
  DeliveryCounters counters_;
  std::optional<Pending> pending_;
  std::map<uint32_t, bool> blocked_;
  std::function<void(uint16_t, bool)> on_pause_;
  uint64_t park_limit_ = 16u << 20;
  uint64_t parked_bytes_ = 0;
  // Scratch, reused across passes (no per-pass allocation once warm).
  std::vector<protocol::Record> records_;
  std::vector<UnitState> units_;
  std::vector<uint8_t> marks_;
  std::vector<Entry> entries_;
  std::vector<uint32_t> deferred_;  // entries_ that came ahead of their predecessor
  std::vector<uint32_t> batch_;     // entries_ of whole messages for the next sink_.deliver
  std::vector<Message> messages_;
  std::vector<Partial> partial_;
  // Zero-copy receive: units with lent messages not all consumed yet, across passes. Only their
  // views hold their leases (what Lending counts against the held limit is what views hold).
  struct LentUnit {
    uint64_t id = 0;
    std::weak_ptr<BlockLease> lease;
  };
  std::shared_ptr<Lending> lending_;
  LendingSink* lender_ = nullptr;
  std::vector<LentUnit> lent_units_;
  std::vector<std::shared_ptr<BlockLease>> leases_;  // scratch: one per message of a lent batch
  bool lend_limited_ = false;
  bool seen_data_ = false;         // seen_data()
  bool pass_interrupted_ = false;  // a pass returned early: the devices' pass_* marks are stale
  bool traced_ = false;            // this pass records the per-stage trace (engine/ucx/stream/trace.h)
  // What the last pass found held (buffer utilisation is integrated from one pass to the next).
  std::optional<std::chrono::steady_clock::time_point> last_pass_;
  std::chrono::steady_clock::time_point pass_now_{};  // when the current pass began
  uint64_t last_held_ = 0;
  uint64_t last_useful_ = 0;
  uint64_t pass_held_ = 0;
  uint64_t pass_useful_ = 0;
};

}  // namespace slotstream::stream
