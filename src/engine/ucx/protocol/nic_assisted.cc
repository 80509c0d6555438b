#include "engine/ucx/protocol/nic_assisted.h"

#include <algorithm>
#include <cstring>

namespace slotstream::protocol {

// --------------------------------------------------------------------------- NicAssistedCore

NicAssistedCore::NicAssistedCore(RingWire& wire, uint64_t ring_bytes, uint64_t window, std::span<std::byte> queue,
                                 uint32_t slot_size, std::span<std::byte> buffer)
    : wire_(wire),
      space_(ring_bytes),
      window_(window),
      initial_(ring_bytes / window),
      queue_memory_(queue),
      slot_size_(slot_size),
      slots_(static_cast<uint32_t>(queue.size() / slot_size)),
      slot_puts_(slots_),
      buffer_(buffer) {}

Status NicAssistedCore::transmit(const std::byte* src, uint32_t length, fabric::Request* req, Outcome* out) {
  // Nothing waits before this record and a credit is there: it leaves now (a posted send whose
  // receive is already posted).
  if (queue_.empty() && buffer_.empty() && credits() > 0) {
    if (const uint64_t padding = space_.padding_for(length); padding != 0) SLOTSTREAM_RETURN_IF_ERROR(pad(padding));
    if (credits() > 0) {
      SLOTSTREAM_RETURN_IF_ERROR(write_segment(src, length, req));
      ++counters_.direct_writes;
      *out = Outcome::kWritten;
      return Status::ok();
    }
  }
  // SDP §4.2: the NIC-handled part first (a posted send, one segment per record)...
  if (buffer_.empty() && queue_.size() < slots_) {
    const uint32_t slot = (head_slot_ + static_cast<uint32_t>(queue_.size())) % slots_;
    // The slot's previous put may still be running (tcp): then this record coalesces instead.
    if (slot_puts_[slot].check().code() != Code::kInProgress) {
      std::memcpy(queue_memory_.data() + size_t(slot) * slot_size_, src, length);
      queue_.push_back({slot, length});
      ++counters_.queued_records;
      *out = Outcome::kQueued;
      return Status::ok();
    }
  }
  // ...then the software-handled part, where records wait to coalesce with later ones.
  bool added = false;
  SLOTSTREAM_RETURN_IF_ERROR(buffer_.add(src, length, &added));
  counters_.coalesced_records += added;
  *out = added ? Outcome::kCoalesced : Outcome::kFull;
  return Status::ok();
}

Status NicAssistedCore::drain(uint64_t* writes) {
  uint64_t n = 0;
  while (credits() > 0 && !queue_.empty()) {
    const Queued q = queue_.front();
    if (const uint64_t padding = space_.padding_for(q.length); padding != 0) {
      SLOTSTREAM_RETURN_IF_ERROR(pad(padding));
      continue;  // the wrap marker took a credit
    }
    SLOTSTREAM_RETURN_IF_ERROR(
        write_segment(queue_memory_.data() + size_t(q.slot) * slot_size_, q.length, &slot_puts_[q.slot]));
    queue_.pop_front();
    head_slot_ = (head_slot_ + 1) % slots_;
    ++n;
  }
  // SDP §4.2: the interrupt "flushes out the data in the software-handled buffer as well", here in
  // segments of at most W (each is one posted receive at the other end).
  while (credits() > 0 && queue_.empty() && !buffer_.empty()) {
    if (const uint64_t padding = space_.padding_for(buffer_.front_length()); padding != 0) {
      SLOTSTREAM_RETURN_IF_ERROR(pad(padding));
      continue;
    }
    uint64_t bytes = 0;
    SLOTSTREAM_RETURN_IF_ERROR(buffer_.write_run(wire_, space_, window_, &bytes, &counters_));
    if (bytes == 0) break;  // cannot happen: a record is at most one block <= W and fits before the end
    ++used_;                // the segment's credit
    ++counters_.credits_used;
    ++n;
  }
  if (writes) *writes = n;
  return Status::ok();
}

bool NicAssistedCore::on_grant(uint64_t granted) {
  // The receiver never promises more than the ring holds: credits() <= R / W, i.e. granted <= used.
  if (granted <= granted_ || granted > used_) return false;
  granted_ = granted;
  return true;
}

Status NicAssistedCore::write_segment(const std::byte* src, uint64_t length, fabric::Request* req) {
  ++used_;
  ++counters_.credits_used;
  return wire_.write(src, static_cast<uint32_t>(length), space_.take(length), req);
}

Status NicAssistedCore::pad(uint64_t length) {
  // A wrap marker consumes a credit like a segment (it is shorter than W: it pads less than the
  // segment that did not fit), so the receiver's promise of W bytes per credit holds across the end.
  ++used_;
  ++counters_.credits_used;
  ++counters_.wrap_markers;
  return wire_.pad(space_.take(length), static_cast<uint32_t>(length));
}

// ------------------------------------------------------------------------------ over UCX
namespace {

// How long the sending thread sleeps on the wake-up fd at most before it looks at its liveness
// check and at new records again (Worker::wait_for_event rounds to whole milliseconds).
constexpr auto kInterruptWait = std::chrono::microseconds(1000);

struct NicOptions {
  uint64_t window = 0;  // 0: the block size
  uint64_t queue = 0;   // 0: R / W
  uint64_t buffer = 0;  // 0: the ring's size
};

Status read_options(const Options& o, NicOptions* out) {
  SLOTSTREAM_RETURN_IF_ERROR(o.check_known("nic_assisted", {"window", "queue", "buffer"}));
  SLOTSTREAM_RETURN_IF_ERROR(o.size("window", 0, &out->window));
  SLOTSTREAM_RETURN_IF_ERROR(o.number("queue", 0, &out->queue));
  return o.size("buffer", 0, &out->buffer);
}

Status check_options(const Options& o) {
  NicOptions parsed;
  return read_options(o, &parsed);
}

// W for this geometry, or why not.
Status window_for(const NicOptions& o, const Geometry& g, uint64_t* window) {
  *window = o.window ? o.window : g.block_size;
  if (*window < g.block_size || *window > g.bytes() || *window > kMaxSegment) {
    return {Code::kInvalidArgument, "nic_assisted: window=" + std::to_string(*window) +
                                        " must be at least one block (" + std::to_string(g.block_size) +
                                        " B: a record is never split) and at most "
                                        "the ring (" +
                                        std::to_string(g.bytes()) + " B)"};
  }
  return Status::ok();
}

class NicAssistedSender final : public RingSender {
 public:
  explicit NicAssistedSender(SenderFabric& fabric) : RingSender(fabric) {}

  Status init(const RingSetup& setup, uint64_t window, uint64_t slots, uint64_t buffer_bytes) {
    SLOTSTREAM_RETURN_IF_ERROR(connect(setup));
    const uint32_t slot_size = fabric_.geometry.block_size;
    if (Status st = link_->allocate(slots * slot_size, &queue_); !st.is_ok()) {
      return {st.code(), "nic_assisted: the send queue (queue=" + std::to_string(slots) + " blocks): " + st.message()};
    }
    if (Status st = link_->allocate(buffer_bytes, &buffer_); !st.is_ok()) {
      return {st.code(),
              "nic_assisted: the coalescing buffer (buffer=" + std::to_string(buffer_bytes) + "): " + st.message()};
    }
    core_ = std::make_unique<NicAssistedCore>(*link_, setup.bytes, window, std::span(queue_->data(), slots * slot_size),
                                              slot_size, std::span(buffer_->data(), buffer_bytes));
    return Status::ok();
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    ++stats_.records;
    // The NIC sends queued segments whenever credits arrive; between interrupts the sending
    // thread does the same on every call.
    if (core_->holding() || core_->credits() == 0) {
      fabric_.worker.progress();
      SLOTSTREAM_RETURN_IF_ERROR(drain_st(false));
    }
    NicAssistedCore::Outcome outcome;
    SLOTSTREAM_RETURN_IF_ERROR(core_->transmit(src, static_cast<uint32_t>(length), data_req, &outcome));
    if (outcome != NicAssistedCore::Outcome::kFull) return Status::ok();
    // Queue and buffer are full: wait for the receiver, asleep until a credit interrupts.
    WaitTimer wait(stats_);
    for (;;) {
      SLOTSTREAM_RETURN_IF_ERROR(interrupt_wait_st());
      SLOTSTREAM_RETURN_IF_ERROR(drain_st(true));
      SLOTSTREAM_RETURN_IF_ERROR(core_->transmit(src, static_cast<uint32_t>(length), data_req, &outcome));
      if (outcome != NicAssistedCore::Outcome::kFull) return Status::ok();
      SLOTSTREAM_RETURN_IF_ERROR(check_alive());
    }
  }

  // SDP §4.2: while data waits for credits, the sending thread sleeps on the wake-up fd; the
  // credit's arrival wakes it and it flushes — whatever the application is doing meanwhile.
  Status idle_st() override {
    link_->reap();
    if (!core_->holding()) return Status::ok();
    fabric_.worker.progress();
    SLOTSTREAM_RETURN_IF_ERROR(drain_st(false, true));
    if (!core_->holding()) return Status::ok();
    SLOTSTREAM_RETURN_IF_ERROR(interrupt_wait_st());
    return drain_st(true, true);
  }

  bool holding_st() const override { return core_->holding(); }

  Status finish_st() override {
    if (core_->holding()) {
      WaitTimer wait(stats_);
      while (core_->holding()) {
        fabric_.worker.progress();
        SLOTSTREAM_RETURN_IF_ERROR(drain_st(false));
        if (!core_->holding()) break;
        SLOTSTREAM_RETURN_IF_ERROR(check_alive());
        SLOTSTREAM_RETURN_IF_ERROR(interrupt_wait_st());
      }
    }
    return fabric_.endpoint.flush(fabric_.alive);
  }

  // sync_ops: ACKs that granted credits. Counters: RingSender::ring_stats (coalesced_*: the
  // software-handled buffer), queued_records, credits_used, interrupt_sleeps (sleeps on the
  // wake-up fd), interrupts (those that ended with a credit), interrupt_writes (segments written
  // right after one).
  ProtocolStats stats() const override {
    const auto& c = core_->counters();
    ProtocolStats s = ring_stats(c);
    s.counters["queued_records"] = c.queued_records;
    s.counters["credits_used"] = c.credits_used;
    s.counters["interrupt_sleeps"] = sleeps_;
    s.counters["interrupts"] = interrupts_;
    s.counters["interrupt_writes"] = interrupt_writes_;
    return s;
  }

 private:
  bool apply_ack(const RingAck& ack) override { return core_ && core_->on_grant(ack.credits); }

  // Unless a credit is there, sleeps on the wake-up fd (the interrupt) — wait_for_event progresses
  // first and returns at once if that found work (an ACK handled) — then handles what woke it.
  // Checks liveness: every wait for the receiver passes here.
  Status interrupt_wait_st() {
    if (core_->credits() > 0) return Status::ok();
    ++sleeps_;
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.worker.wait_for_event(kInterruptWait));
    while (fabric_.worker.progress() != 0) {
    }
    if (core_->credits() > 0) ++interrupts_;
    return check_alive();
  }

  Status drain_st(bool after_interrupt, bool idle = false) {
    uint64_t writes = 0;
    SLOTSTREAM_RETURN_IF_ERROR(core_->drain(&writes));
    if (after_interrupt) interrupt_writes_ += writes;
    if (idle) idle_writes_ += writes;
    return Status::ok();
  }

  std::unique_ptr<fabric::MemoryRegion> queue_;
  std::unique_ptr<fabric::MemoryRegion> buffer_;
  std::unique_ptr<NicAssistedCore> core_;
  uint64_t sleeps_ = 0, interrupts_ = 0, interrupt_writes_ = 0;
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options& options,
                   std::unique_ptr<SenderProtocol>* out) {
  NicOptions o;
  SLOTSTREAM_RETURN_IF_ERROR(read_options(options, &o));
  uint64_t window = 0;
  SLOTSTREAM_RETURN_IF_ERROR(window_for(o, fabric.geometry, &window));
  RingSetup ring;
  SLOTSTREAM_RETURN_IF_ERROR(parse_ring_setup(setup, &ring));
  if (ring.bytes != fabric.geometry.bytes() || ring.window != window) {
    return {Code::kProtocolError,
            "the receiver's ring or virtual window does not match this sender's nic_assisted "
            "options"};
  }
  const uint64_t slots = o.queue ? o.queue : ring.bytes / window;
  if (slots > 65536) return {Code::kInvalidArgument, "nic_assisted: queue=" + std::to_string(slots) + " is over 65536"};
  uint64_t buffer = 0;
  SLOTSTREAM_RETURN_IF_ERROR(sender_buffer_size("nic_assisted", o.buffer, fabric.geometry, &buffer));
  auto sender = std::make_unique<NicAssistedSender>(fabric);
  SLOTSTREAM_RETURN_IF_ERROR(sender->init(ring, window, slots, buffer));
  *out = std::move(sender);
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options& options, std::unique_ptr<ReceiverProtocol>* out) {
  NicOptions o;
  SLOTSTREAM_RETURN_IF_ERROR(read_options(options, &o));
  uint64_t window = 0;
  SLOTSTREAM_RETURN_IF_ERROR(window_for(o, fabric.geometry, &window));
  return make_ring_receiver(fabric, window, out);
}

}  // namespace

const Descriptor kNicAssisted = {
    .name = "nic_assisted",
    .summary =
        "SDP §4 NIC-assisted flow control: the packed ring with one credit per virtual window W of free "
        "space, segments of at most W, a send queue that leaves on each credit and coalescing beyond it, "
        "the sending thread woken by the credit (worker wake-up fd) to flush",
    .options_help =
        "window=SIZE: virtual window W (default the block size; one block .. the ring); "
        "queue=N: segments the send queue holds (default ring / W); "
        "buffer=SIZE: coalescing buffer (default blocks x block size)",
    .receiver_progress = true,
    .holds = false,
    .sender_wakeup = true,
    .check_options = check_options,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
