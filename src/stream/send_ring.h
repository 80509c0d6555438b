// The sender's N local send blocks and their status bytes (the paper's "first status byte
// memory block", §3.2.3), shared by the filler threads (one per device) and the one sending
// thread.
//
// Fillers take tickets 0, 1, 2, ... ; ticket t uses block t % N once the previous use of that
// block (ticket t - N) has been transmitted. Blocks are transmitted in ticket order from a
// cursor, so every device's packets leave in the order its filler produced them, even though
// several fillers write blocks at once.
//
// Who transmits: whoever holds the ring's transmit token (try_take_token), which owns the lane's
// UCX worker while it holds it. Normally a filler that just committed a block takes it and
// transmits at once — no hand-off to the sending thread, whose wake-up costs far more than a put
// (the one-message latency path, issue 11). When the token is taken, the filler leaves its block
// to the holder: give_token() tells a holder that a block was committed meanwhile, so no block
// waits for a timeout. The sending thread takes the token when it wakes (idle work, transfers in
// flight, protocol timers) and whenever fillers leave blocks to it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>

#include "slotstream/status.h"

namespace slotstream::stream {

class SendRing {
 public:
  struct Slot {
    uint64_t ticket = 0;
    uint32_t index = 0;
    std::span<std::byte> block;
  };

  SendRing(std::byte* base, uint32_t blocks, uint32_t block_size);

  // How the sending thread sleeps in wait_filled() when nothing is filled: by default on a
  // condition variable. A protocol whose worker must answer the peer while the sending thread is
  // idle (Descriptor::sender_wakeup) lets it sleep in the worker's event wait instead: `sleep`
  // waits for an event or the timeout, `wake` (a filler's commit, any thread) ends that sleep —
  // also one that begins after the call. Set before any filler starts.
  struct Sleeper {
    std::function<void(std::chrono::microseconds)> sleep;
    std::function<void()> wake;
  };
  void set_sleeper(Sleeper sleeper) { sleeper_ = std::move(sleeper); }
  // What a filler does while it waits in claim() for its block to be released (instead of only
  // yielding): the lane lets it advance the transfers that hold the blocks (take the token if it
  // is free, progress the worker, reap completions) — they complete only through progress, which
  // the filler would otherwise wait for the sending thread to make. Set before any filler starts.
  void set_claim_helper(std::function<void()> helper) { claim_helper_ = std::move(helper); }

  // Filler side (any thread). Blocks until the next block is free; kCancelled after abort().
  // With a deadline: kTimeout when the block is not free by then. The ticket taken is then given
  // up (abandon): its block is committed empty as soon as it is free, so the cursor never waits
  // for a filler that went away (a Python send() interrupted by Ctrl-C, or given a timeout).
  Status claim(Slot* out, std::optional<std::chrono::steady_clock::time_point> deadline = std::nullopt);
  // Marks a claimed block filled with `length` bytes (paper: status byte 0 -> 1). `wake`: wake
  // a sending thread sleeping in wait_next(); a filler that then tries the token itself passes
  // false (no syscall per message) and calls wake_sender() only if it could not take it.
  void commit(const Slot& slot, uint32_t length, bool wake = true);
  // Ends a sleep of the sending thread in wait_next() or nap() (if it sleeps; cheap otherwise).
  // Any thread.
  void wake_sender();
  // Sending thread: sleeps up to `timeout` or until wake_sender() — waiting while a filler holds
  // the token (it wakes the sender when it leaves blocks or transfers behind). Returns at once if
  // the token is free when the nap begins (given back just before: its holder saw no one waiting).
  void nap(std::chrono::microseconds timeout);

  // The transmit token (any thread). try_take_token() is lock-free and never waits.
  // give_token() returns true when the block at the cursor is filled: a filler committed it while
  // the token was held and left it to the holder, who must take the token again (or, if that
  // fails, it went to someone who will see the block).
  bool try_take_token() { return !token_.exchange(true, std::memory_order_seq_cst); }
  bool give_token() {
    token_.store(false, std::memory_order_seq_cst);  // pairs with commit's seq_cst store
    return next_length() >= 0;
  }

  // Token holder's side. The next ticket to transmit, and its block's length if it is filled
  // (else -1). advance() moves the cursor past it once it was handed to the protocol.
  uint64_t cursor() const { return cursor_.load(std::memory_order_acquire); }
  int64_t next_length() const { return filled_length(cursor()); }
  void advance() { cursor_.fetch_add(1, std::memory_order_acq_rel); }
  std::byte* block(uint64_t ticket) { return base_ + size_t(ticket % blocks_) * block_size_; }
  // The block of `ticket` has been transmitted and its source is no longer needed (1 -> 0).
  void release(uint64_t ticket);

  // Sending-thread side, without the token: waits up to `timeout` for the block at the cursor to
  // be filled — spinning for `spin` first (while it moves data itself, sleeping would cost a
  // futex wake per block), then sleeping; returns its length or -1.
  int64_t wait_next(std::chrono::microseconds spin, std::chrono::microseconds timeout);

  // Tickets handed out so far (the sending thread is done when it has released them all).
  uint64_t claimed() const { return next_ticket_.load(std::memory_order_acquire); }
  // Wakes and fails every waiting filler (the connection is gone).
  void abort();
  uint32_t blocks() const { return blocks_; }
  uint32_t block_size() const { return block_size_; }

 private:
  struct alignas(64) SlotState {
    std::atomic<uint64_t> turn;   // ticket allowed to fill this block next
    std::atomic<int64_t> length;  // -1 while not filled, else bytes filled
  };

  std::byte* base_;
  uint32_t blocks_;
  uint32_t block_size_;
  std::unique_ptr<SlotState[]> slots_;
  // -1 unless the block of `ticket` is filled (it may still hold ticket - N, in flight).
  int64_t filled_length(uint64_t ticket) const {
    const SlotState& s = slots_[ticket % blocks_];
    if (s.turn.load(std::memory_order_acquire) != ticket) return -1;
    return s.length.load(std::memory_order_seq_cst);
  }

  std::atomic<uint64_t> next_ticket_{0};
  std::atomic<uint64_t> cursor_{0};  // next ticket to transmit (moved by the token holder)
  std::atomic<bool> token_{false};
  std::atomic<bool> aborted_{false};

  // Sleeping is rare (ring full, or the sending thread idle); these are only touched then.
  std::mutex mutex_;
  std::condition_variable freed_;
  std::condition_variable filled_;
  std::atomic<int> fillers_waiting_{0};
  // Tickets whose filler gave up before its block was free (claim with a deadline): committed
  // empty by release() when their turn comes. Guarded by mutex_; the count lets release() skip it.
  std::set<uint64_t> abandoned_;
  std::atomic<size_t> abandoned_count_{0};
  void abandon(uint64_t ticket);
  std::atomic<bool> sender_waiting_{false};
  bool woken_ = false;  // wake_sender() was called during a nap() (under mutex_)
  Sleeper sleeper_;
  std::function<void()> claim_helper_;
};

}  // namespace slotstream::stream
