#include "protocol/status_byte.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

// The value written into a receiver status byte after a block's data. Static so the source of
// the put outlives any transport that completes it later (tcp).
const uint8_t kFullByte = kFull;

size_t status_offset(const Geometry& g) { return size_t(g.blocks) * g.block_size; }

class StatusByteSender final : public SenderProtocol {
 public:
  StatusByteSender(SenderFabric& fabric, uint64_t blocks_addr, uint64_t status_addr,
                   std::unique_ptr<fabric::RemoteKey> rkey)
      : fabric_(fabric),
        blocks_addr_(blocks_addr),
        status_addr_(status_addr),
        rkey_(std::move(rkey)),
        cache_(fabric.geometry.blocks) {}

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    SLOTSTREAM_RETURN_IF_ERROR(wait_space_st());
    const int64_t j = cache_.pick(&stats_.held_skips);
    const auto& g = fabric_.geometry;
    // paper §3.2.2: two writes — the data (no completion of its own), then, behind a fence, the
    // status byte: the fence is what lets the receiver trust a status byte of 1.
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.put_flagged(src, length, blocks_addr_ + uint64_t(j) * g.block_size,
                                                            &kFullByte, 1, status_addr_ + j, *rkey_, data_req));
    cache_.mark_full(static_cast<uint32_t>(j));
    ++stats_.records;
    return Status::ok();
  }

  // paper §3.2.6: no free block in the cache. The sender is blocked from here until a block is
  // free: status reads, their fences and back-off all count as this one wait.
  Status wait_space_st() override {
    if (cache_.pick(nullptr) >= 0) return Status::ok();
    WaitTimer wait(stats_);
    for (PollBackoff backoff;; backoff.pause()) {
      SLOTSTREAM_RETURN_IF_ERROR(synchronise_st());
      if (cache_.pick(nullptr) >= 0) return Status::ok();
    }
  }

  // One status read when the cache has no free block: a filler that finds none leaves the wait
  // to the sending thread (which times it from there on).
  Status space_st(bool* ready) override {
    *ready = cache_.pick(nullptr) >= 0;
    if (*ready) return Status::ok();
    WaitTimer wait(stats_);
    SLOTSTREAM_RETURN_IF_ERROR(synchronise_st());
    *ready = cache_.pick(nullptr) >= 0;
    if (!*ready) wait.dismiss();
    return Status::ok();
  }

  Status finish_st() override { return fabric_.endpoint.flush(fabric_.alive); }

  // sync_op_samples_ns: one status-array read each, from issuing the get to its completion.
  ProtocolStats stats() const override { return stats_; }
  uint64_t held_skips_st() const override { return stats_.held_skips; }

 private:
  // paper §3.2.6: read all status bytes at once (one RDMA get, blocking).
  Status synchronise_st() {
    ++stats_.sync_ops;
    // Ordered after our own earlier status puts, so the read cannot see them as still empty.
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.worker.fence());
    auto raw = cache_.raw();
    const auto t0 = std::chrono::steady_clock::now();
    fabric::Request req;
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.get(raw.data(), raw.size(), status_addr_, *rkey_, &req));
    SLOTSTREAM_RETURN_IF_ERROR(req.wait(fabric_.worker, fabric_.alive));
    add_sample(stats_.sync_op_samples_ns,
               std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
    return fabric_.alive ? fabric_.alive() : Status::ok();
  }

  SenderFabric& fabric_;
  uint64_t blocks_addr_;
  uint64_t status_addr_;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  StatusCache cache_;
  ProtocolStats stats_;
};

class StatusByteReceiver final : public ReceiverProtocol {
 public:
  StatusByteReceiver(ReceiverFabric& fabric, std::unique_ptr<fabric::MemoryRegion> region, std::vector<uint8_t> rkey)
      : geometry_(fabric.geometry),
        region_(std::move(region)),
        rkey_(std::move(rkey)),
        hold_wanted_(geometry_.blocks, false) {}

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(region_->remote_address());
    w.u64(region_->remote_address() + status_offset(geometry_));
    w.blob32(rkey_);
    return std::move(w.buffer());
  }

  void poll(std::vector<Record>* out) override {
    // From the block after the last one found full: the sender fills blocks round robin, so this
    // is the order it sent them in (mostly), and the stream layer seldom has to sort.
    const uint32_t n = geometry_.blocks;
    uint32_t last = n;
    for (uint32_t k = 0; k < n; ++k) {
      const uint32_t i = (scan_from_ + k) % n;
      // Acquire: the block's data (written before the status byte, behind a fence) is visible.
      if (status(i).load(std::memory_order_acquire) == kFull) {
        out->push_back({i, i, {region_->data() + size_t(i) * geometry_.block_size, geometry_.block_size}});
        last = i;
      }
    }
    if (last != n) scan_from_ = (last + 1) % n;
  }

  void release(uint64_t id) override {
    const auto index = static_cast<uint32_t>(id);
    // paper §3.2.5 step 3; §3.3: a block wanted held goes straight to 2.
    status(index).store(hold_wanted_[index] ? kHeld : kEmpty, std::memory_order_release);
  }

  void set_hold(uint32_t index, bool held) override {
    hold_wanted_[index] = held;
    // Compare-and-swap: the sender may be writing 1 into this very byte right now. If it wins,
    // the block is full and the hold applies when it is released.
    uint8_t expected = held ? kEmpty : kHeld;
    status(index).compare_exchange_strong(expected, held ? kHeld : kEmpty, std::memory_order_acq_rel);
  }

  uint64_t max_records() const override { return geometry_.blocks; }

 private:
  std::atomic_ref<uint8_t> status(uint32_t i) const {
    auto* base = reinterpret_cast<uint8_t*>(region_->data() + status_offset(geometry_));
    return std::atomic_ref<uint8_t>(base[i]);
  }

  Geometry geometry_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::vector<uint8_t> rkey_;
  std::vector<bool> hold_wanted_;
  uint32_t scan_from_ = 0;
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options&,
                   std::unique_ptr<SenderProtocol>* out) {
  wire::Reader r(setup);
  uint64_t blocks_addr = r.u64();
  uint64_t status_addr = r.u64();
  std::vector<uint8_t> packed = r.blob32(setup.size());
  if (!r.ok() || !r.at_end()) return {Code::kProtocolError, "malformed status_byte set-up from receiver"};
  std::unique_ptr<fabric::RemoteKey> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::RemoteKey::unpack(fabric.endpoint, packed, &rkey));
  out->reset(new StatusByteSender(fabric, blocks_addr, status_addr, std::move(rkey)));
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options&, std::unique_ptr<ReceiverProtocol>* out) {
  const Geometry& g = fabric.geometry;
  std::unique_ptr<fabric::MemoryRegion> region;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate(fabric.context, status_offset(g) + g.blocks, &region));
  std::vector<uint8_t> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(region->pack_rkey(&rkey));
  out->reset(new StatusByteReceiver(fabric, std::move(region), std::move(rkey)));
  return Status::ok();
}

}  // namespace

int64_t StatusCache::pick(uint64_t* held_skips) {
  const uint32_t n = size();
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t i = (cursor_ + k) % n;
    if (status_[i] == kEmpty) return i;
    if (status_[i] == kHeld && held_skips) ++*held_skips;
  }
  return -1;
}

const Descriptor kStatusByte = {
    .name = "status_byte",
    .summary =
        "paper §3: receiver exposes N blocks + N status bytes and stays passive; the sender "
        "writes data, fence, status byte, and reads the status array only when out of free blocks",
    .holds = true,
    .packs = true,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
