#include "engine/ucx/protocol/buffered_read.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <thread>

#include "engine/ucx/protocol/mirrored_buffer.h"
#include "wire/block_header.h"
#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

using Clock = std::chrono::steady_clock;

static_assert(std::endian::native == std::endian::little, "ring counters and entry prefixes are stored as-is");
static_assert(RingLayout::kWaitOffset == RingLayout::kTailOffset + 8, "tail and wait flag are read together");
static_assert(RingLayout::kHeadOffset >= RingLayout::kWaitOffset + 8 &&
              RingLayout::kDataOffset >= RingLayout::kHeadOffset + 8);
// A tail read is one get of two words: the tail and the wait flag beside it.
constexpr size_t kTailReadWords = 2;
constexpr size_t kTailReadBytes = kTailReadWords * sizeof(uint64_t);
static_assert(RingLayout::kTailOffset + kTailReadBytes == RingLayout::kWaitOffset + 8);

// Busy sender: its worker is progressed every this many records, so that the receiver's gets and
// head writes are answered where UCX emulates them (tcp) even when the sending thread never idles.
// A progress call on an idle shared-memory worker costs ~50 ns: amortised, ~3 ns per record.
constexpr uint32_t kProgressEvery = 16;
// pipeline=on: span reads in flight at once (besides the tail read).
constexpr size_t kPipelineDepth = 4;
// A pending get keeps the consumer polling (not napping) for this long; after that the consumer's
// idle policy applies (a stopped or slow sender must not cost the receiver a core).
constexpr auto kEagerPoll = std::chrono::milliseconds(1);
// Teardown: how long the receiver waits for its own gets to finish before it leaks their
// destination rather than unmap memory that UCX may still write.
constexpr auto kTeardownGrace = std::chrono::milliseconds(200);

uint64_t round_down8(uint64_t v) { return v / 8 * 8; }

// What both halves are built from: options (same text on both ends) and the geometry.
struct Settings {
  bool pipeline = false;  // keep the next tail read in flight while a span is read and consumed
  uint64_t max_read = 0;  // largest single data get, bytes (0: the whole span)
};

Status parse_settings(const Options& o, Settings* out) {
  SLOTSTREAM_RETURN_IF_ERROR(o.check_known("buffered_read", {"pipeline", "max_read"}));
  SLOTSTREAM_RETURN_IF_ERROR(o.flag("pipeline", false, &out->pipeline));
  SLOTSTREAM_RETURN_IF_ERROR(o.size("max_read", 0, &out->max_read));
  if (out->max_read != 0 && out->max_read < 64) {
    return {Code::kInvalidArgument, "buffered_read: max_read must be at least 64 bytes (or 0: whole spans)"};
  }
  out->max_read = round_down8(out->max_read);  // chunks end on entry-prefix boundaries' alignment
  return Status::ok();
}

Status check_options(const Options& o) {
  Settings s;
  return parse_settings(o, &s);
}

std::atomic_ref<uint64_t> word(std::byte* region, uint64_t offset) {
  return std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(region + offset));
}

// ------------------------------------------------------------------------------------ sender

class BufferedReadSender final : public SenderProtocol {
 public:
  BufferedReadSender(SenderFabric& fabric, std::unique_ptr<fabric::MemoryRegion> region, std::vector<uint8_t> rkey,
                     uint64_t capacity)
      : fabric_(fabric),
        region_(std::move(region)),
        rkey_(std::move(rkey)),
        capacity_(capacity),
        data_(region_->data() + RingLayout::kDataOffset) {}

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u8(RingLayout::kRingVersion);
    w.u64(region_->remote_address());
    w.u64(capacity_);
    w.blob32(rkey_);
    return std::move(w.buffer());
  }

  // Thesis, Sender: "check its head if there is enough space left to write the message to its
  // ring buffer and write to its tail if there is. It also prepends the message size."
  Status transmit_st(const std::byte* src, size_t length, fabric::Request*) override {
    const uint64_t need = RingLayout::entry_size(length);
    if (capacity_ - (tail_ - head_) < need) {
      SLOTSTREAM_RETURN_IF_ERROR(reload_head_st());
      if (capacity_ - (tail_ - head_) < need) {
        WaitTimer wait(stats_);
        SLOTSTREAM_RETURN_IF_ERROR(wait_st([&]() -> Status {
          SLOTSTREAM_RETURN_IF_ERROR(reload_head_st());
          return capacity_ - (tail_ - head_) >= need ? Status::ok() : Status{Code::kInProgress, ""};
        }));
      }
    }
    const uint32_t prefix[2] = {static_cast<uint32_t>(length), static_cast<uint32_t>(tail_)};
    std::memcpy(data_ + tail_ % capacity_, prefix, sizeof prefix);
    RingLayout::Piece pieces[2];
    const int n = RingLayout::split(capacity_, tail_ + RingLayout::kPrefix, length, pieces);
    for (int i = 0, done = 0; i < n; done += int(pieces[i].length), ++i) {
      std::memcpy(data_ + pieces[i].offset, src + done, pieces[i].length);
    }
    tail_ += need;
    // Release: a receiver that reads this tail finds every byte before it written.
    word(region_->data(), RingLayout::kTailOffset).store(tail_, std::memory_order_release);
    ++stats_.records;
    if (++since_progress_ == kProgressEvery) {
      since_progress_ = 0;
      fabric_.worker.progress();
      ++busy_progress_;
    }
    return Status::ok();
  }

  // Everything is delivered once the receiver has freed it all (its head reached our tail).
  // Until then the ring must stay and, over tcp, the worker must answer the receiver's gets.
  Status finish_st() override {
    if (head_ == tail_) return Status::ok();
    return wait_st([&]() -> Status {
      SLOTSTREAM_RETURN_IF_ERROR(reload_head_st());
      return head_ == tail_ ? Status::ok() : Status{Code::kInProgress, ""};
    });
  }

  // sync_ops: loads of the head the receiver writes (a local read: the sender issues no network
  // operation). Counters: busy_progress (worker progressed while busy, see kProgressEvery),
  // ring_bytes (entry bytes written, prefixes and padding included).
  ProtocolStats stats() const override {
    ProtocolStats s = stats_;
    s.counters["busy_progress"] = busy_progress_;
    s.counters["ring_bytes"] = tail_;
    return s;
  }

 private:
  // The receiver writes the head with a one-sided put (shm: its CPU stores into our region; tcp:
  // our worker applies it during progress). Anything that is not a possible head is an error.
  Status reload_head_st() {
    ++stats_.sync_ops;
    const uint64_t head = word(region_->data(), RingLayout::kHeadOffset).load(std::memory_order_acquire);
    if (head < head_ || head > tail_ || head % 8 != 0) {
      return {Code::kProtocolError, "buffered_read: the receiver wrote an impossible ring head (" +
                                        std::to_string(head) + "; tail " + std::to_string(tail_) + ")"};
    }
    head_ = head;
    return Status::ok();
  }

  // Polls `check` (kInProgress: not yet) with the common back-off, progressing the worker (tcp:
  // that applies the receiver's head writes and answers its gets) and sleeping on its event fd.
  // Meanwhile the wait flag asks the receiver for its head (it writes it back otherwise only when
  // a quarter of the ring is free).
  template <typename Check>
  Status wait_st(Check check) {
    Status st = check();
    if (st.code() != Code::kInProgress) return st;
    word(region_->data(), RingLayout::kWaitOffset).store(1, std::memory_order_release);
    for (PollBackoff backoff;; backoff.pause(fabric_.worker)) {
      st = check();
      if (st.code() != Code::kInProgress) break;
      if (fabric_.worker.progress() != 0) backoff.reset();
      if (st = fabric_.alive(); !st.is_ok()) break;
      if (fabric_.endpoint.failed()) {
        st = {Code::kPeerGone, "receiver unreachable"};
        break;
      }
    }
    word(region_->data(), RingLayout::kWaitOffset).store(0, std::memory_order_release);
    return st;
  }

  SenderFabric& fabric_;
  std::unique_ptr<fabric::MemoryRegion> region_;
  std::vector<uint8_t> rkey_;
  const uint64_t capacity_;
  std::byte* const data_;
  uint64_t tail_ = 0;  // what we published
  uint64_t head_ = 0;  // what we last read of the receiver's head
  uint32_t since_progress_ = 0;
  uint64_t busy_progress_ = 0;
  ProtocolStats stats_;
};

// ---------------------------------------------------------------------------------- receiver

// The active side. Its worker is this session's own (Descriptor::receiver_progress), progressed
// only by the session's consumer thread (progress(), wait()): the gets it issues complete there,
// and nothing here needs a lock.
class BufferedReadReceiver final : public ReceiverProtocol {
 public:
  BufferedReadReceiver(ReceiverFabric& fabric, const Settings& settings, std::unique_ptr<MirroredBuffer> mirror,
                       std::unique_ptr<fabric::MemoryRegion> registration)
      : worker_(fabric.worker),
        settings_(settings),
        geometry_(fabric.geometry),
        capacity_(RingLayout::capacity(fabric.geometry)),
        mirror_(std::move(mirror)),
        registration_(std::move(registration)),
        tail_buf_(new uint64_t[kTailReadWords]{0, 0}),
        head_buf_(new uint64_t(0)) {}

  ~BufferedReadReceiver() override {
    // A get still running writes into the mirror (a head write reads head_buf_): give them a
    // moment — the sender answers until we close the connection (src/engine/ucx/session/sender_lane_send.cc,
    // SenderLane::fin) — then leave the memory UCX may still touch to the worker (only when the sender stopped
    // answering but did not die: a dead one fails them).
    const auto deadline = Clock::now() + kTeardownGrace;
    auto done = [](fabric::Request& r) { return r.check().code() != Code::kInProgress; };
    while (Clock::now() < deadline) {
      if (tail_pending_ && done(tail_req_)) tail_pending_ = false;
      while (!inflight_.empty() && done(inflight_.front().req[0]) && done(inflight_.front().req[1]))
        inflight_.pop_front();
      if (head_req_.pending()) (void)done(head_req_);
      if (!pending()) break;
      worker_.progress();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (pending()) {
      // The registration goes (UCX must not find it at cleanup); the memory a late get may still
      // write stays with the worker, freed after UCX ends every request, as other protocols'
      // stuck headers are (Worker::keep_until_destroyed). The key an operation still uses stays
      // for good: UCX destroys keys only after their operations, and through their worker.
      worker_.keep_until_destroyed(std::move(mirror_));
      worker_.keep_until_destroyed(std::move(tail_buf_));
      worker_.keep_until_destroyed(std::move(head_buf_));
      (void)rkey_.release();
    }
  }

  std::vector<uint8_t> setup() const override { return {}; }  // the receiver exposes nothing

  Status connect(const PeerSetup& peer) override {
    if (peer.endpoint == nullptr) return {Code::kProtocolError, "buffered_read needs an endpoint to the sender"};
    wire::Reader r(peer.setup);
    const uint8_t version = r.u8();
    ring_ = r.u64();
    const uint64_t capacity = r.u64();
    std::vector<uint8_t> packed = r.blob32(peer.setup.size());
    if (!r.ok() || !r.at_end()) return {Code::kProtocolError, "malformed buffered_read set-up from the sender"};
    if (version != RingLayout::kRingVersion) {
      return {Code::kVersionMismatch, "buffered_read ring version " + std::to_string(version) +
                                          " (this receiver: " + std::to_string(RingLayout::kRingVersion) + ")"};
    }
    if (capacity != capacity_) {
      return {Code::kProtocolError, "buffered_read ring of " + std::to_string(capacity) + " bytes, expected " +
                                        std::to_string(capacity_) + " for this geometry"};
    }
    endpoint_ = peer.endpoint;
    return fabric::RemoteKey::unpack(*endpoint_, packed, &rkey_);
  }

  // Thesis, Receiver: records already fetched are served from the local copy; when there are none
  // left, read the remote tail, and once it moved, read the whole span up to it.
  void poll(std::vector<Record>* out) override {
    advance_st();
    const uint64_t first = tracker_.first_id();
    const uint64_t block_entry = RingLayout::entry_size(geometry_.block_size);
    for (uint64_t id = first; id < first + tracker_.outstanding(); ++id) {
      const ReleaseTracker::Entry& e = tracker_.entry(id);
      if (e.released) continue;
      // The mirror makes a record that passes the end of the ring one contiguous span.
      out->push_back({id,
                      static_cast<uint32_t>((e.pos % capacity_) / block_entry),
                      {mirror_->at(e.pos + RingLayout::kPrefix), e.length}});
    }
  }

  void release(uint64_t id) override {
    if (!tracker_.release(id)) return;
    // Written back now and then: once a quarter of the ring is free, or when the sender says it
    // waits (on_tail_st).
    if (tracker_.head() - published_ >= capacity_ / 4) publish_head_st();
  }

  // Completions of our gets arrive through the worker (tcp: emulated by the sender's worker).
  bool progress() override {
    if (!pending()) return false;
    const bool worked = worker_.progress() != 0;
    // Tail reads that keep finding the tail where it was are not work: the consumer may then nap
    // (its wait() wakes at the next reply), or an idle connection would read the tail in a tight
    // loop — a core on each side over tcp, where the sender's worker answers every read.
    if (idle_tail_) return false;
    return worked || Clock::now() - issued_at_ < kEagerPoll;
  }

  // Idle: a get's reply over tcp wakes the consumer (the worker's event fd) before `max` passes.
  // Once the tail stopped moving, the nap is taken in full: the reply to the tail read in flight
  // would end it at once, and an idle connection would then cost a round trip per wake-up.
  void wait(std::chrono::microseconds max) override {
    const auto until = Clock::now() + max;
    (void)worker_.wait_for_event(max);
    if (idle_tail_) std::this_thread::sleep_until(until);
  }

  uint64_t max_records() const override { return capacity_ / RingLayout::entry_size(wire::kBlockHeaderSize); }

  // records: entries fetched. sync_ops: tail reads + head writes. sync_op_samples_ns: one per tail
  // read, issue to completion. Counters: reads / bytes_read (data gets and their bytes: the mean
  // transfer size is bytes_read / reads), tail_reads, tail_reads_unchanged, head_writes,
  // protocol_errors (a ring the sender could not have written, or a failed get: reading stops).
  ProtocolStats stats() const override {
    ProtocolStats s = stats_;
    s.sync_ops = tail_reads_ + head_writes_;
    s.counters["reads"] = reads_;
    s.counters["bytes_read"] = bytes_read_;
    s.counters["tail_reads"] = tail_reads_;
    s.counters["tail_reads_unchanged"] = tail_unchanged_;
    s.counters["head_writes"] = head_writes_;
    s.counters["protocol_errors"] = errors_;
    return s;
  }

 private:
  struct Read {
    uint64_t end = 0;  // ring position up to which this read brings the data
    fabric::Request req[2];
  };

  bool pending() const { return tail_pending_ || !inflight_.empty() || head_req_.pending(); }

  void fail_st() {
    broken_ = true;
    ++errors_;
  }

  // Issues what may be issued now and takes in what completed, until nothing more can happen in
  // this pass. On shared memory every get completes inside the call, so one pass reads the tail,
  // reads the span and parses it.
  void advance_st() {
    bool tail_read_issued = false;
    const uint64_t parsed_before = parsed_;
    while (!broken_ && rkey_) {
      reap_st();
      if (broken_) return;
      // Everything known is requested: read the tail again. Without pipelining only when the wire
      // is quiet and the records of the last span were handed out (the thesis's one read at a
      // time: the next tail read waits until they are consumed); with it, while spans are still
      // in flight and before their records are consumed.
      const bool quiet = inflight_.empty() && !tail_pending_;
      const bool may_read_tail = settings_.pipeline || (quiet && parsed_ == parsed_before);
      if (!tail_pending_ && !tail_read_issued && requested_ == tail_seen_ && may_read_tail) {
        issue_tail_read_st();
        tail_read_issued = true;
        continue;
      }
      if (tail_seen_ > requested_ && (settings_.pipeline ? inflight_.size() < kPipelineDepth : quiet)) {
        issue_reads_st();
        continue;
      }
      return;
    }
  }

  void issue_tail_read_st() {
    ++tail_reads_;
    tail_issued_ = issued_at_ = Clock::now();
    tail_pending_ = true;
    if (!endpoint_->get(tail_buf_.get(), kTailReadBytes, ring_ + RingLayout::kTailOffset, *rkey_, &tail_req_).is_ok())
      fail_st();
  }

  // [requested_, tail_seen_) in gets of at most max_read bytes, each split where the ring wraps;
  // the local copy is contiguous (mirrored), so a get that wraps remotely lands in one piece.
  void issue_reads_st() {
    issued_at_ = Clock::now();
    while (requested_ < tail_seen_) {
      if (settings_.pipeline && inflight_.size() >= kPipelineDepth) return;
      uint64_t len = tail_seen_ - requested_;
      if (settings_.max_read != 0) len = std::min(len, settings_.max_read);
      Read& r = inflight_.emplace_back();
      r.end = requested_ + len;
      RingLayout::Piece pieces[2];
      const int n = RingLayout::split(capacity_, requested_, len, pieces);
      std::byte* dst = mirror_->at(requested_);
      for (int i = 0; i < n; dst += pieces[i].length, ++i) {
        ++reads_;
        bytes_read_ += pieces[i].length;
        if (!endpoint_
                 ->get(dst, pieces[i].length, ring_ + RingLayout::kDataOffset + pieces[i].offset, *rkey_, &r.req[i])
                 .is_ok()) {
          fail_st();
          return;
        }
      }
      requested_ = r.end;
    }
  }

  // Completed tail read and span reads (in ring order) are taken in.
  void reap_st() {
    if (tail_pending_) {
      Status st = tail_req_.check();
      if (st.code() != Code::kInProgress) {
        tail_pending_ = false;
        if (!st.is_ok()) return fail_st();
        add_sample(stats_.sync_op_samples_ns,
                   std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - tail_issued_).count());
        on_tail_st(tail_buf_[0], tail_buf_[1] != 0);
      }
    }
    while (!inflight_.empty()) {
      Read& r = inflight_.front();
      Status st0 = r.req[0].check();
      Status st1 = r.req[1].check();
      if (st0.code() == Code::kInProgress || st1.code() == Code::kInProgress) break;
      if (!st0.is_ok() || !st1.is_ok()) return fail_st();
      arrived_ = r.end;
      inflight_.pop_front();
      parse_st();
      if (broken_) return;
    }
    if (head_req_.pending()) {
      Status st = head_req_.check();
      if (st.code() != Code::kInProgress && !st.is_ok()) return fail_st();
    }
  }

  void on_tail_st(uint64_t tail, bool sender_waits) {
    // The sender can have written at most a ring's worth past the head we gave it.
    if (tail < tail_seen_ || tail % 8 != 0 || tail - tracker_.head() > capacity_) return fail_st();
    idle_tail_ = tail == tail_seen_;
    if (idle_tail_) ++tail_unchanged_;
    tail_seen_ = tail;
    // The sender waits for space (or to finish): give it what we freed since the last write.
    if (sender_waits && tracker_.head() > published_) publish_head_st();
  }

  // Entries that arrived whole become records. Each is checked against what the sender could
  // have written: its position check, a length of at most one block, and its end within the tail.
  void parse_st() {
    while (parsed_ < arrived_) {
      uint32_t prefix[2];
      std::memcpy(prefix, mirror_->at(parsed_), sizeof prefix);
      const uint64_t size = RingLayout::entry_size(prefix[0]);
      if (prefix[1] != static_cast<uint32_t>(parsed_) || prefix[0] > geometry_.block_size ||
          parsed_ + size > tail_seen_) {
        return fail_st();
      }
      if (parsed_ + size > arrived_) return;  // the rest comes with the next read (max_read)
      tracker_.push(static_cast<uint32_t>(size), prefix[0]);
      parsed_ += size;
      ++stats_.records;
    }
  }

  void publish_head_st() {
    if (!rkey_ || broken_) return;
    if (head_req_.pending() && head_req_.check().code() == Code::kInProgress) return;  // next time
    *head_buf_ = tracker_.head();
    if (!endpoint_->put(head_buf_.get(), 8, ring_ + RingLayout::kHeadOffset, *rkey_, &head_req_).is_ok()) {
      return fail_st();
    }
    published_ = tracker_.head();
    ++head_writes_;
  }

  fabric::Worker& worker_;
  const Settings settings_;
  const Geometry geometry_;
  const uint64_t capacity_;
  std::unique_ptr<MirroredBuffer> mirror_;
  std::unique_ptr<fabric::MemoryRegion> registration_;  // the mirror, registered as a get destination
  fabric::Endpoint* endpoint_ = nullptr;                // to the sender's worker; outlives this object
  std::unique_ptr<fabric::RemoteKey> rkey_;
  uint64_t ring_ = 0;  // the sender's region address

  ReleaseTracker tracker_;  // parsed entries; its head is the receiver's head
  uint64_t parsed_ = 0;     // read pointer: entries before it are records
  uint64_t arrived_ = 0;    // data before it is in the local copy
  uint64_t requested_ = 0;  // data before it has been asked for
  uint64_t tail_seen_ = 0;  // the cached remote tail
  uint64_t published_ = 0;  // the head the sender knows
  bool broken_ = false;

  std::unique_ptr<uint64_t[]> tail_buf_;  // a tail read lands here: tail, wait flag
  fabric::Request tail_req_;
  bool idle_tail_ = false;  // the last tail read found nothing new
  bool tail_pending_ = false;
  Clock::time_point tail_issued_{};
  Clock::time_point issued_at_{};
  std::deque<Read> inflight_;           // data reads in flight, in ring order
  std::unique_ptr<uint64_t> head_buf_;  // a head write's source: stays put until it completes
  fabric::Request head_req_;

  uint64_t reads_ = 0, bytes_read_ = 0, tail_reads_ = 0, tail_unchanged_ = 0, head_writes_ = 0, errors_ = 0;
  ProtocolStats stats_;
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options& options,
                   std::unique_ptr<SenderProtocol>* out) {
  Settings settings;
  SLOTSTREAM_RETURN_IF_ERROR(parse_settings(options, &settings));
  if (!setup.empty()) return {Code::kProtocolError, "unexpected buffered_read set-up from the receiver"};
  const uint64_t capacity = RingLayout::capacity(fabric.geometry);
  // UCX allocates the ring: on shared memory that is what lets the receiver's gets and head
  // writes complete without this process (UCX-NOTES, passivity).
  fabric::ExposedRegion region;
  if (Status st = fabric::MemoryRegion::allocate_exposed(fabric.context, RingLayout::kDataOffset + capacity, &region);
      !st.is_ok()) {
    return {st.code(), "buffered_read: the exposed ring (--blocks x --block-size): " + st.message()};
  }
  out->reset(new BufferedReadSender(fabric, std::move(region.region), std::move(region.rkey), capacity));
  return Status::ok();
}

// The local copy is capacity() rounded up to whole pages, so it may exceed the receiver's memory
// budget for this geometry (blocks x block_size + blocks) by 8 bytes of prefix and up to 7 of
// padding per block, plus under a page.
Status make_receiver(ReceiverFabric& fabric, const Options& options, std::unique_ptr<ReceiverProtocol>* out) {
  Settings settings;
  SLOTSTREAM_RETURN_IF_ERROR(parse_settings(options, &settings));
  std::unique_ptr<MirroredBuffer> mirror;
  SLOTSTREAM_RETURN_IF_ERROR(MirroredBuffer::create(RingLayout::capacity(fabric.geometry), &mirror));
  // Shared memory and tcp copy into any memory; an RDMA NIC only into registered memory.
  std::unique_ptr<fabric::MemoryRegion> registration;
  SLOTSTREAM_RETURN_IF_ERROR(
      fabric::MemoryRegion::map(fabric.context, mirror->data(), 2 * mirror->size(), &registration));
  out->reset(new BufferedReadReceiver(fabric, settings, std::move(mirror), std::move(registration)));
  return Status::ok();
}

}  // namespace

int RingLayout::split(uint64_t capacity, uint64_t pos, uint64_t length, Piece out[2]) {
  if (length == 0) return 0;
  const uint64_t offset = pos % capacity;
  const uint64_t first = std::min(length, capacity - offset);
  out[0] = {offset, first};
  if (first == length) return 1;
  out[1] = {0, length - first};
  return 2;
}

uint64_t ReleaseTracker::push(uint32_t size, uint32_t length) {
  entries_.push_back({end_, size, length, false});
  end_ += size;
  return first_id_ + entries_.size() - 1;
}

bool ReleaseTracker::release(uint64_t id) {
  if (id < first_id_ || id - first_id_ >= entries_.size()) return false;
  Entry& e = entries_[id - first_id_];
  if (e.released) return false;
  e.released = true;
  while (!entries_.empty() && entries_.front().released) {
    head_ += entries_.front().size;
    entries_.pop_front();
    ++first_id_;
  }
  return true;
}

const Descriptor kBufferedRead = {
    .name = "buffered_read",
    .summary =
        "thesis (Buffered Read): a passive sender only copies into its own ring; the receiver reads the "
        "ring's tail and pulls each new span with one RDMA get, frees out of order and writes the head back "
        "now and then (the sender is passive on shm; over tcp its worker answers the gets)",
    .options_help =
        "pipeline=on|off: read the next tail while a span is read and consumed, up to 4 reads in "
        "flight (default off, the thesis's one read at a time); max_read=SIZE: largest single get "
        "(default 0: the whole span)",
    .receiver_progress = true,
    .receiver_endpoint = true,
    .sender_wakeup = true,
    .check_options = check_options,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
