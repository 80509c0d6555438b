#include "stream/send_ring.h"

#include <thread>

namespace slotstream::stream {

SendRing::SendRing(std::byte* base, uint32_t blocks, uint32_t block_size)
    : base_(base),
      blocks_(blocks),
      block_size_(block_size),
      slots_(new SlotState[blocks]) {
  for (uint32_t i = 0; i < blocks; ++i) {
    slots_[i].turn.store(i, std::memory_order_relaxed);
    slots_[i].length.store(-1, std::memory_order_relaxed);
  }
}

Status SendRing::claim(Slot* out, std::optional<std::chrono::steady_clock::time_point> deadline) {
  uint64_t t = next_ticket_.fetch_add(1, std::memory_order_acq_rel);
  SlotState& s = slots_[t % blocks_];
  // Short spin first: with enough blocks the slot is almost always free already.
  for (int i = 0; i < 64 && s.turn.load(std::memory_order_acquire) != t; ++i) {
    if (claim_helper_) claim_helper_();
    std::this_thread::yield();
  }
  if (s.turn.load(std::memory_order_acquire) != t) {
    std::unique_lock lock(mutex_);
    fillers_waiting_.fetch_add(1);
    auto free_or_aborted = [&] { return s.turn.load(std::memory_order_acquire) == t || aborted_.load(); };
    const bool got =
        deadline ? freed_.wait_until(lock, *deadline, free_or_aborted) : (freed_.wait(lock, free_or_aborted), true);
    fillers_waiting_.fetch_sub(1);
    if (!got) {
      lock.unlock();
      abandon(t);
      return {Code::kTimeout, "no send block became free in time (every block is in flight)"};
    }
  }
  if (aborted_.load(std::memory_order_acquire)) return {Code::kCancelled, "sender closed"};
  out->ticket = t;
  out->index = static_cast<uint32_t>(t % blocks_);
  out->block = {block(t), block_size_};
  return Status::ok();
}

void SendRing::commit(const Slot& slot, uint32_t length, bool wake) {
  // seq_cst: pairs with sender_waiting_ (wake_sender) and with the token (give_token).
  slots_[slot.index].length.store(length, std::memory_order_seq_cst);
  if (wake) wake_sender();
}

void SendRing::wake_sender() {
  if (!sender_waiting_.load(std::memory_order_seq_cst)) return;
  if (sleeper_.wake) sleeper_.wake();
  std::lock_guard lock(mutex_);
  woken_ = true;
  filled_.notify_one();
}

void SendRing::nap(std::chrono::microseconds timeout) {
  std::unique_lock lock(mutex_);
  woken_ = false;
  // Either we see the token given back, or a holder that leaves work sees sender_waiting_ and
  // wakes us (one that leaves nothing lets the nap run out: there is nothing to do).
  sender_waiting_.store(true, std::memory_order_seq_cst);
  filled_.wait_for(lock, timeout, [&] {
    return woken_ || !token_.load(std::memory_order_seq_cst) || aborted_.load(std::memory_order_acquire);
  });
  sender_waiting_.store(false, std::memory_order_relaxed);
}

int64_t SendRing::wait_next(std::chrono::microseconds spin, std::chrono::microseconds timeout) {
  // The cursor moves while we wait when fillers transmit themselves: next_length() looks at
  // where it is now.
  const auto spin_until = std::chrono::steady_clock::now() + spin;
  for (int i = 0;; ++i) {
    if (int64_t len = next_length(); len >= 0) return len;
    if ((i & 15) == 15 && std::chrono::steady_clock::now() >= spin_until) break;
    // On a machine with fewer cores than busy threads, spinning without yielding would keep
    // the very filler we wait for off the CPU.
    if (i >= 16) std::this_thread::yield();
  }
  if (sleeper_.sleep) {
    // Either we see the fill, or the filler sees sender_waiting_ and wakes a sleep that is
    // about to start (the wake is kept until then).
    sender_waiting_.store(true, std::memory_order_seq_cst);
    if (next_length() < 0) sleeper_.sleep(timeout);
  } else {
    std::unique_lock lock(mutex_);
    sender_waiting_.store(true, std::memory_order_seq_cst);
    filled_.wait_for(lock, timeout, [&] { return next_length() >= 0; });
  }
  sender_waiting_.store(false, std::memory_order_relaxed);
  return next_length();
}

void SendRing::release(uint64_t ticket) {
  SlotState& s = slots_[ticket % blocks_];
  s.length.store(-1, std::memory_order_relaxed);
  s.turn.store(ticket + blocks_, std::memory_order_seq_cst);  // pairs with fillers_waiting_
  if (abandoned_count_.load(std::memory_order_seq_cst) > 0) {
    std::unique_lock lock(mutex_);
    if (abandoned_.erase(ticket + blocks_)) {  // its filler gave up: nothing to send from it
      abandoned_count_.fetch_sub(1, std::memory_order_seq_cst);
      lock.unlock();
      commit({ticket + blocks_, uint32_t((ticket + blocks_) % blocks_), {}}, 0);
    }
  }
  if (fillers_waiting_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard lock(mutex_);
    freed_.notify_all();
  }
}

void SendRing::abandon(uint64_t ticket) {
  SlotState& s = slots_[ticket % blocks_];
  {
    std::lock_guard lock(mutex_);
    if (s.turn.load(std::memory_order_seq_cst) != ticket) {  // not free yet: release() commits it
      abandoned_.insert(ticket);
      abandoned_count_.fetch_add(1, std::memory_order_seq_cst);
      // release() may have made it free between the check and the insert: it then looked at
      // abandoned_count_ before our insert. Check once more, still under the lock.
      if (s.turn.load(std::memory_order_seq_cst) != ticket) return;
      abandoned_.erase(ticket);
      abandoned_count_.fetch_sub(1, std::memory_order_seq_cst);
    }
  }
  commit({ticket, uint32_t(ticket % blocks_), {}}, 0);  // free already: give it back empty ourselves
}

void SendRing::abort() {
  aborted_.store(true, std::memory_order_release);
  std::lock_guard lock(mutex_);
  freed_.notify_all();
  filled_.notify_all();
}

}  // namespace slotstream::stream
