#include "protocol/sliding_window.h"

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

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

// AM headers, little-endian (the structs are copied as they are, hence the endian assert).
//   Notify: u64 session | u32 block index | u32 length      (session: see Dispatch below)
//   Ack:    u32 block index | u32 zero | u64 generated-at ns (receiver's CLOCK_MONOTONIC)
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
static_assert(sizeof(Notify) == 16 && sizeof(Ack) == 16, "fixed AM layouts");
static_assert(std::endian::native == std::endian::little, "AM headers are copied as little-endian structs");

struct AtomicStats {
  std::atomic<uint64_t> notifications_sent{0}, acks_received{0}, acks_ignored{0}, window_full_waits{0},
      window_full_wait_ns{0}, head_blocked_acks{0}, notifications_received{0}, notifications_dropped{0},
      acks_sent{0}, ack_send_failures{0};
};
AtomicStats g_stats;
void bump(std::atomic<uint64_t>& a, uint64_t by = 1) { a.fetch_add(by, std::memory_order_relaxed); }

class SlidingWindowSender final : public SenderProtocol {
 public:
  SlidingWindowSender(SenderFabric& fabric, uint64_t pool, uint64_t session, std::unique_ptr<fabric::RemoteKey> rkey)
      : fabric_(fabric), pool_(pool), rkey_(std::move(rkey)), window_(fabric.geometry.blocks),
        notify_(new Notify[fabric.geometry.blocks]), notify_req_(fabric.geometry.blocks),
        notified_at_ns_(fabric.geometry.blocks, 0) {
    for (uint32_t i = 0; i < fabric.geometry.blocks; ++i) notify_[i] = Notify{session, 0, 0};
  }

  // The Sender destroys its protocol before its endpoint, whose close still progresses the
  // worker: unhook the ACK handler (it points at this object), and leave the notification
  // headers to UCX if a notification is still queued (only when the receiver stopped answering).
  ~SlidingWindowSender() override {
    (void)fabric_.worker.set_am_handler(kAckAm, [](std::span<const std::byte>, std::span<const std::byte>,
                                                   fabric::ReplyEp) {});
    for (auto& r : notify_req_) {
      if (r.check().code() == Code::kInProgress) {
        (void)notify_.release();
        break;
      }
    }
  }

  Status init() {
    // Who polls the ACKs. The paper's sender has a dedicated ACK-polling thread (§4.2.1). Here
    // an ACK is an active message, and UCX runs AM handlers inside ucp_worker_progress of the
    // worker that received it — the sending thread's UCS_THREAD_MODE_SINGLE worker. So the
    // sending thread is the ACK poller: it progresses the worker (and thereby handles ACKs)
    // whenever the window is full. While the window has room an ACK is never waited for, only
    // picked up at the next wait. A dedicated thread needs the worker in UCS_THREAD_MODE_MULTI
    // (a lock around every put, fence and AM) plus a lock around the window; tried on this
    // 2-vCPU VM (--blocks 3, recv --discard, one device, busy-polling ACK thread, same binary),
    // it was 3-40x slower than polling here: shm 256 B 0.3-1.1 vs 3.6-8.0 MB/s, shm 64 KiB
    // 124-369 vs 463-933 MB/s, tcp 256 B 0.3-0.4 vs 0.8-1.2 MB/s, tcp 64 KiB 3-59 vs
    // 110-138 MB/s (a loaded machine, hence the ranges): the extra spinning thread takes a core
    // from the receiver's progress and consumer threads. With more cores than busy threads it
    // would cost the lock only.
    return fabric_.worker.set_am_handler(
        kAckAm, [this](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp) {
          on_ack(header);
        });
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    // The window is full: the head waits for the oldest block's ACK (in order, Figure 1c/d).
    if (window_.full()) {
      const uint64_t t0 = now_ns();
      SLOTSTREAM_RETURN_IF_ERROR(wait_st([this] { return !window_.full(); }));
      bump(g_stats.window_full_waits);
      bump(g_stats.window_full_wait_ns, now_ns() - t0);
    }
    const uint32_t i = window_.push();
    // RmWrite, paper §2.3: RDMA Write-with-Immediate into the block at the tail. UCP has no
    // write-with-immediate: emulated as a put of the data followed by an active message whose
    // header carries (block index, length) — the "immediate" that the receiver must receive
    // and handle, as it must consume a receive + CQE for a real Write_with_imm.
    SLOTSTREAM_RETURN_IF_ERROR(
        fabric_.endpoint.put(src, length, pool_ + uint64_t(i) * fabric_.geometry.block_size, *rkey_, data_req));
    // The notification must not overtake the data. ucp_worker_fence is documented (UCX 1.13
    // ucp.h) to order *communication operations* — not only RMA — issued on the worker before
    // it ahead of those issued after it, and UCX's own rendezvous protocol relies on a fence
    // between its PUTs and the ATP active message. On what this machine has it holds also
    // without the fence: posix/sysv puts are copied by this CPU inside ucp_put_nbx (an x86
    // store fence then orders the AM's fifo write); tcp emulates the put with AMs on the same
    // lane and socket, and a put that could not be sent whole leaves the socket's tx buffer
    // busy, so the AM queues behind it. A flush instead of the fence would also be correct but
    // adds a round trip per block, which a real Write_with_imm does not have.
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.worker.fence());
    notify_[i].index = i;
    notify_[i].length = static_cast<uint32_t>(length);
    notified_at_ns_[i] = now_ns();
    // Its header, notify_[i], stays untouched until the block is ACKed, so the slot's previous
    // notification has completed by now.
    notify_req_[i] = fabric::Request();
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.am_send(kNotifyAm, &notify_[i], sizeof(Notify), nullptr, 0,
                                                        /*want_reply=*/true, &notify_req_[i]));
    bump(g_stats.notifications_sent);
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
  // One sample = one ACK: from the receiver generating it (after processing the block) until
  // the sender handles it. Both ends read CLOCK_MONOTONIC, so samples mean something only when
  // sender and receiver share a host (the benchmark's case); across hosts use
  // ack_round_trips_ns(), which never mixes clocks.
  std::vector<uint64_t> sync_latencies_ns() const override { return sync_ns_; }
  const std::vector<uint64_t>& ack_round_trips_ns() const { return rtt_ns_; }

 private:
  // Runs inside worker progress, i.e. on the sending thread (see init()).
  void on_ack(std::span<const std::byte> header) {
    const uint64_t now = now_ns();
    Ack ack;
    if (header.size() != sizeof(Ack)) {
      bump(g_stats.acks_ignored);
      return;
    }
    std::memcpy(&ack, header.data(), sizeof ack);
    if (ack.index >= fabric_.geometry.blocks || !window_.awaiting_ack(ack.index)) {
      bump(g_stats.acks_ignored);  // stray or duplicate: must not free a block in flight
      return;
    }
    if (sync_ns_.size() < kMaxSyncSamples && now > ack.generated_ns) sync_ns_.push_back(now - ack.generated_ns);
    if (rtt_ns_.size() < kMaxSyncSamples) rtt_ns_.push_back(now - notified_at_ns_[ack.index]);
    ++acks_;
    bump(g_stats.acks_received);
    // RmFree: the head moves over the acknowledged prefix only.
    if (window_.ack(ack.index) == 0) bump(g_stats.head_blocked_acks);
  }

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
  std::unique_ptr<Notify[]> notify_;            // per slot: the AM header, alive while in flight
  std::vector<fabric::Request> notify_req_;     // per slot: its notification, if not sent inline
  std::vector<uint64_t> notified_at_ns_;        // per slot: when its notification was posted
  SenderCounters counters_;
  uint64_t acks_ = 0;
  std::vector<uint64_t> sync_ns_;
  std::vector<uint64_t> rtt_ns_;
};

// The receiver's worker is shared by every connected sender and UCX allows one handler per AM
// id per worker, so notifications are routed by the session id the receiver handed out in its
// set-up blob and the sender echoes in each notification.
class SlidingWindowReceiver;
struct Dispatch {
  std::mutex mutex;
  std::map<uint64_t, SlidingWindowReceiver*> sessions;
  uint64_t next_session = 1;
};
Dispatch& dispatch() {
  static Dispatch d;
  return d;
}

class SlidingWindowReceiver final : public ReceiverProtocol {
 public:
  SlidingWindowReceiver(ReceiverFabric& fabric, std::unique_ptr<fabric::MemoryRegion> pool, std::vector<uint8_t> rkey)
      : worker_(fabric.worker), geometry_(fabric.geometry), pool_(std::move(pool)), rkey_(std::move(rkey)),
        notified_(fabric.geometry.blocks, false) {
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
    // An ACK's header must outlive its request. Give the last ones a moment (the progress
    // thread completes them); a header whose ACK is still stuck (sender gone) is leaked rather
    // than freed under UCX.
    const auto deadline = Clock::now() + std::chrono::milliseconds(50);
    while (!acks_.empty() && Clock::now() < deadline) {
      reap_acks();
      if (!acks_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (auto& a : acks_) (void)a.second.release();
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
    if (n.index >= geometry_.blocks || n.length > geometry_.block_size || notified_[n.index]) {
      bump(g_stats.notifications_dropped);
      return;
    }
    reply_ = reply;
    notified_[n.index] = true;
    ready_.push_back(n.index);
  }

  // Notified blocks not yet released, in arrival order.
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
      // Only a notified block is ACKed: a second ACK for a slot could free the sender's next
      // block in that slot before it was ever processed.
      if (index >= geometry_.blocks || !notified_[index]) return;
      notified_[index] = false;
      for (auto it = ready_.begin(); it != ready_.end(); ++it) {
        if (*it == index) {
          ready_.erase(it);
          break;
        }
      }
      reply = reply_;
    }
    // The ACK, two-sided, right after processing (paper: "the receiver sends an ACK
    // notification"). Sent without holding mutex_: the progress thread takes the worker's
    // lock, then ours.
    auto ack = std::make_unique<Ack>(Ack{index, 0, now_ns()});
    fabric::Request req;
    if (worker_.am_reply(reply, kAckAm, ack.get(), sizeof(Ack), &req).is_ok()) {
      bump(g_stats.acks_sent);
      if (req.pending()) acks_.push_back({std::move(req), std::move(ack)});
    } else {
      bump(g_stats.ack_send_failures);
    }
    reap_acks();
  }

  // No per-block status: a block cannot be marked unavailable (the paper's point, §3.3).
  bool set_hold(uint32_t, bool) override { return false; }

 private:
  void reap_acks() {
    while (!acks_.empty() && acks_.front().first.check().code() != Code::kInProgress) acks_.pop_front();
  }

  fabric::Worker& worker_;
  Geometry geometry_;
  std::unique_ptr<fabric::MemoryRegion> pool_;
  std::vector<uint8_t> rkey_;
  uint64_t session_ = 0;
  std::mutex mutex_;  // guards ready_, notified_ and reply_: the progress thread writes them
  std::deque<uint32_t> ready_;
  std::vector<bool> notified_;
  fabric::ReplyEp reply_;
  std::deque<std::pair<fabric::Request, std::unique_ptr<Ack>>> acks_;  // consumer thread only
};

void on_notify(std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp reply) {
  if (header.size() != sizeof(Notify)) {
    bump(g_stats.notifications_dropped);
    return;
  }
  bump(g_stats.notifications_received);
  Notify n;
  std::memcpy(&n, header.data(), sizeof n);
  Dispatch& d = dispatch();
  std::lock_guard lock(d.mutex);
  auto it = d.sessions.find(n.session);
  if (it == d.sessions.end()) {
    bump(g_stats.notifications_dropped);  // a session that already ended
    return;
  }
  it->second->notified(n, reply);
}

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
    if (!fabric.worker.has_am_handler(kNotifyAm)) {
      SLOTSTREAM_RETURN_IF_ERROR(fabric.worker.set_am_handler(kNotifyAm, on_notify));
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
  if (!awaiting_ack(index)) return 0;  // not in flight, or a duplicate ACK
  const uint64_t n = acked_.size();
  acked_[index] = true;
  uint32_t advanced = 0;
  while (head_ < tail_ && acked_[head_ % n]) {
    acked_[head_ % n] = false;
    ++head_;
    ++advanced;
  }
  return advanced;
}

bool WindowTracker::awaiting_ack(uint32_t index) const {
  const uint64_t n = acked_.size();
  if (index >= n) return false;
  const uint64_t pos = (index + n - head_ % n) % n;  // distance from the head
  return pos < in_flight() && !acked_[index];
}

SlidingWindowStats sliding_window_stats() {
  const AtomicStats& s = g_stats;
  SlidingWindowStats out;
  out.notifications_sent = s.notifications_sent.load();
  out.acks_received = s.acks_received.load();
  out.acks_ignored = s.acks_ignored.load();
  out.window_full_waits = s.window_full_waits.load();
  out.window_full_wait_ns = s.window_full_wait_ns.load();
  out.head_blocked_acks = s.head_blocked_acks.load();
  out.notifications_received = s.notifications_received.load();
  out.notifications_dropped = s.notifications_dropped.load();
  out.acks_sent = s.acks_sent.load();
  out.ack_send_failures = s.ack_send_failures.load();
  return out;
}

void reset_sliding_window_stats() {
  AtomicStats& s = g_stats;
  for (auto* a : {&s.notifications_sent, &s.acks_received, &s.acks_ignored, &s.window_full_waits,
                  &s.window_full_wait_ns, &s.head_blocked_acks, &s.notifications_received,
                  &s.notifications_dropped, &s.acks_sent, &s.ack_send_failures}) {
    a->store(0);
  }
}

std::vector<uint64_t> sliding_window_ack_round_trips_ns(const SenderProtocol& sender) {
  if (auto* sw = dynamic_cast<const SlidingWindowSender*>(&sender)) return sw->ack_round_trips_ns();
  return {};
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
