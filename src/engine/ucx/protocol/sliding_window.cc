#include "engine/ucx/protocol/sliding_window.h"

#include <pthread.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "clock.h"
#include "engine/ucx/protocol/reply_queue.h"
#include "random.h"
#include "wire/codec.h"

namespace slotstream::protocol {
namespace {

// Active-message ids on the wire.
constexpr unsigned kNotifyAm = 11;      // sender -> receiver: "block index, length" (the immediate)
constexpr unsigned kAckAm = 12;         // receiver -> sender: "block index processed"
constexpr unsigned kAckChannelAm = 13;  // sender's ACK worker -> receiver: "send the ACKs here" (ack=thread)

// AM headers, little-endian (the structs are copied as they are, hence the endian assert).
//   Notify: u64 session | u32 block index | u32 length      (session: random, from the set-up)
//   Ack:    u32 block index | u32 zero | u64 generated-at ns (receiver's CLOCK_MONOTONIC)
//   AckChannel: u64 session                                   (ack=thread, once, from the ACK worker)
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
struct AckChannel {
  uint64_t session;
};
static_assert(sizeof(Notify) == 16 && sizeof(Ack) == 16 && sizeof(AckChannel) == 8, "fixed AM layouts");
static_assert(std::endian::native == std::endian::little, "AM headers are copied as little-endian structs");

// Who handles the sender's ACKs (`sliding_window:ack=`).
enum class AckMode { kLoop, kThread };

Status parse_ack(const Options& options, AckMode* out) {
  SLOTSTREAM_RETURN_IF_ERROR(options.check_known("sliding_window", {"ack"}));
  std::string ack;
  SLOTSTREAM_RETURN_IF_ERROR(options.choice("ack", {"loop", "thread"}, "loop", &ack));
  *out = ack == "thread" ? AckMode::kThread : AckMode::kLoop;
  return Status::ok();
}

// The paper's dedicated ACK receiving thread (§4.2.1: "the sender handles ACKs in real time using
// a dedicated ACK polling thread, which does not interrupt the sending thread"; §4.2.6: it "sets up
// two CQ queues"; §4.2.5: what the thread costs is its 20 % CPU argument). A UCX worker is a
// completion queue set: this thread owns a second worker of the sender's, connected to the
// receiver's worker by an endpoint of its own, and progresses nothing else — so the sending thread's
// worker stays single-threaded (no lock around its puts, the cost measured in init() below). The
// receiver learns where to send its ACKs from one AckChannel message on that endpoint.
//
// Threading: start() and the destructor on the connecting/owning thread; the handler runs on the
// ACK thread. The destructor stops and joins the thread before its worker and endpoint go.
class AckThread {
 public:
  static Status start(SenderFabric& fabric, uint64_t session, fabric::AmHandler on_ack,
                      std::unique_ptr<AckThread>* out) {
    std::unique_ptr<AckThread> t(new AckThread);
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(fabric.context, /*shared=*/false, /*wakeup=*/true, &t->worker_));
    SLOTSTREAM_RETURN_IF_ERROR(t->worker_->set_am_handler(kAckAm, std::move(on_ack), &t->ack_handler_));
    if (Status st = fabric::Endpoint::create(*t->worker_, fabric.peer_address, fabric.peer_host, &t->endpoint_);
        !st.is_ok()) {
      return {st.code(), "sliding_window:ack=thread: cannot connect the ACK thread's worker: " + st.message()};
    }
    t->hello_ = std::make_unique<AckChannel>(AckChannel{session});
    SLOTSTREAM_RETURN_IF_ERROR(t->endpoint_->am_send(kAckChannelAm, t->hello_.get(), sizeof(AckChannel), nullptr, 0,
                                                     /*want_reply=*/true, &t->hello_req_));
    t->thread_ = std::thread([raw = t.get()] { raw->run(); });
    *out = std::move(t);
    return Status::ok();
  }

  ~AckThread() {
    stop_.store(true, std::memory_order_release);
    worker_->signal();
    if (thread_.joinable()) thread_.join();
    // The channel message's header stays with the worker if UCX still holds it (receiver gone).
    if (hello_req_.check().code() == Code::kInProgress) worker_->keep_until_destroyed(std::move(hello_));
  }
  AckThread(const AckThread&) = delete;
  AckThread& operator=(const AckThread&) = delete;

  // The ACK thread's endpoint to the receiver failed (tcp, rdma: the receiver is gone). Any thread.
  bool failed() const { return endpoint_ && endpoint_->failed(); }

 private:
  AckThread() = default;

  // Polls its own worker — the ACK completion queue — with the wait policy every sender uses
  // (spin, then sleep up to 200 µs in the worker's event wait, which an arriving ACK ends).
  void run() {
    pthread_setname_np(pthread_self(), "slotstream-ack");
    for (PollBackoff backoff; !stop_.load(std::memory_order_acquire);) {
      if (worker_->progress() != 0) {
        backoff.reset();
      } else {
        backoff.pause(*worker_);
      }
    }
  }

  // Declared first, destroyed last: the endpoint and the request belong to the worker.
  std::unique_ptr<fabric::Worker> worker_;
  fabric::AmRegistration ack_handler_;
  std::unique_ptr<fabric::Endpoint> endpoint_;
  std::unique_ptr<AckChannel> hello_;
  fabric::Request hello_req_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class SlidingWindowSender final : public SenderProtocol {
 public:
  SlidingWindowSender(SenderFabric& fabric, uint64_t pool, uint64_t session, std::unique_ptr<fabric::RemoteKey> rkey,
                      AckMode mode)
      : fabric_(fabric),
        pool_(pool),
        session_(session),
        mode_(mode),
        rkey_(std::move(rkey)),
        window_(fabric.geometry.blocks),
        notify_(new Notify[fabric.geometry.blocks]),
        notify_req_(fabric.geometry.blocks) {
    for (uint32_t i = 0; i < fabric.geometry.blocks; ++i) notify_[i] = Notify{session, 0, 0};
  }

  // The Sender destroys its protocol before its endpoint, whose close still progresses the
  // worker: stop the ACK thread, and ack_handler_ unhooks the ACK handler (both point at this
  // object); the notification headers are left to the worker if a notification is still queued
  // (only when the receiver stopped answering): freed when it is destroyed, after UCX.
  ~SlidingWindowSender() override {
    ack_thread_.reset();
    for (auto& r : notify_req_) {
      if (r.check().code() == Code::kInProgress) {
        fabric_.worker.keep_until_destroyed(std::move(notify_));
        break;
      }
    }
  }

  Status init() {
    auto handler = [this](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp) {
      on_ack(header);
    };
    if (mode_ == AckMode::kThread) return AckThread::start(fabric_, session_, handler, &ack_thread_);
    // ack=loop (default): who polls the ACKs. The paper's sender has a dedicated ACK-polling thread
    // (§4.2.1; ack=thread above). Here an ACK is an active message, and UCX runs AM handlers
    // inside ucp_worker_progress of the worker that received it — the sending thread's. So the
    // sending thread is the ACK poller: it progresses the worker (and thereby handles ACKs)
    // whenever the window is full. While the window has room an ACK is never waited for, only
    // picked up at the next wait. A dedicated thread on this same worker needs it in
    // UCS_THREAD_MODE_MULTI (a lock around every put, fence and AM) plus a lock around the window;
    // tried on this 2-vCPU VM (--blocks 3, recv --discard, one device, busy-polling ACK thread, same
    // binary), it was 3-40x slower than polling here: shm 256 B 0.3-1.1 vs 3.6-8.0 MB/s, shm 64 KiB
    // 124-369 vs 463-933 MB/s, tcp 256 B 0.3-0.4 vs 0.8-1.2 MB/s, tcp 64 KiB 3-59 vs 110-138 MB/s
    // (a loaded machine, hence the ranges). ack=thread gives the thread a worker of its own instead.
    return fabric_.worker.set_am_handler(kAckAm, handler, &ack_handler_);
  }

  Status transmit_st(const std::byte* src, size_t length, fabric::Request* data_req) override {
    // The window is full: the head waits for the oldest block's ACK (in order, Figure 1c/d).
    if (full()) {
      WaitTimer wait(stats_);
      SLOTSTREAM_RETURN_IF_ERROR(wait_st([this] { return !full(); }));
    }
    uint32_t i = 0;
    {
      std::lock_guard lock(mutex_);
      i = window_.push();
    }
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
    // Its header, notify_[i], stays untouched until the block is ACKed, so the slot's previous
    // notification has completed by now.
    notify_req_[i] = fabric::Request();
    SLOTSTREAM_RETURN_IF_ERROR(fabric_.endpoint.am_send(kNotifyAm, &notify_[i], sizeof(Notify), nullptr, 0,
                                                        /*want_reply=*/true, &notify_req_[i]));
    ++stats_.counters["notifications_sent"];
    ++stats_.records;
    return Status::ok();
  }

  Status finish_st() override {
    // Everything is delivered once every block is ACKed.
    SLOTSTREAM_RETURN_IF_ERROR(wait_st([this] {
      std::lock_guard lock(mutex_);
      return window_.empty();
    }));
    return fabric_.endpoint.flush(fabric_.alive);
  }

  // sync_ops: ACKs handled. sync_op_samples_ns: one per ACK, from the receiver generating it
  // (after processing the block) until the sender handles it — with ack=loop including the time it
  // waits for the sender to poll, which it does only while the window is full (see init()). Both
  // ends read CLOCK_MONOTONIC: meaningful when sender and receiver share a host (the benchmark's
  // case). counters["ack_thread_acks"]: ACKs the dedicated ACK thread handled (ack=thread).
  ProtocolStats stats() const override {
    ProtocolStats s = stats_;
    std::lock_guard lock(mutex_);
    s.sync_ops = acks_.handled;
    s.sync_op_samples_ns = acks_.samples_ns;
    s.counters["acks_ignored"] = acks_.ignored;
    s.counters["head_blocked_acks"] = acks_.head_blocked;
    if (mode_ == AckMode::kThread) s.counters["ack_thread_acks"] = acks_.handled;
    return s;
  }

 private:
  // What the ACK handler records: on the ACK thread with ack=thread, so kept apart from stats_
  // (the sending thread's) and guarded by mutex_ with the window.
  struct AckStats {
    uint64_t handled = 0;
    uint64_t ignored = 0;
    uint64_t head_blocked = 0;
    std::vector<uint64_t> samples_ns;
  };

  bool full() const {
    std::lock_guard lock(mutex_);
    return window_.full();
  }

  // Runs inside progress of the worker that received the ACK: the sending thread's (ack=loop) or
  // the ACK thread's (ack=thread). RmFree: the head moves over the acknowledged prefix only.
  void on_ack(std::span<const std::byte> header) {
    const uint64_t now = now_ns();
    Ack ack{};
    const bool well_formed = header.size() == sizeof(Ack);
    if (well_formed) std::memcpy(&ack, header.data(), sizeof ack);
    uint32_t advanced = 0;
    {
      std::lock_guard lock(mutex_);
      if (!well_formed || ack.index >= fabric_.geometry.blocks || !window_.awaiting_ack(ack.index)) {
        ++acks_.ignored;  // stray or duplicate: must not free a block in flight
        return;
      }
      if (now > ack.generated_ns) add_sample(acks_.samples_ns, now - ack.generated_ns);
      ++acks_.handled;
      advanced = window_.ack(ack.index);
      if (advanced == 0) ++acks_.head_blocked;
    }
    // ack=thread: a sending thread asleep in its worker's event wait for room wakes at once.
    if (advanced != 0 && mode_ == AckMode::kThread) fabric_.worker.signal();
  }

  // Until `done`: progresses the sending thread's worker (ack=loop: ACKs are handled inside it;
  // ack=thread: only its own requests) and backs off — ack=thread in the worker's event wait,
  // which the ACK thread's signal ends.
  template <typename Pred>
  Status wait_st(Pred done) {
    for (PollBackoff backoff; !done();) {
      if (fabric_.worker.progress() != 0) backoff.reset();
      SLOTSTREAM_RETURN_IF_ERROR(fabric_.alive());
      if (fabric_.endpoint.failed()) return {Code::kPeerGone, "receiver unreachable"};
      if (ack_thread_ && ack_thread_->failed()) return {Code::kPeerGone, "receiver unreachable (ACK channel)"};
      if (mode_ == AckMode::kThread) {
        backoff.pause(fabric_.worker);
      } else {
        backoff.pause();
      }
    }
    return Status::ok();
  }

  SenderFabric& fabric_;
  uint64_t pool_;
  uint64_t session_;
  AckMode mode_;
  std::unique_ptr<fabric::RemoteKey> rkey_;
  mutable std::mutex mutex_;  // window_ and acks_: the ACK thread and the sending thread (ack=thread)
  WindowTracker window_;
  AckStats acks_;
  std::unique_ptr<Notify[]> notify_;         // per slot: the AM header, alive while in flight
  std::vector<fabric::Request> notify_req_;  // per slot: its notification, if not sent inline
  ProtocolStats stats_;
  std::unique_ptr<AckThread> ack_thread_;  // ack=thread; stopped first (destructor)
  fabric::AmRegistration ack_handler_;     // last: unhooked before the rest goes
};

// The receiver side. Its worker is this session's own (Descriptor::receiver_progress), progressed
// only by the session's consumer thread: notifications are handled inside progress() on that
// thread, so nothing here needs a lock.
class SlidingWindowReceiver final : public ReceiverProtocol {
 public:
  SlidingWindowReceiver(ReceiverFabric& fabric, std::unique_ptr<fabric::MemoryRegion> pool, std::vector<uint8_t> rkey,
                        uint64_t session, AckMode mode)
      : worker_(fabric.worker),
        geometry_(fabric.geometry),
        pool_(std::move(pool)),
        rkey_(std::move(rkey)),
        session_(session),
        mode_(mode),
        notified_(fabric.geometry.blocks, false),
        acks_(fabric.worker) {}

  Status init() {
    SLOTSTREAM_RETURN_IF_ERROR(worker_.set_am_handler(
        kNotifyAm,
        [this](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp reply) {
          notified(header, reply);
        },
        &notify_handler_));
    if (mode_ == AckMode::kLoop) return Status::ok();
    return worker_.set_am_handler(
        kAckChannelAm,
        [this](std::span<const std::byte> header, std::span<const std::byte>, fabric::ReplyEp reply) {
          channel(header, reply);
        },
        &channel_handler_);
  }

  std::vector<uint8_t> setup() const override {
    wire::Writer w;
    w.u64(pool_->remote_address());
    w.u64(session_);
    w.blob32(rkey_);
    return std::move(w.buffer());
  }

  // The receiver polls its own completion queue, as an RDMA receiver polls its CQ: the consumer
  // progresses the session's worker on every pass; notifications are handled inside.
  bool progress() override {
    const bool work = worker_.progress() != 0;
    if (ack_to_ && !unsent_.empty()) {  // ack=thread: ACKs that waited for the sender's ACK channel
      for (uint32_t index : unsent_) send_ack(ack_to_, index);
      unsent_.clear();
    }
    return work;
  }

  // Idle: sleep in the kernel until the worker has an event (a notification arrives) or `max`.
  void wait(std::chrono::microseconds max) override { (void)worker_.wait_for_event(max); }

  // Notified blocks not yet released, in arrival order.
  void poll(std::vector<Record>* out) override {
    for (uint32_t i : ready_) {
      out->push_back({i, i, {pool_->data() + size_t(i) * geometry_.block_size, geometry_.block_size}});
    }
  }

  uint64_t max_records() const override { return geometry_.blocks; }

  ProtocolStats stats() const override {
    ProtocolStats s;
    s.sync_ops = acks_sent_;
    s.counters = {{"notifications_received", notifications_},
                  {"notifications_dropped", dropped_},
                  {"acks_sent", acks_sent_},
                  {"ack_send_failures", ack_failures_}};
    return s;
  }

  void release(uint64_t id) override {
    const auto index = static_cast<uint32_t>(id);
    // Only a notified block is ACKed: a second ACK for a slot could free the sender's next block
    // in that slot before it was ever processed.
    if (index >= geometry_.blocks || !notified_[index]) return;
    notified_[index] = false;
    for (auto it = ready_.begin(); it != ready_.end(); ++it) {
      if (*it == index) {
        ready_.erase(it);
        break;
      }
    }
    // The ACK, two-sided, right after processing (paper: "the receiver sends an ACK
    // notification") — to the sender's ACK thread (ack=thread) or on the notification's endpoint.
    // ack=thread: the channel message travels on another endpoint than the notifications, so it
    // may come after the first of them: ACKs wait for it (at most one per block).
    if (mode_ == AckMode::kThread && !ack_to_) {
      unsent_.push_back(index);
      return;
    }
    send_ack(mode_ == AckMode::kThread ? ack_to_ : reply_, index);
  }

 private:
  // If it cannot leave at once (e.g. the shared-memory FIFO to the sender is full), the next
  // progress() pushes it.
  void send_ack(fabric::ReplyEp to, uint32_t index) {
    if (acks_.send(to, kAckAm, Ack{index, 0, uint64_t(now_ns())}).is_ok()) {
      ++acks_sent_;
    } else {
      ++ack_failures_;
    }
  }

  // Inside progress(), ack=thread: the sender's ACK thread says where its ACKs go.
  void channel(std::span<const std::byte> header, fabric::ReplyEp reply) {
    AckChannel c{};
    if (header.size() == sizeof(AckChannel)) std::memcpy(&c, header.data(), sizeof c);
    if (header.size() != sizeof(AckChannel) || c.session != session_ || !reply) {
      ++dropped_;  // not this window's sender
      return;
    }
    ack_to_ = reply;
  }

  // Inside progress(): a notification ("write with immediate" completion) arrived.
  void notified(std::span<const std::byte> header, fabric::ReplyEp reply) {
    Notify n;
    if (header.size() != sizeof(Notify)) {
      ++dropped_;
      return;
    }
    std::memcpy(&n, header.data(), sizeof n);
    if (n.session != session_ || n.index >= geometry_.blocks || n.length > geometry_.block_size || notified_[n.index]) {
      ++dropped_;
      return;
    }
    reply_ = reply;
    notified_[n.index] = true;
    ready_.push_back(n.index);
    ++notifications_;
  }

  fabric::Worker& worker_;
  Geometry geometry_;
  std::unique_ptr<fabric::MemoryRegion> pool_;
  std::vector<uint8_t> rkey_;
  uint64_t session_;
  AckMode mode_;
  std::deque<uint32_t> ready_;
  std::vector<bool> notified_;
  fabric::ReplyEp reply_;
  fabric::ReplyEp ack_to_;        // ack=thread: the sender's ACK thread, once its channel message came
  std::vector<uint32_t> unsent_;  // ack=thread: ACKs released before that
  uint64_t notifications_ = 0;
  uint64_t dropped_ = 0;
  uint64_t acks_sent_ = 0;
  uint64_t ack_failures_ = 0;
  ReplyQueue<Ack> acks_;
  // The worker outlives us (it belongs to the session): the handler is unhooked first, acks_
  // (which lets its last ACKs leave) after.
  fabric::AmRegistration notify_handler_;
  fabric::AmRegistration channel_handler_;  // ack=thread only
};

Status check_options(const Options& options) {
  AckMode mode;
  return parse_ack(options, &mode);
}

Status make_sender(SenderFabric& fabric, std::span<const uint8_t> setup, const Options& options,
                   std::unique_ptr<SenderProtocol>* out) {
  AckMode mode = AckMode::kLoop;
  SLOTSTREAM_RETURN_IF_ERROR(parse_ack(options, &mode));
  uint64_t words[2];  // pool, session
  std::unique_ptr<fabric::RemoteKey> rkey;
  SLOTSTREAM_RETURN_IF_ERROR(read_keyed_setup(setup, "sliding_window", fabric.endpoint, words, &rkey));
  auto sender = std::make_unique<SlidingWindowSender>(fabric, words[0], words[1], std::move(rkey), mode);
  SLOTSTREAM_RETURN_IF_ERROR(sender->init());
  *out = std::move(sender);
  return Status::ok();
}

Status make_receiver(ReceiverFabric& fabric, const Options& options, std::unique_ptr<ReceiverProtocol>* out) {
  AckMode mode = AckMode::kLoop;
  SLOTSTREAM_RETURN_IF_ERROR(parse_ack(options, &mode));
  const Geometry& g = fabric.geometry;
  fabric::ExposedRegion pool;
  SLOTSTREAM_RETURN_IF_ERROR(
      fabric::MemoryRegion::allocate_exposed(fabric.context, size_t(g.blocks) * g.block_size, &pool));
  // The session id the sender echoes in every notification: a notification that carries another
  // one is not for this window and is dropped (counted).
  uint64_t session = 0;
  SLOTSTREAM_RETURN_IF_ERROR(random_u64(&session));
  auto receiver =
      std::make_unique<SlidingWindowReceiver>(fabric, std::move(pool.region), std::move(pool.rkey), session, mode);
  SLOTSTREAM_RETURN_IF_ERROR(receiver->init());
  *out = std::move(receiver);
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

const Descriptor kSlidingWindow = {
    .name = "sliding_window",
    .summary =
        "paper §2.3 baseline: head/tail window, put + notification (emulated write-with-immediate), "
        "ACK per block by two-sided send, in-order release, one connection per device",
    .options_help =
        "ack=loop|thread: who handles the sender's ACKs — loop: the sending thread, polling its worker while the "
        "window is full (default); thread: the paper's dedicated ACK receiving thread (§4.2.1, §4.2.5), polling a "
        "second worker (its own completion queue) of the sender's",
    .receiver_progress = true,
    .connection_per_device = true,
    // No per-block status: a block cannot be marked unavailable (the paper's point, §3.3).
    .holds = false,
    .check_options = check_options,
    .make_sender = make_sender,
    .make_receiver = make_receiver,
};

}  // namespace slotstream::protocol
