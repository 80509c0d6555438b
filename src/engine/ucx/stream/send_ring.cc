#include "engine/ucx/stream/send_ring.h"

#include <algorithm>
#include <thread>

#include "wire/codec.h"

namespace slotstream::stream {

namespace {
// A filler that waits for a block spins this many times (yielding: on a machine with fewer cores
// than busy threads the thread it waits for may need this core) before it sleeps.
constexpr int kSpinTurns = 64;
// Then it sleeps until a block is freed (release() wakes it), at most kFillerSleep at first and twice
// as long after each sleep in which nothing changed, up to kFillerSleep << kFillerSleepDoublings: a
// receiver that stalls for good (stopped, hung) then costs its sender's fillers ~nothing.
constexpr auto kFillerSleep = std::chrono::milliseconds(1);
constexpr int kFillerSleepDoublings = 3;
}  // namespace

SendRing::SendRing(std::byte* base, uint32_t blocks, uint32_t block_size, bool pack)
    : base_(base),
      blocks_(blocks),
      block_size_(block_size),
      stride_(block_stride(block_size)),
      slots_(new SlotState[blocks]) {
  for (uint32_t i = 0; i < blocks; ++i) {
    slots_[i].turn.store(i, std::memory_order_relaxed);
    slots_[i].length.store(-1, std::memory_order_relaxed);
  }
  limit_ = kHead;  // without packing an open block is always empty: claim() takes it whole
  if (pack) {
    // A unit is [0, offset): at most one block, and at most kMaxPackArea of records.
    const uint32_t limit =
        std::min<uint32_t>(block_size, kHead + kMaxPackArea) / wire::kRecordAlign * wire::kRecordAlign;
    const uint32_t room = limit > kHead ? limit - kHead : 0;
    if (room >= wire::packed_record_size(0)) {
      limit_ = limit;
      max_packed_ = std::min(kMaxPackedRecord, room);
      flags_per_block_ = limit_ / wire::kRecordAlign + 1;
      flags_.reset(new uint8_t[size_t(blocks) * flags_per_block_]());
    }
  }
  word_.store(make(0, 0, 0, kHead), std::memory_order_relaxed);
}

// ------------------------------------------------------------------------------ filler side

Status SendRing::reserve(uint32_t size, Reservation* out, Deadline deadline) {
  for (int spins = 0;;) {
    uint64_t w = word_.load(std::memory_order_acquire);
    if (!is_open(w)) {
      if (is_pending(w) && try_open(w)) continue;
      SLOTSTREAM_RETURN_IF_ERROR(wait_turn(&spins, deadline));
      continue;
    }
    // The one atomic read-modify-write of a message: its bytes in the open block.
    const uint64_t old = word_.fetch_add(size, std::memory_order_acq_rel);
    const uint32_t o = off(old);
    if (o <= limit_ && o + size <= limit_) {
      out->record = base_ + size_t(index(old)) * stride_ + o;
      out->size = size;
      out->lane_idle = !(old & kToken);
      out->wake = (old & kToken) && (old & kSleeping);
      out->flag = index(old) * uint32_t(flags_per_block_) + o / uint32_t(wire::kRecordAlign);
      return Status::ok();
    }
    if (o <= limit_) {  // ours is the add that closed the block: seal it where its last record ends
      bool responsible = false;
      seal_overflowed(old, o, &responsible);
      if (responsible && helper_) helper_();
    }
    // else the block was closed before our add landed: look again.
  }
}

void SendRing::publish(const Reservation& r) {
  std::atomic_ref<uint8_t>(flags_[r.flag]).store(1, std::memory_order_release);
}

void SendRing::seal_overflowed(uint64_t w, uint32_t offset, bool* responsible) {
  SlotState& s = slots_[index(w)];
  const uint64_t t = s.turn.load(std::memory_order_acquire);  // the block is not released before it is sealed
  s.whole.store(false, std::memory_order_relaxed);
  s.length.store(int64_t(offset) - kHead, std::memory_order_seq_cst);
  // CLOSED -> PENDING(t + 1). Only this filler changes gen and index now; others' adds and the
  // token bits may change the rest, hence the loop.
  uint64_t cur = word_.load(std::memory_order_acquire);
  while (!word_.compare_exchange_weak(cur, make(cur, t + 1, uint32_t((t + 1) % blocks_), kPendingBase),
                                      std::memory_order_seq_cst)) {
  }
  sealed_while_free(cur, responsible);
}

// A block was sealed (its length stored, seq_cst) and the word last read as `w_after`: if no one
// holds the token, the sealer must see that it is sent (the holder that gives the token back
// after this reads the length: give_token).
void SendRing::sealed_while_free(uint64_t w_after, bool* responsible) {
  if (!(w_after & kToken)) {
    *responsible = true;
  } else if (w_after & kSleeping) {
    wake_sender();
  }
}

bool SendRing::try_open(uint64_t w) {
  const uint32_t i = index(w);
  const uint64_t turn = slots_[i].turn.load(std::memory_order_acquire);
  if ((turn & kGenMask) != gen(w)) return false;  // its previous ticket has not been released yet
  (void)word_.compare_exchange_strong(w, make(w, turn, i, kHead), std::memory_order_seq_cst);
  return true;  // opened, by us or another filler (or the word moved on): look again
}

Status SendRing::wait_turn(int* spins, Deadline deadline) {
  if (aborted_.load(std::memory_order_acquire)) return {Code::kCancelled, "sender closed"};
  // Checked once per turn; a turn sleeps no longer than the deadline leaves.
  if (deadline && std::chrono::steady_clock::now() >= *deadline) {
    return {Code::kTimeout, "no send block became free in time (every block is in flight)"};
  }
  if (++*spins < kSpinTurns) {
    // The transfers holding the block may need the worker progressed, or sealed blocks a holder.
    if (helper_ && (*spins & 7) == 0) helper_();
    std::this_thread::yield();
    return Status::ok();
  }
  if (helper_) helper_();
  // *spins - kSpinTurns: the sleeps before this one that ended with nothing changed.
  std::chrono::steady_clock::duration sleep =
      kFillerSleep * (1 << std::min(*spins - kSpinTurns, kFillerSleepDoublings));
  if (deadline) sleep = std::min(sleep, *deadline - std::chrono::steady_clock::now());
  const uint64_t seen = word_.load(std::memory_order_seq_cst);
  std::unique_lock lock(mutex_);
  fillers_waiting_.fetch_add(1, std::memory_order_seq_cst);  // pairs with release()'s turn store
  const bool moved = freed_.wait_for(lock, sleep, [&] {
    const uint64_t w = word_.load(std::memory_order_seq_cst);
    if (w != seen || aborted_.load()) return true;
    return is_pending(w) && (slots_[index(w)].turn.load(std::memory_order_seq_cst) & kGenMask) == gen(w);
  });
  fillers_waiting_.fetch_sub(1, std::memory_order_relaxed);
  // Woken by a change: spin again for the block that comes next. A sleep that ended with nothing
  // changed (a stalled receiver) is followed by a longer one at once (*spins counts it): spinning
  // half the turns after every 1 ms sleep made the two fillers of a sender whose receiver was
  // stopped yield ~5,000 times a second.
  if (moved) *spins = kSpinTurns / 2;
  return aborted_.load(std::memory_order_acquire) ? Status{Code::kCancelled, "sender closed"} : Status::ok();
}

Status SendRing::claim(Slot* out, Deadline deadline) {
  for (int spins = 0;;) {
    if (aborted_.load(std::memory_order_acquire)) return {Code::kCancelled, "sender closed"};
    uint64_t w = word_.load(std::memory_order_acquire);
    uint64_t mine = 0;
    if (is_pending(w)) {  // take the pending block whole once it is free; the next one becomes pending
      const uint32_t i = index(w);
      const uint64_t turn = slots_[i].turn.load(std::memory_order_acquire);
      if ((turn & kGenMask) != gen(w)) {
        SLOTSTREAM_RETURN_IF_ERROR(wait_turn(&spins, deadline));
        continue;
      }
      if (!word_.compare_exchange_weak(w, make(w, turn + 1, uint32_t((turn + 1) % blocks_), kPendingBase),
                                       std::memory_order_seq_cst)) {
        continue;
      }
      mine = turn;
    } else if (!is_open(w)) {  // being sealed by the filler whose record overflowed it
      SLOTSTREAM_RETURN_IF_ERROR(wait_turn(&spins, deadline));
      continue;
    } else {
      const uint64_t t = slots_[index(w)].turn.load(std::memory_order_acquire);
      const bool empty = off(w) == kHead;
      // Empty: take the open block itself. Holding records: seal it and take the next.
      const uint64_t next = empty ? t + 1 : t + 2;
      if (!word_.compare_exchange_weak(w, make(w, next, uint32_t(next % blocks_), kPendingBase),
                                       std::memory_order_seq_cst)) {
        continue;
      }
      mine = empty ? t : t + 1;
      if (!empty) {
        SlotState& s = slots_[t % blocks_];
        s.whole.store(false, std::memory_order_relaxed);
        s.length.store(int64_t(off(w)) - kHead, std::memory_order_seq_cst);
        bool responsible = false;
        sealed_while_free(word_.load(std::memory_order_seq_cst), &responsible);
        if (responsible && helper_) helper_();
      }
    }
    // Our block may still hold its previous ticket (in flight): wait until it is released.
    while (slots_[mine % blocks_].turn.load(std::memory_order_acquire) != mine) {
      if (Status st = wait_turn(&spins, deadline); !st.is_ok()) {
        if (st.code() == Code::kTimeout) abandon(mine);
        return st;
      }
    }
    slots_[mine % blocks_].whole.store(true, std::memory_order_relaxed);
    out->ticket = mine;
    out->index = uint32_t(mine % blocks_);
    out->block = {block(mine) + kHead, block_size_};
    return Status::ok();
  }
}

void SendRing::commit(const Slot& slot, uint32_t length) {
  // seq_cst: the committer then tries the token (an RMW on the word); a holder giving it back
  // (an RMW too) reads this length afterwards — one of the two sees the other.
  slots_[slot.index].length.store(length, std::memory_order_seq_cst);
}

// ---------------------------------------------------------------------------------- token

bool SendRing::give_token() {
  const uint64_t old = word_.fetch_and(~kBits, std::memory_order_seq_cst);
  if (unit_at_cursor()) return true;
  // Records reserved while we held the token, in the open block the cursor has reached: their
  // fillers left them to us.
  return is_open(old) && off(old) > kHead && gen(old) == (cursor() & kGenMask);
}

void SendRing::hand_to_sender() {
  handoff_.store(true, std::memory_order_seq_cst);
  wake_sender();
}

bool SendRing::begin_sleep() {
  word_.fetch_or(kSleeping, std::memory_order_seq_cst);
  // A filler that reserves or commits after this sees the bit and wakes us; one that did before
  // left work that we see now.
  if (!has_work()) return true;
  end_sleep();
  return false;
}

// ------------------------------------------------------------------------------ holder side

bool SendRing::unit_at_cursor() const {
  const uint64_t t = cursor();
  const SlotState& s = slots_[t % blocks_];
  return s.turn.load(std::memory_order_seq_cst) == t && s.length.load(std::memory_order_seq_cst) >= 0;
}

bool SendRing::whole_at_cursor() const {
  const uint64_t t = cursor();
  const SlotState& s = slots_[t % blocks_];
  // `whole` is stored before the commit's seq_cst length store, which unit_at_cursor reads.
  return unit_at_cursor() && s.whole.load(std::memory_order_relaxed);
}

bool SendRing::has_work() const {
  if (unit_at_cursor()) return true;
  const uint64_t w = word_.load(std::memory_order_seq_cst);
  return is_open(w) && off(w) > kHead && gen(w) == (cursor() & kGenMask);
}

bool SendRing::next_unit(Unit* out, bool seal_open) {
  const uint64_t t = cursor();
  SlotState& s = slots_[t % blocks_];
  if (s.turn.load(std::memory_order_acquire) != t) return false;
  if (s.length.load(std::memory_order_acquire) < 0) {
    if (!seal_open) return false;
    // The cursor has reached the open block: the lane has nothing else to send, so its records
    // leave now (no timer). Seal it: OPEN -> PENDING(t + 1).
    uint64_t w = word_.load(std::memory_order_acquire);
    for (;;) {
      if (!is_open(w) || gen(w) != (t & kGenMask) || index(w) != t % blocks_ || off(w) == kHead) return false;
      if (word_.compare_exchange_weak(w, make(w, t + 1, uint32_t((t + 1) % blocks_), kPendingBase),
                                      std::memory_order_seq_cst)) {
        break;
      }
    }
    s.whole.store(false, std::memory_order_relaxed);
    s.length.store(int64_t(off(w)) - kHead, std::memory_order_release);
  }
  walk(t, out);
  return true;
}

// Builds the unit of sealed ticket `t`, waiting for records still being written.
void SendRing::walk(uint64_t t, Unit* out) {
  SlotState& s = slots_[t % blocks_];
  std::byte* b = block(t);
  const auto len = uint32_t(s.length.load(std::memory_order_acquire));
  *out = Unit{.ticket = t};
  if (len == 0) return;
  if (s.whole.load(std::memory_order_relaxed)) {  // committed as written
    *out = Unit{t, b + kHead, len, 1, false};
    return;
  }
  const uint32_t end = kHead + len, i = uint32_t(t % blocks_);
  uint32_t count = 0, real = 0, first_payload = 0;
  for (uint32_t pos = kHead; pos < end; ++count) {
    for (int spin = 0; !flag(i, pos).load(std::memory_order_acquire); ++spin) {
      // A filler reserved this record and is writing it (a copy): spin, then let it run.
      if (aborted_.load(std::memory_order_relaxed)) return;  // the lane is failing: send nothing
      if (spin > 64) std::this_thread::yield();
      if (spin > 100000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // Seen: the flag is cleared for the block's next use now (it is beside the data, not in what
    // is sent, and nothing reserves in a sealed block).
    flag(i, pos).store(0, std::memory_order_relaxed);
    const auto payload = uint32_t(wire::get_le(b + pos + 8, 4));
    if (!(std::to_integer<uint8_t>(b[pos + 1]) & wire::kVoid)) ++real;
    if (count == 0) first_payload = payload;
    pos += uint32_t(wire::packed_record_size(payload));
  }
  if (count == 1) {  // a lone record leaves as it is: the version-1 block of before packing
    if (real == 1) *out = Unit{t, b + kHead, wire::kBlockHeaderSize + first_payload, 1, false};
    return;
  }
  wire::encode_packed_header({count, end}, std::span<std::byte, wire::kPackedHeaderSize>(b, wire::kPackedHeaderSize));
  *out = Unit{t, b, end, real, true};
}

void SendRing::release(uint64_t ticket) {
  SlotState& s = slots_[ticket % blocks_];
  s.whole.store(false, std::memory_order_relaxed);
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
  if (helper_) helper_();                               // and see that it is passed
}

bool SendRing::drained() const {
  if (unit_at_cursor()) return false;
  const uint64_t w = word_.load(std::memory_order_seq_cst);
  const uint64_t t = cursor();
  if (is_open(w)) return off(w) == kHead && gen(w) == (t & kGenMask);
  return is_pending(w) && gen(w) == (t & kGenMask);
}

// ------------------------------------------------------------------------ sending thread

void SendRing::wake_sender() {
  if (!sender_waiting_.load(std::memory_order_seq_cst)) return;
  if (sleeper_.wake) sleeper_.wake();
  std::lock_guard lock(mutex_);
  woken_ = true;
  work_.notify_one();
}

void SendRing::nap(std::chrono::microseconds timeout) {
  std::unique_lock lock(mutex_);
  woken_ = false;
  // Either we see the token given back (or handed to us), or a holder that leaves work sees
  // sender_waiting_ and wakes us (one that leaves nothing lets the nap run out).
  sender_waiting_.store(true, std::memory_order_seq_cst);
  work_.wait_for(lock, timeout, [&] {
    return woken_ || !(word_.load(std::memory_order_seq_cst) & kToken) || handoff_.load() || aborted_.load();
  });
  sender_waiting_.store(false, std::memory_order_relaxed);
}

bool SendRing::wait_work(std::chrono::microseconds spin, std::chrono::microseconds timeout) {
  auto ready = [&] { return has_work() || handoff_.load(std::memory_order_seq_cst); };
  const auto spin_until = std::chrono::steady_clock::now() + spin;
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 15) == 15 && std::chrono::steady_clock::now() >= spin_until) break;
    // On a machine with fewer cores than busy threads, spinning without yielding would keep the
    // very filler we wait for off the CPU.
    if (i >= 16) std::this_thread::yield();
  }
  if (sleeper_.sleep) {
    // Either we see the work, or whoever leaves it sees sender_waiting_ and wakes a sleep that is
    // about to start (the wake is kept until then).
    sender_waiting_.store(true, std::memory_order_seq_cst);
    if (!ready()) sleeper_.sleep(timeout);
  } else {
    std::unique_lock lock(mutex_);
    woken_ = false;
    sender_waiting_.store(true, std::memory_order_seq_cst);
    work_.wait_for(lock, timeout, [&] { return woken_ || ready() || aborted_.load(); });
  }
  sender_waiting_.store(false, std::memory_order_relaxed);
  return ready();
}

void SendRing::abort() {
  aborted_.store(true, std::memory_order_release);
  std::lock_guard lock(mutex_);
  freed_.notify_all();
  work_.notify_all();
}

}  // namespace slotstream::stream
