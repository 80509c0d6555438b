#include "engine/ucx/protocol/packed_ring.h"

#include <algorithm>
#include <cstring>

namespace slotstream::protocol {

// ---------------------------------------------------------------------------- PackedRingCore

Status PackedRingCore::transmit(const std::byte* src, uint32_t length, fabric::Request* req, Outcome* out) {
  // paper §3.1: while the ring has room — and nothing coalesced waits before this record — the
  // record leaves before transmit returns, at the next free byte.
  if (buffer_.empty()) {
    uint64_t padding = space_.padding_for(length);
    if (padding != 0 && space_.free() >= padding) {
      // The wrap marker goes now even if the record must wait: it frees itself as soon as the
      // records before it are released.
      SLOTSTREAM_RETURN_IF_ERROR(pad(padding));
      padding = 0;
    }
    if (padding == 0 && space_.free() >= length) {
      SLOTSTREAM_RETURN_IF_ERROR(wire_.write(src, length, space_.take(length), req));
      ++counters_.direct_writes;
      *out = Outcome::kWritten;
      return Status::ok();
    }
  }
  // paper §3.1: no room in the ring: copy into the sender buffer and return to the application.
  bool added = false;
  SLOTSTREAM_RETURN_IF_ERROR(buffer_.add(src, length, &added));
  counters_.coalesced_records += added;
  *out = added ? Outcome::kCoalesced : Outcome::kFull;
  return Status::ok();
}

Status PackedRingCore::flush(uint64_t* writes) {
  uint64_t n = 0;
  while (!buffer_.empty()) {
    const uint64_t padding = space_.padding_for(buffer_.front_length());
    if (padding != 0) {
      if (space_.free() < padding) break;
      SLOTSTREAM_RETURN_IF_ERROR(pad(padding));
      continue;
    }
    // paper §3.1: "this data is sent as one large message instead of multiple small messages".
    uint64_t bytes = 0;
    SLOTSTREAM_RETURN_IF_ERROR(buffer_.write_run(wire_, space_, space_.free(), &bytes, &counters_));
    if (bytes == 0) break;
    ++n;
  }
  if (writes) *writes = n;
  return Status::ok();
}

Status PackedRingCore::pad(uint64_t length) {
  SLOTSTREAM_RETURN_IF_ERROR(wire_.pad(space_.take(length), static_cast<uint32_t>(length)));
  ++counters_.wrap_markers;
  return Status::ok();
}

// ------------------------------------------------------------------------------ over UCX
namespace {

enum class Flush { kOnCall, kAlsoIdle };

struct PackedRingOptions {
  Flush flush = Flush::kOnCall;
  uint64_t buffer = 0;  // 0: the ring's size
};

Status read_options(const Options& o, PackedRingOptions* out) {
  SLOTSTREAM_RETURN_IF_ERROR(o.check_known("packed_ring", {"flush", "buffer"}));
  std::string flush;
  SLOTSTREAM_RETURN_IF_ERROR(o.choice("flush", {"call", "idle"}, "call", &flush));
  out->flush = flush == "idle" ? Flush::kAlsoIdle : Flush::kOnCall;
  return o.size("buffer", 0, &out->buffer);
}

Status check_options(const Options& o) {
  PackedRingOptions parsed;
  return read_options(o, &parsed);
}

class PackedRingSender final : public RingSender {
 public:
  PackedRingSender(SenderFabric& fabric, Flush flush) : RingSender(fabric), flush_(flush) {}

  Status init(const RingSetup& setup, uint64_t buffer_bytes) {
    SLOTSTREAM_RETURN_IF_ERROR(connect(setup));
    if (Status st = link_->allocate(buffer_bytes, &buffer_); !st.is_ok()) {
      return {st.code(),
              "packed_ring: the sender buffer (buffer=" + std::to_string(buffer_bytes) + "): " + st.message()};
    }
    core_ = std::make_unique<PackedRingCore>(*link_, setup.bytes, std::span(buffer_->data(), buffer_bytes));
    return Status::ok();
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    ++stats_.records;
    // paper §3.2: this call is when the sender learns about freed space — ACKs are picked up and
    // coalesced data leaves (before this record, which must follow it).
    if (core_->holding()) {
      fabric_.worker.progress();
      SLOTSTREAM_RETURN_IF_ERROR(flush_st(false));
    } else if (core_->space().free() < length + core_->space().padding_for(length)) {
      fabric_.worker.progress();  // "no space" is decided on the latest ACKs
    }
    PackedRingCore::Outcome outcome;
    SLOTSTREAM_RETURN_IF_ERROR(core_->transmit(src, static_cast<uint32_t>(length), data_req, &outcome));
    if (outcome != PackedRingCore::Outcome::kFull) return Status::ok();
    // Ring and sender buffer are both full: now the sender does wait for the receiver.
    WaitTimer wait(stats_);
    for (PollBackoff backoff;; backoff.pause()) {
      if (fabric_.worker.progress() != 0) backoff.reset();
      SLOTSTREAM_RETURN_IF_ERROR(flush_st(false));
      SLOTSTREAM_RETURN_IF_ERROR(core_->transmit(src, static_cast<uint32_t>(length), data_req, &outcome));
      if (outcome != PackedRingCore::Outcome::kFull) return Status::ok();
      SLOTSTREAM_RETURN_IF_ERROR(check_alive());
    }
  }

  // flush=call (the paper): nothing — coalesced data waits for the next transmit_st. The sending
  // loop still progresses the worker while idle, so ACKs are seen; only the data does not move.
  // flush=idle: the fix, a progress engine that flushes whenever there is room.
  Status idle_st() override {
    link_->reap();
    if (flush_ != Flush::kAlsoIdle || !core_->holding()) return Status::ok();
    fabric_.worker.progress();
    return flush_st(true);
  }

  bool holding_st() const override { return flush_ == Flush::kAlsoIdle && core_->holding(); }

  Status finish_st() override {
    if (core_->holding()) {
      WaitTimer wait(stats_);
      for (PollBackoff backoff; core_->holding(); backoff.pause()) {
        if (fabric_.worker.progress() != 0) backoff.reset();
        SLOTSTREAM_RETURN_IF_ERROR(flush_st(false));
        SLOTSTREAM_RETURN_IF_ERROR(check_alive());
      }
    }
    return fabric_.endpoint.flush(fabric_.alive);
  }

  // sync_ops: ACKs that moved the head. Counters: RingSender::ring_stats.
  ProtocolStats stats() const override { return ring_stats(core_->counters()); }

 private:
  bool apply_ack(const RingAck& ack) override { return core_ && core_->on_ack(ack.freed); }

  Status flush_st(bool from_idle) {
    uint64_t writes = 0;
    SLOTSTREAM_RETURN_IF_ERROR(core_->flush(&writes));
    if (from_idle) idle_writes_ += writes;
    return Status::ok();
  }

  Flush flush_;
  std::unique_ptr<fabric::MemoryRegion> buffer_;
  std::unique_ptr<PackedRingCore> core_;
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options& options,
                   std::unique_ptr<SenderProtocol>* out) {
  PackedRingOptions o;
  SLOTSTREAM_RETURN_IF_ERROR(read_options(options, &o));
  RingSetup ring;
  SLOTSTREAM_RETURN_IF_ERROR(parse_ring_setup(setup, &ring));
  if (ring.bytes != fabric.geometry.bytes() || ring.window != 0) {
    return {Code::kProtocolError, "the receiver's ring does not match this sender's packed_ring geometry"};
  }
  uint64_t buffer = 0;
  SLOTSTREAM_RETURN_IF_ERROR(sender_buffer_size("packed_ring", o.buffer, fabric.geometry, &buffer));
  auto sender = std::make_unique<PackedRingSender>(fabric, o.flush);
  SLOTSTREAM_RETURN_IF_ERROR(sender->init(ring, buffer));
  *out = std::move(sender);
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options&, std::unique_ptr<ReceiverProtocol>* out) {
  return make_ring_receiver(fabric, /*window=*/0, out);
}

}  // namespace

const Descriptor kPackedRing = {
    .name = "packed_ring",
    .summary =
        "SDP §3 RDMA-based flow control: records packed back to back into one N x S receive ring the "
        "sender manages, coalesced into a sender buffer while the ring is full, ACKs return freed bytes",
    .options_help =
        "flush=call|idle: coalesced data leaves on the next transmit only (call: the paper's "
        "behaviour, default) or also while the sending thread is idle (idle: the fix); "
        "buffer=SIZE: sender buffer (default blocks x block size)",
    // Notices are two-sided (emulated write-with-immediate): the receiver progresses its worker.
    .receiver_progress = true,
    // No per-block status: a ring frees in order, so a hold is the receiver not releasing a record.
    .holds = false,
    .check_options = check_options,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
