// CARC, cache-aware I/O rate control (Li et al., "Cache-Aware I/O Rate Control for RDMA",
// iSing Lab@HKUST, slides): credits counted in bytes and sized to the receiver's cache, spent
// before sending and given back only after the receiver has *processed* the data.
//
// The slides' model: an RNIC writes incoming data into the last-level cache (DDIO); when more
// unprocessed data arrives than that cache share holds, new data evicts old, and the application
// then reads its data from DRAM (the "I/O congestion" of their states S3/S4). CARC keeps the
// unprocessed bytes in flight within the cache: "server allocates credits upon connection
// establishment; clients consume credits before send data; server replenishes credits ... after
// finishing processing data".
//
// Here: the receiver sizes the budget (option `budget=SIZE`, default its core's share of the
// last-level cache read from /sys/devices/system/cpu/cpu0/cache) and sends it in its set-up. The
// data path is credit's (posted_receives.h: tagged sends into N pre-posted receive buffers), so
// that carc and credit differ only in what CARC changes: the sender debits each message's bytes
// (and one of the N buffers) before sending; the receiver, after the consumer has released a
// record — i.e. the sink has processed it — puts its cumulative processed counters into a word
// the sender exposes (sender set-up bytes in SETUP, Descriptor::receiver_endpoint). The sender
// reads that word in its own memory; it never asks.
//
// Shared memory has no DDIO: the sender's CPU copies the data into the receiver's buffers, so
// it sits in the caches of the sending core and in the shared L3, and "cache" here means the
// receiving core's share of L2/L3, not an I/O-reserved slice of the LLC (docs/design.md).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "engine/ucx/protocol/protocol.h"

namespace slotstream::protocol {

// The sender's budget, independent of UCX so it can be unit-tested. Counters are cumulative and
// modular (they may wrap at 2^64). Threading: the sending thread only.
class ByteBudget {
 public:
  ByteBudget(uint64_t budget, uint32_t buffers, uint64_t start_bytes = 0, uint64_t start_records = 0)
      : budget_(budget),
        buffers_(buffers),
        sent_bytes_(start_bytes),
        sent_records_(start_records),
        processed_bytes_(start_bytes),
        processed_records_(start_records) {}
  // A message of `length` bytes fits: its bytes within the budget of unprocessed bytes, and a
  // posted buffer free for it (the receiver has N).
  bool fits(uint64_t length) const { return bytes_fit(length) && outstanding_records() < buffers_; }
  bool bytes_fit(uint64_t length) const { return length <= budget_ - outstanding_bytes(); }
  // Debits a message before it is sent (call only when fits()).
  void debit(uint64_t length) {
    sent_bytes_ += length;
    ++sent_records_;
  }
  // The receiver's cumulative processed counters. Returns whether they advanced; counters that
  // go back (an old value) or claim more than was sent change nothing.
  bool replenish(uint64_t processed_bytes, uint64_t processed_records);
  uint64_t outstanding_bytes() const { return sent_bytes_ - processed_bytes_; }
  uint64_t outstanding_records() const { return sent_records_ - processed_records_; }
  uint64_t budget() const { return budget_; }

 private:
  uint64_t budget_;
  uint32_t buffers_;
  uint64_t sent_bytes_;
  uint64_t sent_records_;
  uint64_t processed_bytes_;
  uint64_t processed_records_;
};

// The replenishment word the receiver puts into the sender's memory, 24 bytes, little-endian:
//
//   0        8        16       24
//   +--------+--------+--------+
//   | records| bytes  | records|   processed records, processed bytes (cumulative), records again
//   +--------+--------+--------+
//
// The sender reads it while the receiver's put may be landing. Each put carries a larger record
// count than the one before, so a read that caught half of a put sees two different record
// counts and is ignored (the next read gets the whole word) — whichever end the copy starts at.
inline constexpr size_t kProcessedWordSize = 24;
void encode_processed(uint64_t records, uint64_t bytes, std::span<std::byte, kProcessedWordSize> out);
// False when the two record counts differ (a torn read).
bool decode_processed(std::span<const std::byte, kProcessedWordSize> in, uint64_t* records, uint64_t* bytes);

// The receiving core's share of its last-level cache, from a sysfs cache directory
// (/sys/devices/system/cpu/cpu0/cache): the highest-level data or unified cache's size divided
// by the CPUs that share it. 0 when the directory says nothing usable. `how` (optional) says
// what was found, for logs and --help. Any thread.
uint64_t cache_share_bytes(const std::string& cache_dir, std::string* how = nullptr);

extern const Descriptor kCarc;

}  // namespace slotstream::protocol
