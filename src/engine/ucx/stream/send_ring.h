// The sender's N local send blocks and their status (the paper's "first status byte memory
// block", §3.2.3), shared by the filler threads (one per device) and whoever transmits.
//
// Blocks are used in ticket order (ticket t uses block t % N once ticket t - N has been
// transmitted) and transmitted in ticket order from a cursor, so every device's packets leave in
// the order its filler produced them, whatever the number of fillers.
//
// Two ways to fill a block:
//   - packed: a small record (header + payload) is appended to the *open* block. A filler
//     reserves its bytes with one atomic add on the ring's reservation word (below), writes its
//     record and marks it written with a plain release store of a ready flag kept beside the data
//     (the transmitter clears it when it has seen it) — no lock, one atomic read-modify-write per
//     message. The open block is sealed when a record no longer fits, or by the
//     transmitter the moment it has nothing else to send (the lane goes idle): then all its
//     records leave as one unit, one block and one status byte (wire/block_header.h). A lone
//     message is sealed and sent at once; nothing waits for a timer.
//   - whole block (claim/commit): a record too large to pack (a fragment of a message larger
//     than a block, or packing off) takes a block of its own, as before packing existed.
//
// The reservation word (64 bits, one atomic; after Aeron's log buffer, whose producers claim
// with one fetch-add and publish with a store):
//
//   63     62       61..44          43..32           31..0
//   token  sleeping gen (18 bits)   index (12 bits)  offset (32 bits)
//
//   offset in [kHead, limit]       OPEN: block `index` (ticket ≡ gen mod 2^18) takes records at offset
//   limit < offset < kPendingBase  CLOSED: a record overflowed it; its sealer seals it
//   offset >= kPendingBase         PENDING: sealed; block `index` (ticket ≡ gen) opens when it is free
//
// Fillers add to the offset blindly (one fetch_add) once they have seen the block OPEN, so the
// offset of a CLOSED or PENDING word may grow; the bounds leave room for every filler's add.
// The transmit token is a bit of the same word so that a reservation learns for free whether the
// lane is busy: a filler that reserved while the token was held leaves its record to the holder,
// who cannot give the token back without seeing it (give_token re-reads the word it changes); one
// that reserved while it was free takes the token itself and transmits (the latency path: no
// hand-off to the sending thread, whose wake-up costs far more than a put).
//
// Who transmits: whoever holds the token owns the lane's UCX worker and the protocol's sender half.
// A filler that transmits hands the lane to the sending thread (hand_to_sender: the token stays
// held, the thread is woken once) when the receiver has no room or it has sent a ring's worth;
// fillers then go on packing while the sending thread waits and transmits — which is what makes a
// busy lane pack.
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
#include "wire/block_header.h"

namespace slotstream::stream {

class SendRing {
 public:
  // Every local block starts with room for a packed unit's header; records follow.
  static constexpr uint32_t kHead = uint32_t(wire::kPackedHeaderSize);
  // Most bytes of one block that take packed records (larger blocks pack this much and no more:
  // it bounds the ready flags, kept beside the data, to 1/8 of it).
  static constexpr uint32_t kMaxPackArea = 256u << 10;
  // Largest record that is packed with others; larger ones take a block of their own (packing
  // saves nothing there, and it bounds how far fillers' blind adds can carry the offset).
  static constexpr uint32_t kMaxPackedRecord = 16u << 10;
  // Bytes of local memory per block (block_size plus the packed header's room, cache-line aligned).
  static size_t block_stride(uint32_t block_size) { return (size_t(block_size) + kHead + 63) / 64 * 64; }

  // `base`: blocks * block_stride(block_size) bytes. `pack`: small records are packed (off: every
  // record takes a block, the paper's one message per block).
  SendRing(std::byte* base, uint32_t blocks, uint32_t block_size, bool pack = true);

  // Called by a filler that may have to transmit: it reserved a record or sealed a block while the
  // token was free, committed a whole block, or waits for a block (the transfers that hold it need
  // the worker progressed). The lane takes the token if it is free and transmits. Set before any
  // filler starts.
  void set_helper(std::function<void()> helper) { helper_ = std::move(helper); }
  // How the sending thread sleeps in wait_work() when idle: by default on a condition variable. A
  // protocol whose worker must answer the peer while the sending thread is idle
  // (Descriptor::sender_wakeup) lets it sleep in the worker's event wait instead: `sleep` waits
  // for an event or the timeout, `wake` (any thread) ends that sleep — also one that begins after
  // the call. Set before any filler starts.
  struct Sleeper {
    std::function<void(std::chrono::microseconds)> sleep;
    std::function<void()> wake;
  };
  void set_sleeper(Sleeper sleeper) { sleeper_ = std::move(sleeper); }

  // ---- filler side (any thread; one device's records from one thread at a time)

  // Largest record (wire::packed_record_size) that reserve() takes; 0: packing is off.
  uint32_t max_packed() const { return max_packed_; }
  struct Reservation {
    std::byte* record = nullptr;  // `size` bytes: header, payload, padding
    uint32_t size = 0;
    bool lane_idle = false;  // the token was free: the filler must try to transmit (helper)
    bool wake = false;       // the holder sleeps in the worker (Sleeper): wake_sender()
    uint32_t flag = 0;       // (internal) the record's ready flag
  };
  // Reserves `size` bytes (at most max_packed()) in the open block: one fetch_add unless the block
  // is full (then the first filler that overflows seals it) or not yet free. kCancelled after abort().
  // With a deadline: kTimeout when no block opened by then (nothing is reserved).
  using Deadline = std::optional<std::chrono::steady_clock::time_point>;
  Status reserve(uint32_t size, Reservation* out, Deadline deadline = std::nullopt);
  // The record is written (header and payload): the transmitter may send it. A plain release
  // store; the caller then calls the helper if `lane_idle`, wake_sender() if `wake`.
  void publish(const Reservation& r);

  struct Slot {
    uint64_t ticket = 0;
    uint32_t index = 0;
    std::span<std::byte> block;  // block_size bytes for one record (after the packed header's room)
  };
  // Takes the next block whole (sealing the open one first if it holds records). Blocks until it
  // is free; kCancelled after abort(). With a deadline: kTimeout when the block is not free by
  // then. A ticket already taken is then given up (abandon): its block is committed empty as soon
  // as it is free, so the cursor never waits for a filler that went away (a Python send()
  // interrupted by Ctrl-C, or given a timeout).
  Status claim(Slot* out, Deadline deadline = std::nullopt);
  // The claimed block holds a `length`-byte record (0: nothing, the fill gave up). Then call the
  // helper: the committer transmits if no one else does.
  void commit(const Slot& slot, uint32_t length);

  // ---- the transmit token (any thread; lock-free)

  // `holder_sleeps`: it was taken by a holder asleep in the worker (Sleeper), which a filler
  // that leaves it work must wake.
  bool try_take_token(bool* holder_sleeps = nullptr) {
    const uint64_t old = word_.fetch_or(kToken, std::memory_order_seq_cst);
    if (holder_sleeps) *holder_sleeps = (old & kToken) && (old & kSleeping);
    return !(old & kToken);
  }
  // Gives the token back. True when work is left that relied on the holder (a sealed unit at the
  // cursor, records reserved while it held the token): take it again — or, if that fails, the new
  // holder sees the work.
  bool give_token();
  // The holder (a filler) leaves the lane to the sending thread: the token stays held, the
  // sending thread is woken and takes it over (take_handoff). Fillers go on packing meanwhile.
  void hand_to_sender();
  // Sending thread: whether a filler handed the token to it (consumes the hand-off).
  bool take_handoff() { return handoff_.exchange(false, std::memory_order_acq_rel); }
  // The holder is about to sleep in the worker (Sleeper) with the token: fillers that reserve
  // meanwhile wake it. False (do not sleep) if there is work. end_sleep() when it woke.
  bool begin_sleep();
  void end_sleep() { word_.fetch_and(~kSleeping, std::memory_order_seq_cst); }

  // ---- the token holder's side

  struct Unit {
    uint64_t ticket = 0;
    const std::byte* data = nullptr;  // what to put into the receiver block
    size_t length = 0;                // 0: nothing to send (release it at once)
    uint32_t records = 0;             // records in it (void ones left out)
    bool packed = false;              // a packed header leads (several records)
  };
  // The unit at the cursor, if there is one: a sealed or committed block — or, with `seal_open`,
  // the open block when the cursor has reached it and it holds records (the lane has nothing else
  // to send: it is sealed now). Waits for records still being written. A packed unit's header is
  // written into the block here.
  bool next_unit(Unit* out, bool seal_open);
  // Whether next_unit(seal_open=true) would find something (no waiting, no sealing).
  bool has_work() const;
  // Whether the unit at the cursor is a block claimed whole and committed (one record: nothing
  // packs into it while it waits for receiver room).
  bool whole_at_cursor() const;
  uint64_t cursor() const { return cursor_.load(std::memory_order_acquire); }
  void advance() { cursor_.fetch_add(1, std::memory_order_acq_rel); }
  // The block of `ticket` was transmitted and its data is no longer needed: free it for reuse.
  void release(uint64_t ticket);
  // Nothing is reserved, claimed or sealed that has not been transmitted (the lane is drained).
  bool drained() const;

  // ---- the sending thread, without the token

  // Waits up to `timeout` for work (see has_work, or a hand-off) — spinning for `spin` first (while
  // it moves data itself, a sleep would cost a futex wake per unit), then sleeping. True: work.
  bool wait_work(std::chrono::microseconds spin, std::chrono::microseconds timeout);
  // Sleeps up to `timeout` or until wake_sender(); returns at once if the token is free.
  void nap(std::chrono::microseconds timeout);
  // Ends a sleep of the sending thread in wait_work() or nap(). Any thread; cheap when it is awake.
  void wake_sender();
  // Wakes and fails every waiting filler (the connection is gone).
  void abort();
  uint32_t blocks() const { return blocks_; }
  uint32_t block_size() const { return block_size_; }

 private:
  static constexpr uint64_t kToken = uint64_t(1) << 63;
  static constexpr uint64_t kSleeping = uint64_t(1) << 62;
  static constexpr uint64_t kBits = kToken | kSleeping;
  static constexpr int kGenShift = 44, kIndexShift = 32;
  static constexpr uint64_t kGenMask = (uint64_t(1) << 18) - 1, kIndexMask = (uint64_t(1) << 12) - 1;
  static constexpr uint32_t kPendingBase = 0x80000000u;
  static_assert(uint64_t(kMaxPackArea) + kHead + 65536ull * kMaxPackedRecord < kPendingBase,
                "every filler's blind add on a CLOSED word stays below PENDING");

  struct alignas(64) SlotState {
    std::atomic<uint64_t> turn;      // ticket that uses this block next (or uses it now)
    std::atomic<int64_t> length;     // -1 until sealed/committed, else bytes of records after kHead
    std::atomic<bool> whole{false};  // claimed whole (one record, committed as written)
  };

  static uint32_t off(uint64_t w) { return uint32_t(w); }
  static uint32_t index(uint64_t w) { return uint32_t((w >> kIndexShift) & kIndexMask); }
  static uint64_t gen(uint64_t w) { return (w >> kGenShift) & kGenMask; }
  static uint64_t make(uint64_t bits, uint64_t ticket, uint32_t index, uint32_t offset) {
    return (bits & kBits) | ((ticket & kGenMask) << kGenShift) | (uint64_t(index) << kIndexShift) | offset;
  }
  bool is_open(uint64_t w) const { return off(w) <= limit_; }
  static bool is_pending(uint64_t w) { return off(w) >= kPendingBase; }
  // The ticket of the block a word names (its slot's turn while it is open or being sealed).
  uint64_t ticket_of(uint64_t w) const { return slots_[index(w)].turn.load(std::memory_order_acquire); }
  std::byte* block(uint64_t ticket) const { return base_ + size_t(ticket % blocks_) * stride_; }
  std::atomic_ref<uint8_t> flag(uint32_t index, uint32_t offset) const {
    return std::atomic_ref<uint8_t>(flags_[size_t(index) * flags_per_block_ + offset / wire::kRecordAlign]);
  }

  // The filler whose add overflowed the open block seals it at `offset` (its last record's end).
  void seal_overflowed(uint64_t w, uint32_t offset, bool* took_token);
  void sealed_while_free(uint64_t w_after, bool* responsible);
  // PENDING -> OPEN once the block is free; false: not free yet.
  bool try_open(uint64_t w);
  // A filler waits (for a block to open or be freed): spins, helps, then sleeps briefly.
  Status wait_turn(int* spins, Deadline deadline);
  bool unit_at_cursor() const;
  void walk(uint64_t ticket, Unit* out);

  std::byte* base_;
  const uint32_t blocks_;
  const uint32_t block_size_;
  const size_t stride_;
  uint32_t limit_ = 0;  // highest end offset of a packed record (a unit is [0, offset))
  uint32_t max_packed_ = 0;
  size_t flags_per_block_ = 0;
  std::unique_ptr<SlotState[]> slots_;
  std::unique_ptr<uint8_t[]> flags_;  // per block, one per 8-byte offset: a record there is written

  alignas(64) std::atomic<uint64_t> word_;
  alignas(64) std::atomic<uint64_t> cursor_{0};  // next ticket to transmit (moved by the token holder)
  std::atomic<bool> handoff_{false};
  std::atomic<bool> aborted_{false};

  // Sleeping is rare (ring full, or the sending thread idle); these are only touched then.
  std::mutex mutex_;
  std::condition_variable freed_;
  std::condition_variable work_;
  std::atomic<int> fillers_waiting_{0};
  // Tickets whose filler gave up before its block was free (claim with a deadline): committed
  // empty by release() when their turn comes. Guarded by mutex_; the count lets release() skip it.
  std::set<uint64_t> abandoned_;
  std::atomic<size_t> abandoned_count_{0};
  void abandon(uint64_t ticket);
  std::atomic<bool> sender_waiting_{false};
  bool woken_ = false;  // wake_sender() was called during a sleep (under mutex_)
  Sleeper sleeper_;
  std::function<void()> helper_;
};

}  // namespace slotstream::stream
