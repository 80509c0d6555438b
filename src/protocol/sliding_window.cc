#include "protocol/sliding_window.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC: comparable across local processes

uint64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Active-message ids on the wire.
constexpr unsigned kNotifyAm = 11;  // sender -> receiver: "block index, length" (the immediate)
constexpr unsigned kAckAm = 12;     // receiver -> sender: "block index processed"

// Notification: u64 session | u32 index | u32 length.   ACK: u32 index | u64 generated-at ns.
struct Notify {
  uint64_t session;
  uint32_t index;
  uint32_t length;
};
struct Ack {
  uint32_t index;
  uint32_t pad;
  uint64_t generated_ns;
};
static_assert(sizeof(Notify) == 16 && sizeof(Ack) == 16, "fixed AM layouts (host order: same host or same arch)");

class SlidingWindowSender final : public SenderProtocol {
 public:
  SlidingWindowSender(SenderFabric& fabric, uint64_t pool, uint64_t session, std::unique_ptr<fabric::RemoteKey> rkey)
      : fabric_(fabric), pool_(pool), rkey_(std::move(rkey)), window_(fabric.geometry.blocks),
        notify_(fabric.geometry.blocks) {
    for (auto& n : notify_) n.session = session;
  }

  Status init() {
    // ACKs are handled inside worker progress, i.e. on the sending thread, which polls for them
    // whenever it waits for the window. The paper's sender polls ACKs on a dedicated thread; with
    // UCX that needs a thread-safe (MULTI) worker, which UCX-NOTES measures at ~30% of the small
    // message rate — a cost the baseline would pay only because of UCX, so we do not add it.
    return fabric_.worker.set_am_handler(kAckAm, [this](std::span<const std::byte> header,
                                                        std::span<const std::byte>, fabric::ReplyEp) {
      if (header.size() != sizeof(Ack)) return;
      Ack ack;
      std::memcpy(&ack, header.data(), sizeof ack);
      if (ack.index >= window_in_blocks()) return;
      uint64_t now = now_ns();
      if (sync_ns_.size() < kMaxSyncSamples && now > ack.generated_ns) sync_ns_.push_back(now - ack.generated_ns);
      ++acks_;
      window_.ack(ack.index);
    });
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    // The window is full: the head waits for the oldest block's ACK (in order, Figure 1c/d).
    SLOTSTREAM_RETURN_IF_ERROR(wait_st([this] { return !window_.full(); }));
    const uint32_t i = window_.push();
    SLOTSTREAM_RETURN_IF_ERROR(
        fabric_.endpoint.put(src, length, pool_ + uint64_t(i) * fabric_.geometry.block_size, *rkey_, data_req));
    // Write-with-immediate, emulated: the notification must not overtake the data. The fence
    // orders it after the put on every transport UCX offers here (shm copies inline; tcp sends
    // both on one connection in order); on RC hardware a real write-with-imm needs no fence.
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.worker.fence());
    notify_[i].index = i;
    notify_[i].length = static_cast<uint32_t>(length);
    fabric::Request note;  // its header (notify_[i]) stays valid until the block is ACKed
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.am_send(kNotifyAm, &notify_[i], sizeof(Notify), nullptr, 0,
                                                        /*want_reply=*/true, &note));
    ++counters_.blocks;
    return Status::ok();
  }

  Status finish_st() override {
    // Everything is delivered once every block is ACKed.
    SLOTSTREAM_RETURN_IF_ERROR(wait_st([this] { return window_.empty(); }));
    return fabric_.endpoint.flush(fabric_.alive);
  }

  SenderCounters counters() const override {
    SenderCounters c = counters_;
    c.status_reads = acks_;  // the baseline's synchronisation messages are its ACKs
    return c;
  }
  // One sample = one ACK: generated at the receiver (after processing) until seen by the sender.
  std::vector<uint64_t> sync_latencies_ns() const override { return sync_ns_; }

 private:
  uint32_t window_in_blocks() const { return fabric_.geometry.blocks; }

  // Polls for ACKs (they are handled inside progress) until `done`.
  template <typename Pred>
  Status wait_st(Pred done) {
    for (PollBackoff backoff; !done(); backoff.pause()) {
      if (fabric_.worker.progress() != 0) backoff.reset();
      SLOTSTREAM_RETURN_IF_ERROR(fabric_.alive());
      if (fabric_.endpoint.failed()) return {Code::kPeerGone, "receiver unreachable"};
    }
    return Status::ok();
  }

  SenderFabric& fabric_;
  uint64_t pool_;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  WindowTracker window_;
  std::vector<Notify> notify_;
  SenderCounters counters_;
  uint64_t acks_ = 0;
  std::vector<uint64_t> sync_ns_;
};

// Notifications arrive on the receiver's shared worker (its progress thread) for every
// connected sender; they are routed by the session id the receiver handed out at set-up.
class SlidingWindowReceiver;
struct Dispatch {
  std::mutex mutex;
  std::map<uint64_t, SlidingWindowReceiver*> sessions;
  std::map<const fabric::Worker*, bool> registered;
  uint64_t next_session = 1;
};
Dispatch& dispatch() {
  static Dispatch d;
  return d;
}

class SlidingWindowReceiver final : public ReceiverProtocol {
 public:
  SlidingWindowReceiver(ReceiverFabric& fabric, std::unique_ptr<fabric::MemoryRegion> pool, std::vector<uint8_t> rkey)
      : worker_(fabric.worker), geometry_(fabric.geometry), pool_(std::move(pool)), rkey_(std::move(rkey)) {
    Dispatch& d = dispatch();
    std::lock_guard lock(d.mutex);
    session_ = d.next_session++;
    d.sessions[session_] = this;
  }
  ~SlidingWindowReceiver() override {
    {
      Dispatch& d = dispatch();
      std::lock_guard lock(d.mutex);
      d.sessions.erase(session_);
    }
    acks_.clear();  // abandons (UCX frees) any ACK still in flight
  }

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(pool_->remote_address());
    w.u64(session_);
    w.blob32(rkey_);
    return std::move(w.buffer());
  }

  // Progress thread: a notification ("write with immediate" completion) arrived.
  void notified(const Notify& n, fabric::ReplyEp reply) {
    std::lock_guard lock(mutex_);
    if (n.index >= geometry_.blocks || n.length > geometry_.block_size) return;
    reply_ = reply;
    ready_.push_back(n.index);
  }

  void poll_full(std::vector<uint32_t>* out) override {
    std::lock_guard lock(mutex_);
    out->insert(out->end(), ready_.begin(), ready_.end());
  }

  std::span<const std::byte> block(uint32_t index) const override {
    return {pool_->data() + size_t(index) * geometry_.block_size, geometry_.block_size};
  }

  void release(uint32_t index) override {
    fabric::ReplyEp reply;
    {
      std::lock_guard lock(mutex_);
      for (auto it = ready_.begin(); it != ready_.end(); ++it) {
        if (*it == index) {
          ready_.erase(it);
          break;
        }
      }
      reply = reply_;
    }
    // The ACK, two-sided, after processing (paper: "the receiver sends an ACK notification").
    // Sent without holding mutex_: the progress thread takes the worker's lock, then ours.
    auto ack = std::make_unique<Ack>(Ack{index, 0, now_ns()});
    fabric::Request req;
    if (worker_.am_reply(reply, kAckAm, ack.get(), sizeof(Ack), &req).is_ok() && req.pending()) {
      acks_.push_back({std::move(req), std::move(ack)});
    }
    while (!acks_.empty() && acks_.front().first.check().code() != Code::kInProgress) acks_.pop_front();
  }

  // No per-block status: a block cannot be marked unavailable (the paper's point, §3.3).
  bool set_hold(uint32_t, bool) override { return false; }

 private:
  fabric::Worker& worker_;
  Geometry geometry_;
  std::unique_ptr<fabric::MemoryRegion> pool_;
  std::vector<uint8_t> rkey_;
  uint64_t session_ = 0;
  std::mutex mutex_;  // ready_ and reply_: written by the progress thread
  std::deque<uint32_t> ready_;
  fabric::ReplyEp reply_;
  std::deque<std::pair<fabric::Request, std::unique_ptr<Ack>>> acks_;  // consumer thread only
};

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, std::unique_ptr<SenderProtocol>* out) {
  wire::Reader r(setup);
  uint64_t pool = r.u64();
  uint64_t session = r.u64();
  std::vector<uint8_t> packed = r.blob32(setup.size());
  if (!r.ok() || !r.at_end()) return {Code::kProtocolError, "malformed sliding_window set-up from receiver"};
  std::unique_ptr<fabric::RemoteKey> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::RemoteKey::unpack(fabric.endpoint, packed, &rkey));
  auto sender = std::make_unique<SlidingWindowSender>(fabric, pool, session, std::move(rkey));
  SLOTSTREAM_RETURN_IF_ERROR(sender->init());
  *out = std::move(sender);
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, std::unique_ptr<ReceiverProtocol>* out) {
  const Geometry& g = fabric.geometry;
  {
    Dispatch& d = dispatch();
    std::lock_guard lock(d.mutex);
    if (!d.registered[&fabric.worker]) {
      SLOTSTREAM_RETURN_IF_ERROR(fabric.worker.set_am_handler(
          kNotifyAm, [](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp reply) {
            if (header.size() != sizeof(Notify)) return;
            Notify n;
            std::memcpy(&n, header.data(), sizeof n);
            Dispatch& dd = dispatch();
            std::lock_guard l(dd.mutex);
            auto it = dd.sessions.find(n.session);
            if (it != dd.sessions.end()) it->second->notified(n, reply);
          }));
      d.registered[&fabric.worker] = true;
    }
  }
  std::unique_ptr<fabric::MemoryRegion> pool;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate(fabric.context, size_t(g.blocks) * g.block_size, &pool));
  std::vector<uint8_t> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(pool->pack_rkey(&rkey));
  out->reset(new SlidingWindowReceiver(fabric, std::move(pool), std::move(rkey)));
  return Status::ok();
}

}  // namespace

uint32_t WindowTracker::ack(uint32_t index) {
  const uint64_t n = acked_.size();
  if (index >= n) return 0;
  const uint64_t pos = (index + n - head_ % n) % n;  // distance from the head
  if (pos >= in_flight() || acked_[index]) return 0;  // not in flight, or a duplicate ACK
  acked_[index] = true;
  uint32_t advanced = 0;
  while (head_ < tail_ && acked_[head_ % n]) {
    acked_[head_ % n] = false;
    ++head_;
    ++advanced;
  }
  return advanced;
}

const Descriptor kSlidingWindow = {
    .name = "sliding_window",
    .summary = "paper §2.3 baseline: head/tail window, put + notification (emulated write-with-immediate), "
               "ACK per block by two-sided send, in-order release, one connection per device",
    .receiver_progress = true,
    .connection_per_device = true,
    .reference = false,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
