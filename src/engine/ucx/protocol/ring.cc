#include "engine/ucx/protocol/ring.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <map>
#include <string>

#include "clock.h"
#include "engine/ucx/protocol/reply_queue.h"
#include "random.h"
#include "wire/block_header.h"
#include "wire/codec.h"

namespace slotstream::protocol {

static_assert(std::endian::native == std::endian::little, "AM headers are copied as little-endian structs");

// ----------------------------------------------------------------------------- RingSpace

bool RingSpace::freed(uint64_t freed) {
  if (freed <= head_ || freed > tail_) return false;
  head_ = freed;
  return true;
}

// ------------------------------------------------------------------------- CoalesceBuffer

uint64_t CoalesceBuffer::append(uint32_t length) {
  const uint64_t at = end_;
  end_ += length;
  lengths_.push_back(length);
  return at;
}

uint64_t CoalesceBuffer::run(uint64_t limit, size_t* count) const {
  uint64_t bytes = 0;
  size_t n = 0;
  for (uint32_t len : lengths_) {
    if (bytes + len > limit) break;
    bytes += len;
    ++n;
  }
  *count = n;
  return bytes;
}

void CoalesceBuffer::sent(uint64_t bytes, size_t count) {
  sent_ += bytes;
  lengths_.erase(lengths_.begin(), lengths_.begin() + static_cast<std::ptrdiff_t>(count));
}

void CoalesceBuffer::reset() {
  if (!empty()) return;
  sent_ = 0;
  end_ = 0;
}

// --------------------------------------------------------------------------- split_records

void split_records(std::span<const std::byte> segment, std::vector<std::span<const std::byte>>* out) {
  out->clear();
  while (!segment.empty()) {
    size_t length = segment.size();  // unless a valid header says otherwise: the rest is one bad record
    if (segment.size() >= wire::kBlockHeaderSize) {
      // A packed unit (the stream layer's, pack=on) is one record here: the stream layer unpacks it.
      if (auto p = wire::decode_packed_header(segment.first<wire::kPackedHeaderSize>(), segment.size())) {
        length = p->length;
      } else if (auto h = wire::decode_block_header(segment.first<wire::kBlockHeaderSize>(),
                                                    segment.size() - wire::kBlockHeaderSize)) {
        length = wire::kBlockHeaderSize + h->payload_length;
      }
    }
    out->push_back(segment.first(length));
    segment = segment.subspan(length);
  }
}

// ------------------------------------------------------------------------------ RingLedger

const char* RingLedger::verdict_name(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kWrongPosition:
      return "wrong_position";
    case Verdict::kEmpty:
      return "empty";
    case Verdict::kCrossesEnd:
      return "crosses_end";
    case Verdict::kBadPadding:
      return "bad_padding";
    case Verdict::kOverrun:
      return "overrun";
    case Verdict::kOverWindow:
      return "over_window";
    case Verdict::kNoCredit:
      return "no_credit";
  }
  return "?";
}

RingLedger::RingLedger(uint64_t bytes, uint64_t window) : bytes_(bytes), window_(window) {
  outstanding_ = initial_credits();
}

RingLedger::Verdict RingLedger::accept(uint64_t position, uint64_t length, bool padding) {
  if (position != tail_) return Verdict::kWrongPosition;
  const uint64_t to_end = bytes_ - tail_ % bytes_;
  if (padding) {
    // A wrap marker at offset 0 would pad a whole empty lap: never needed, so never valid.
    if (length != to_end || length == bytes_) return Verdict::kBadPadding;
  } else {
    if (length == 0) return Verdict::kEmpty;
    if (length > to_end) return Verdict::kCrossesEnd;
  }
  if (used() + length > bytes_) return Verdict::kOverrun;
  if (window_) {
    if (length > window_) return Verdict::kOverWindow;
    if (outstanding_ == 0) return Verdict::kNoCredit;
    --outstanding_;  // SDP §4.1: each segment consumes one posted receive
  }
  tail_ += length;
  if (padding) {
    entries_.push_back({static_cast<uint32_t>(length), true});
    filled_ = tail_;
    advance();
  }
  return Verdict::kOk;
}

uint64_t RingLedger::add_record(uint64_t position, uint32_t length) {
  (void)position;  // records follow each other: position == filled_ (the caller splits in order)
  entries_.push_back({length, false});
  filled_ += length;
  return first_entry_ + entries_.size() - 1;
}

bool RingLedger::released(uint64_t id) const {
  if (id < first_entry_) return true;
  const uint64_t i = id - first_entry_;
  return i >= entries_.size() || entries_[i].released;
}

bool RingLedger::release(uint64_t id) {
  if (id < first_entry_ || id - first_entry_ >= entries_.size()) return false;
  Entry& e = entries_[id - first_entry_];
  if (e.released) return false;
  e.released = true;
  advance();
  return true;
}

void RingLedger::advance() {
  // A ring frees in order: the head moves over the released prefix only.
  while (!entries_.empty() && entries_.front().released) {
    head_ += entries_.front().length;
    entries_.pop_front();
    ++first_entry_;
  }
}

uint64_t RingLedger::grant() {
  if (window_ == 0) return 0;
  // SDP §4.1: a receive is posted only when a whole virtual window W of free space is there
  // beyond what the outstanding ones already promise.
  uint64_t n = 0;
  while (bytes_ - used() >= (outstanding_ + 1) * window_) {
    ++outstanding_;
    ++granted_;
    ++n;
  }
  return n;
}

// ------------------------------------------------------------------------------ PutTracker

void PutTracker::add(fabric::Request req) {
  if (req.pending()) pending_.push_back(std::move(req));
}

Status PutTracker::all_done(bool* done) {
  Status first;
  auto it = std::remove_if(pending_.begin(), pending_.end(), [&](fabric::Request& r) {
    Status st = r.check();
    if (st.code() == Code::kInProgress) return false;
    if (!st.is_ok() && first.is_ok()) first = st;
    return true;
  });
  pending_.erase(it, pending_.end());
  *done = pending_.empty();
  return first;
}

// ------------------------------------------------------------------------------- Coalescer

Status Coalescer::add(const std::byte* src, uint32_t length, bool* added) {
  SLOTSTREAM_RETURN_IF_ERROR(reclaim());
  *added = buffer_.fits(length);
  if (*added) std::memcpy(memory_.data() + buffer_.append(length), src, length);
  return Status::ok();
}

Status Coalescer::write_run(RingWire& wire, RingSpace& space, uint64_t limit, uint64_t* bytes, RingCounters* counters) {
  size_t count = 0;
  *bytes = buffer_.run(std::min({limit, space.to_end(), kMaxSegment}), &count);
  if (*bytes == 0) return Status::ok();
  fabric::Request req;
  SLOTSTREAM_RETURN_IF_ERROR(
      wire.write(memory_.data() + buffer_.front_offset(), static_cast<uint32_t>(*bytes), space.take(*bytes), &req));
  puts_.add(std::move(req));
  buffer_.sent(*bytes, count);
  ++counters->coalesced_writes;
  counters->coalesced_bytes += *bytes;
  return reclaim();
}

Status Coalescer::reclaim() {
  if (!buffer_.empty() || buffer_.front_offset() == 0) return Status::ok();
  bool done = false;
  SLOTSTREAM_RETURN_IF_ERROR(puts_.all_done(&done));
  if (done) buffer_.reset();
  return Status::ok();
}

// ----------------------------------------------------------------------------- set-up

Status parse_ring_setup(std::span<const uint8_t> setup, RingSetup* out) {
  wire::Reader r(setup);
  RingSetup s;
  s.address = r.u64();
  s.session = r.u64();
  s.bytes = r.u64();
  s.window = r.u64();
  s.rkey = r.blob32(setup.size());
  if (!r.ok() || !r.at_end() || s.bytes == 0) return {Code::kProtocolError, "malformed ring set-up from receiver"};
  *out = std::move(s);
  return Status::ok();
}

// -------------------------------------------------------------------------------- RingLink

Status RingLink::create(SenderFabric& fabric, const RingSetup& setup, AckHandler on_ack,
                        std::unique_ptr<RingLink>* out) {
  std::unique_ptr<RingLink> link(new RingLink(fabric, setup));
  SLOTSTREAM_RETURN_IF_ERROR(fabric::RemoteKey::unpack(fabric.endpoint, setup.rkey, &link->rkey_));
  link->on_ack_ = std::move(on_ack);
  RingLink* self = link.get();
  // ACKs are active messages: UCX runs the handler inside progress of the sending thread's worker.
  SLOTSTREAM_RETURN_IF_ERROR(fabric.worker.set_am_handler(
      kRingAckAm,
      [self](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp) {
        const uint64_t now = now_ns();
        if (header.size() != sizeof(RingAck)) {
          ++self->acks_ignored_;
          return;
        }
        RingAck ack;
        std::memcpy(&ack, header.data(), sizeof ack);
        self->on_ack_(ack, now);
      },
      &link->ack_handler_));
  *out = std::move(link);
  return Status::ok();
}

// The Sender destroys its protocol before its endpoint, whose close still progresses the worker:
// ack_handler_ unhooks the ACK handler (it points at this object); the headers of notices that
// are still queued to UCX (only when the receiver stopped answering) are left to UCX.
RingLink::~RingLink() {
  reap();
  if (!pending_.empty()) (void)new std::deque<Pending>(std::move(pending_));  // a move keeps element addresses
}

Status RingLink::write(const std::byte* src, uint32_t length, uint64_t position, fabric::Request* req) {
  SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.put(src, length, setup_.address + position % setup_.bytes, *rkey_, req));
  return notify(position, length, 0);
}

Status RingLink::pad(uint64_t position, uint32_t length) { return notify(position, length, kNoticePadding); }

Status RingLink::notify(uint64_t position, uint32_t length, uint32_t flags) {
  // SDP §3.1 places data with RDMA write-with-immediate. UCP has none: as in sliding_window, the
  // put is followed by an active message carrying (position, length) — the "immediate". The fence
  // keeps the notice behind the data, and behind every earlier notice: the receiver requires them
  // in ring order.
  SLOTSTREAM_RETURN_IF_ERROR(fabric_.worker.fence());
  pending_.push_back({fabric::Request(), RingNotice{setup_.session, position, length, flags}});
  Pending& p = pending_.back();
  Status st = fabric_.endpoint.am_send(kRingNoticeAm, &p.notice, sizeof(RingNotice), nullptr, 0,
                                       /*want_reply=*/true, &p.req);
  if (!p.req.pending()) {
    pending_.pop_back();  // sent inline: UCX no longer needs the header
  } else {
    fabric_.worker.progress();  // queued (e.g. the receiver's FIFO is full): push it along now
  }
  SLOTSTREAM_RETURN_IF_ERROR(st);
  ++notices_;
  if (pending_.size() > 64) reap();
  return Status::ok();
}

Status RingLink::allocate(size_t bytes, std::unique_ptr<fabric::MemoryRegion>* out) {
  return fabric::MemoryRegion::allocate(fabric_.context, std::max<size_t>(bytes, 1), out);
}

void RingLink::reap() {
  while (!pending_.empty() && pending_.front().req.check().code() != Code::kInProgress) pending_.pop_front();
}

// ------------------------------------------------------------------------------ RingSender

Status RingSender::connect(const RingSetup& setup) {
  return RingLink::create(
      fabric_, setup, [this](const RingAck& ack, uint64_t now) { on_ack(ack, now); }, &link_);
}

void RingSender::on_ack(const RingAck& ack, uint64_t now) {
  if (!apply_ack(ack)) {
    ++acks_ignored_;
    return;
  }
  ++stats_.sync_ops;
  if (now > ack.generated_ns) add_sample(stats_.sync_op_samples_ns, now - ack.generated_ns);
}

Status RingSender::check_alive() {
  SLOTSTREAM_RETURN_IF_ERROR(fabric_.alive());
  if (fabric_.endpoint.failed()) return {Code::kPeerGone, "receiver unreachable"};
  return Status::ok();
}

ProtocolStats RingSender::ring_stats(const RingCounters& c) const {
  ProtocolStats s = stats_;
  s.counters["direct_writes"] = c.direct_writes;
  s.counters["coalesced_records"] = c.coalesced_records;
  s.counters["coalesced_writes"] = c.coalesced_writes;
  s.counters["coalesced_bytes"] = c.coalesced_bytes;
  s.counters["wrap_markers"] = c.wrap_markers;
  s.counters["idle_writes"] = idle_writes_;
  s.counters["notices_sent"] = link_->notices();
  s.counters["acks_ignored"] = acks_ignored_ + link_->acks_ignored();
  return s;
}

Status sender_buffer_size(std::string_view protocol, uint64_t option, const Geometry& g, uint64_t* out) {
  *out = option ? option : g.bytes();
  if (*out < g.block_size) {
    return {Code::kInvalidArgument, std::string(protocol) + ": buffer=" + std::to_string(*out) +
                                        " is smaller than one block (" + std::to_string(g.block_size) +
                                        " B): a record could never be coalesced"};
  }
  return Status::ok();
}

// ---------------------------------------------------------------------------- the receiver

namespace {

// The receiver side. Its worker is this session's own (Descriptor::receiver_progress), progressed
// only by the session's consumer thread: notices are handled inside progress() on that thread,
// so nothing here needs a lock.
class RingReceiver final : public ReceiverProtocol {
 public:
  RingReceiver(ReceiverFabric& fabric, uint64_t window, std::unique_ptr<fabric::MemoryRegion> ring,
               std::vector<uint8_t> rkey, uint64_t session)
      : worker_(fabric.worker),
        block_size_(fabric.geometry.block_size),
        window_(window),
        ring_(std::move(ring)),
        rkey_(std::move(rkey)),
        session_(session),
        ledger_(fabric.geometry.bytes(), window),
        acks_(fabric.worker) {}

  Status init() {
    return worker_.set_am_handler(
        kRingNoticeAm,
        [this](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp reply) {
          noticed(header, reply);
        },
        &notice_handler_);
  }

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(ring_->remote_address());
    w.u64(session_);
    w.u64(ledger_.bytes());
    w.u64(window_);
    w.blob32(rkey_);
    return std::move(w.buffer());
  }

  // The receiver polls its own completion queue (notices are handled inside worker progress) and
  // returns freed space: one ACK per pass of the consumer loop that freed something — SDP's
  // receiver ACKs once per recv() call, after copying out what it could.
  bool progress() override {
    bool did = worker_.progress() != 0;
    did |= send_ack();
    return did;
  }

  // Idle: sleep in the kernel until the worker has an event (a notice arrives) or `max`.
  void wait(std::chrono::microseconds max) override { (void)worker_.wait_for_event(max); }

  // Records handed out and not released yet, in ring order.
  void poll(std::vector<Record>* out) override {
    while (!live_.empty() && ledger_.released(live_.front().id)) live_.pop_front();
    for (const Record& r : live_) {
      if (!ledger_.released(r.id)) out->push_back(r);
    }
  }

  void release(uint64_t id) override {
    if (!ledger_.release(id)) ++bad_releases_;
  }

  // Every record holds at least its 16-byte header.
  uint64_t max_records() const override { return std::max<uint64_t>(1, ledger_.bytes() / wire::kBlockHeaderSize); }

  ProtocolStats stats() const override {
    ProtocolStats s;
    s.sync_ops = acks_sent_;
    s.counters = {{"notices_received", notices_},
                  {"notices_malformed", malformed_},
                  {"segments", segments_},
                  {"records_unpacked", records_},
                  {"multi_record_segments", multi_record_segments_},
                  {"wrap_markers", wraps_},
                  {"acks_sent", acks_sent_},
                  {"ack_send_failures", ack_failures_},
                  {"bad_releases", bad_releases_}};
    for (const auto& [v, n] : dropped_) s.counters[std::string("notices_dropped_") + RingLedger::verdict_name(v)] = n;
    return s;
  }

 private:
  // Inside progress(): a notice (the "write with immediate" completion), in ring order — checked
  // against the ledger, then its records found. One that breaks a rule was never written by a
  // correct sender: taking it could overwrite records not yet processed, so it is dropped.
  void noticed(std::span<const std::byte> header, fabric::ReplyEp reply) {
    RingNotice n;
    if (header.size() != sizeof(RingNotice)) {
      ++malformed_;
      return;
    }
    std::memcpy(&n, header.data(), sizeof n);
    if (n.session != session_) {
      ++malformed_;
      return;
    }
    ++notices_;
    reply_ = reply;
    const bool padding = n.flags & kNoticePadding;
    RingLedger::Verdict v =
        (n.flags & ~kNoticePadding) ? RingLedger::Verdict::kBadPadding : ledger_.accept(n.position, n.length, padding);
    if (v != RingLedger::Verdict::kOk) {
      ++dropped_[v];
      return;
    }
    if (padding) {
      ++wraps_;
      return;
    }
    const uint64_t offset = n.position % ledger_.bytes();
    std::span<const std::byte> segment(ring_->data() + offset, n.length);
    split_records(segment, &spans_);
    for (auto s : spans_) {
      const uint64_t position = n.position + uint64_t(s.data() - segment.data());
      const uint64_t id = ledger_.add_record(position, static_cast<uint32_t>(s.size()));
      live_.push_back({id, static_cast<uint32_t>((position % ledger_.bytes()) / block_size_), s});
    }
    ++segments_;
    records_ += spans_.size();
    if (spans_.size() > 1) ++multi_record_segments_;
  }

  bool send_ack() {
    ledger_.grant();
    const bool due = window_ ? ledger_.granted() != acked_credits_ : ledger_.head() != acked_head_;
    if (!due || !reply_) return false;
    const RingAck ack{ledger_.head(), ledger_.granted(), uint64_t(now_ns())};
    if (!acks_.send(reply_, kRingAckAm, ack).is_ok()) {
      ++ack_failures_;  // retried on the next pass; fails for good only when the sender is gone
      return false;
    }
    ++acks_sent_;
    acked_head_ = ack.freed;
    acked_credits_ = ack.credits;
    return true;
  }

  fabric::Worker& worker_;
  uint32_t block_size_;
  uint64_t window_;
  std::unique_ptr<fabric::MemoryRegion> ring_;
  std::vector<uint8_t> rkey_;
  uint64_t session_;
  RingLedger ledger_;
  std::deque<Record> live_;                        // records handed out and not yet known released, in ring order
  std::vector<std::span<const std::byte>> spans_;  // scratch
  fabric::ReplyEp reply_;
  uint64_t acked_head_ = 0;
  uint64_t acked_credits_ = 0;
  uint64_t notices_ = 0, malformed_ = 0, segments_ = 0, records_ = 0, multi_record_segments_ = 0, wraps_ = 0;
  uint64_t acks_sent_ = 0, ack_failures_ = 0, bad_releases_ = 0;
  std::map<RingLedger::Verdict, uint64_t> dropped_;
  ReplyQueue<RingAck> acks_;
  // The worker outlives us (it belongs to the session): the handler is unhooked first, acks_
  // (which lets its last ACKs leave) after.
  fabric::AmRegistration notice_handler_;
};

}  // namespace

Status make_ring_receiver(ReceiverFabric& fabric, uint64_t window, std::unique_ptr<ReceiverProtocol>* out) {
  // The ring is exactly the blocks x block_size the receiver's memory budget reserved.
  fabric::ExposedRegion ring;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate_exposed(fabric.context, fabric.geometry.bytes(), &ring));
  // The session id the sender echoes in every notice: one that carries another is not for this
  // ring and is dropped (counted).
  uint64_t session = 0;
  SLOTSTREAM_RETURN_IF_ERROR(random_u64(&session));
  auto receiver = std::make_unique<RingReceiver>(fabric, window, std::move(ring.region), std::move(ring.rkey), session);
  SLOTSTREAM_RETURN_IF_ERROR(receiver->init());
  *out = std::move(receiver);
  return Status::ok();
}

}  // namespace slotstream::protocol
