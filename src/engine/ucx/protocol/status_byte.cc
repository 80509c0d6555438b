#include "engine/ucx/protocol/status_byte.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
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
                   std::unique_ptr<fabric::RemoteKey> rkey, Pick pick)
      : fabric_(fabric),
        blocks_addr_(blocks_addr),
        status_addr_(status_addr),
        rkey_(std::move(rkey)),
        cache_(fabric.geometry.blocks, pick) {}

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
    bool counted = false;
    // Between reads that find nothing free: spin where a read is a local load (shm, rdma), sleep
    // about a read's time where it is a round trip through the receiver's thread (tcp).
    for (PollBackoff backoff;; backoff.pause(fabric_.worker, fabric_.worker.typical_completion())) {
      SLOTSTREAM_RETURN_IF_ERROR(synchronise_st());
      if (cache_.pick(nullptr) >= 0) return Status::ok();
      count_paper_wait(&counted);
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
    bool counted = false;
    if (!*ready) count_paper_wait(&counted);
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

  // counters["paper_full_waits"]: waits in which policy=paper read the status array and still found
  // its next block full while a later one was empty — the waits policy=any would not have made.
  // Counted once per wait (`*counted`: this wait was).
  void count_paper_wait(bool* counted) {
    if (cache_.policy() != Pick::kPaper || *counted || !cache_.any_empty()) return;
    *counted = true;
    ++stats_.counters["paper_full_waits"];
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
        hold_wanted_(geometry_.blocks, 0),
        retained_(geometry_.blocks, 0) {}

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

  // No lock: hold_wanted_ is written only by this (the consumer's) thread, and a retained block
  // is never released here.
  void release(uint64_t id) override {
    const auto index = static_cast<uint32_t>(id);
    // paper §3.2.5 step 3; §3.3: a block wanted held goes straight to 2.
    status(index).store(hold_wanted_[index] ? kHeld : kEmpty, std::memory_order_release);
  }

  // paper §3.3: the application keeps the block's data in place; the sender skips it (status 2).
  // The block is full (1) until now, so the sender cannot be writing its byte.
  void retain(uint64_t id) override {
    const auto index = static_cast<uint32_t>(id);
    std::lock_guard lock(hold_mutex_);
    retained_[index] = 1;
    status(index).store(kHeld, std::memory_order_release);
  }

  // Any thread (the application's). The lock orders it against set_hold() on the consumer's.
  void release_retained(uint64_t id) override {
    const auto index = static_cast<uint32_t>(id);
    std::lock_guard lock(hold_mutex_);
    retained_[index] = 0;
    status(index).store(hold_wanted_[index] ? kHeld : kEmpty, std::memory_order_release);
  }

  void set_hold(uint32_t index, bool held) override {
    std::lock_guard lock(hold_mutex_);
    hold_wanted_[index] = held;
    if (retained_[index]) return;  // it stays 2 while lent; its release applies the hold
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
  std::vector<uint8_t> hold_wanted_;  // written by the consumer's thread only, under hold_mutex_
  std::vector<uint8_t> retained_;     // lent to the application (zero-copy receive), under hold_mutex_
  std::mutex hold_mutex_;
  uint32_t scan_from_ = 0;
};

Status check_options(const Options& options) {
  Pick pick;
  return parse_pick(options, &pick);
}

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options& options,
                   std::unique_ptr<SenderProtocol>* out) {
  Pick pick = Pick::kAny;
  SLOTSTREAM_RETURN_IF_ERROR(parse_pick(options, &pick));
  uint64_t words[2];  // blocks, status array
  std::unique_ptr<fabric::RemoteKey> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(read_keyed_setup(setup, "status_byte", fabric.endpoint, words, &rkey));
  out->reset(new StatusByteSender(fabric, words[0], words[1], std::move(rkey), pick));
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options&, std::unique_ptr<ReceiverProtocol>* out) {
  const Geometry& g = fabric.geometry;
  fabric::ExposedRegion region;
  SLOTSTREAM_RETURN_IF_ERROR(
      fabric::MemoryRegion::allocate_exposed(fabric.context, status_offset(g) + g.blocks, &region));
  out->reset(new StatusByteReceiver(fabric, std::move(region.region), std::move(region.rkey)));
  return Status::ok();
}

}  // namespace

int64_t StatusCache::pick(uint64_t* held_skips) {
  const uint32_t n = size();
  for (uint32_t k = 0; k < n; ++k) {
    uint32_t i = (cursor_ + k) % n;
    if (status_[i] == kEmpty) return i;
    if (status_[i] == kHeld) {
      if (held_skips) ++*held_skips;
      continue;  // paper §3.3: "skips the memory block with status 2"
    }
    if (policy_ == Pick::kPaper) return -1;  // paper §3.2.4: the next block is still full: synchronise
  }
  return -1;
}

bool StatusCache::any_empty() const { return std::find(status_.begin(), status_.end(), kEmpty) != status_.end(); }

Status parse_pick(const Options& options, Pick* out) {
  SLOTSTREAM_RETURN_IF_ERROR(options.check_known("status_byte", {"policy"}));
  std::string policy;
  SLOTSTREAM_RETURN_IF_ERROR(options.choice("policy", {"any", "paper"}, "any", &policy));
  *out = policy == "paper" ? Pick::kPaper : Pick::kAny;
  return Status::ok();
}

const Descriptor kStatusByte = {
    .name = "status_byte",
    .summary =
        "paper §3: receiver exposes N blocks + N status bytes and stays passive; the sender "
        "writes data, fence, status byte, and reads the status array only when out of free blocks",
    .options_help =
        "policy=any|paper: which receiver block is next — any: the first free one, passing full ones (default); "
        "paper: the paper's sender walk (§3.2.4, Fig. 18): blocks in order, skipping only held ones (status 2), "
        "waiting (status reads) while the next one is full",
    .holds = true,
    .packs = true,
    .check_options = check_options,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
