// The sender's N local send blocks and their status bytes (the paper's "first status byte
// memory block", §3.2.3), shared by the filler threads (one per device) and the one sending
// thread.
//
// Fillers take tickets 0, 1, 2, ... ; ticket t uses block t % N once the previous use of that
// block (ticket t - N) has been transmitted. The sending thread transmits tickets in the same
// order. So every device's packets leave in the order its filler produced them, even though
// several fillers write blocks at once — and no filler ever makes a UCX call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
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

  // Filler side (any thread). Blocks until the next block is free; kCancelled after abort().
  Status claim(Slot* out);
  // Marks a claimed block filled with `length` bytes (paper: status byte 0 -> 1).
  void commit(const Slot& slot, uint32_t length);

  // Sending-thread side. Waits up to `timeout` for the block of `ticket` to be filled; returns
  // its length, or -1 on timeout.
  int64_t wait_filled(uint64_t ticket, std::chrono::microseconds timeout);
  std::byte* block(uint64_t ticket) { return base_ + size_t(ticket % blocks_) * block_size_; }
  // The block of `ticket` has been transmitted and its source is no longer needed (1 -> 0).
  void release(uint64_t ticket);

  // Tickets handed out so far (the sending thread is done when it has released them all).
  uint64_t claimed() const { return next_ticket_.load(std::memory_order_acquire); }
  // Wakes and fails every waiting filler (the connection is gone).
  void abort();
  uint32_t blocks() const { return blocks_; }
  uint32_t block_size() const { return block_size_; }

 private:
  struct alignas(64) SlotState {
    std::atomic<uint64_t> turn;    // ticket allowed to fill this block next
    std::atomic<int64_t> length;   // -1 while not filled, else bytes filled
  };

  static constexpr std::chrono::microseconds kBusySpin{50};
  static constexpr std::chrono::microseconds kIdleSpin{2};

  std::byte* base_;
  uint32_t blocks_;
  uint32_t block_size_;
  std::unique_ptr<SlotState[]> slots_;
  std::atomic<uint64_t> next_ticket_{0};
  std::atomic<bool> aborted_{false};
  std::chrono::microseconds spin_budget_ = kIdleSpin;  // sending thread only

  // Sleeping is rare (ring full, or the sending thread idle); these are only touched then.
  std::mutex mutex_;
  std::condition_variable freed_;
  std::condition_variable filled_;
  std::atomic<int> fillers_waiting_{0};
  std::atomic<bool> sender_waiting_{false};
  Sleeper sleeper_;
};

}  // namespace slotstream::stream
