#include "stream/send_ring.h"

#include <thread>

namespace slotstream::stream {

SendRing::SendRing(std::byte* base, uint32_t blocks, uint32_t block_size)
    : base_(base), blocks_(blocks), block_size_(block_size), slots_(new SlotState[blocks]) {
  for (uint32_t i = 0; i < blocks; ++i) {
    slots_[i].turn.store(i, std::memory_order_relaxed);
    slots_[i].length.store(-1, std::memory_order_relaxed);
  }
}

Status SendRing::claim(Slot* out) {
  uint64_t t = next_ticket_.fetch_add(1, std::memory_order_acq_rel);
  SlotState& s = slots_[t % blocks_];
  // Short spin first: with enough blocks the slot is almost always free already.
  for (int i = 0; i < 64 && s.turn.load(std::memory_order_acquire) != t; ++i) std::this_thread::yield();
  if (s.turn.load(std::memory_order_acquire) != t) {
      std::unique_lock lock(mutex_);
    fillers_waiting_.fetch_add(1);
    freed_.wait(lock, [&] { return s.turn.load(std::memory_order_acquire) == t || aborted_.load(); });
    fillers_waiting_.fetch_sub(1);
  }
  if (aborted_.load(std::memory_order_acquire)) return {Code::kCancelled, "sender closed"};
  out->ticket = t;
  out->index = static_cast<uint32_t>(t % blocks_);
  out->block = {block(t), block_size_};
  return Status::ok();
}

void SendRing::commit(const Slot& slot, uint32_t length) {
  slots_[slot.index].length.store(length, std::memory_order_seq_cst);  // pairs with sender_waiting_
  if (sender_waiting_.load(std::memory_order_seq_cst)) {
    if (sleeper_.wake) return sleeper_.wake();
    std::lock_guard lock(mutex_);
    filled_.notify_one();
  }
}

int64_t SendRing::wait_filled(uint64_t ticket, std::chrono::microseconds timeout) {
  SlotState& s = slots_[ticket % blocks_];
  // The block may still hold ticket - N, in flight: it is ours only once its turn is `ticket`.
  auto filled = [&]() -> int64_t {
    if (s.turn.load(std::memory_order_acquire) != ticket) return -1;
    return s.length.load(std::memory_order_acquire);
  };
  // Spin while data is flowing (a filler is about to commit: sleeping would cost a futex wake
  // per block), but only briefly on a connection that has gone idle, so an idle sending thread
  // costs ~nothing — there is one per connection, and a baseline may use one per device.
  const auto spin_until = std::chrono::steady_clock::now() + spin_budget_;
  for (int i = 0;; ++i) {
    if (int64_t len = filled(); len >= 0) {
      spin_budget_ = kBusySpin;
      return len;
    }
    if ((i & 15) == 15 && std::chrono::steady_clock::now() >= spin_until) break;
    // On a machine with fewer cores than busy threads, spinning without yielding would keep
    // the very filler we wait for off the CPU.
    if (i >= 16) std::this_thread::yield();
  }
  bool got = false;
  if (sleeper_.sleep) {
    // Either we see the fill, or the filler sees sender_waiting_ and wakes a sleep that is
    // about to start (the wake is kept until then).
    sender_waiting_.store(true, std::memory_order_seq_cst);
    if (filled() < 0) sleeper_.sleep(timeout);
    got = filled() >= 0;
  } else {
    std::unique_lock lock(mutex_);
    sender_waiting_.store(true, std::memory_order_seq_cst);
    got = filled_.wait_for(lock, timeout, [&] { return filled() >= 0; });
  }
  sender_waiting_.store(false, std::memory_order_relaxed);
  spin_budget_ = got ? kBusySpin : kIdleSpin;
  return filled();
}

void SendRing::release(uint64_t ticket) {
  SlotState& s = slots_[ticket % blocks_];
  s.length.store(-1, std::memory_order_relaxed);
  s.turn.store(ticket + blocks_, std::memory_order_seq_cst);  // pairs with fillers_waiting_
  if (fillers_waiting_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);
    freed_.notify_all();
  }
}

void SendRing::abort() {
  aborted_.store(true, std::memory_order_release);
  std::lock_guard lock(mutex_);
  freed_.notify_all();
  filled_.notify_all();
}

}  // namespace slotstream::stream
