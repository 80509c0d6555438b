// The fabric's UCX worker (progress, events, active-message handlers, tag receives) and ProgressThread.
#include "engine/ucx/fabric/fabric.h"

#include "common.h"
#include "engine/ucx/fabric/cm.h"
#include "engine/ucx/fabric/internal.h"
#include "engine/ucx/fabric/shm_dir.h"
#include "engine/ucx/fabric/soft_rma.h"

#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>

namespace slotstream::fabric {

namespace {
using internal::from_ucs;
using internal::g_counters;
using internal::g_pinned_workers;
using internal::op_started;
using internal::track;

}  // namespace

// ----------------------------------------------------------------------------------- Worker
Status Worker::create(Context& ctx, bool shared, bool wakeup, std::unique_ptr<Worker>* out) {
  const bool rdma = ctx.transport() == Transport::kRdma;
  if (rdma) {
    // Before UCX pins anything: a limit too low fails here, with what to do, not inside UCX.
    SLOTSTREAM_RETURN_IF_ERROR(check_memlock(ctx.spec(), pinned_estimate() + worker_pinned_bytes(ctx.spec()),
                                             "what is pinned already and a new worker"));
    // UCX 1.13 asserts (SIGABRT) when a listener is created on a worker without a connection
    // manager: rdma's is rdmacm.
    if (!rdma_cm_available()) {
      return {Code::kInvalidArgument,
              "rdma needs the RDMA connection manager: /dev/infiniband/rdma_cm is missing or not accessible (load the "
              "rdma_ucm module)"};
    }
  }
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // Unshared: one thread at a time, not always the same one (a sender's filler transmits itself
  // when it holds the lane's transmit token, engine/ucx/stream/send_ring.h) — UCX's serialized mode.
  params.thread_mode = shared ? UCS_THREAD_MODE_MULTI : UCS_THREAD_MODE_SERIALIZED;
  if (wakeup) {
    params.field_mask |= UCP_WORKER_PARAM_FIELD_EVENTS;
    params.events =
        UCP_WAKEUP_RMA | UCP_WAKEUP_AMO | UCP_WAKEUP_TAG_RECV | UCP_WAKEUP_TAG_SEND | UCP_WAKEUP_TX | UCP_WAKEUP_RX;
  }
  ucp_worker_h handle = nullptr;
  ucs_status_t st = ucp_worker_create(ctx.handle(), &params, &handle);
  if (st != UCS_OK) return from_ucs(st, "ucp_worker_create");
  std::unique_ptr<Worker> w(new Worker(ctx, handle));
  if (rdma) g_pinned_workers.fetch_add(1);

  if (ctx.traits().cm_connect) {
    // Peers connect through a listener (cm.h), never by worker address.
    SLOTSTREAM_RETURN_IF_ERROR(CmListener::create(handle, &w->listener_));
    CmAddress address{w->listener_->ports()};
    if (rdma) {
      // The word a peer reads to prove the NIC reaches this worker's memory (Endpoint::create).
      SLOTSTREAM_RETURN_IF_ERROR(MemoryRegion::allocate(ctx, 64, &w->probe_));
      SLOTSTREAM_RETURN_IF_ERROR(w->probe_->pack_rkey(&address.probe_rkey));
      address.probe_address = w->probe_->remote_address();
    }
    w->address_ = encode_cm_address(address);
  } else {
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    st = ucp_worker_get_address(handle, &addr, &addr_len);
    if (st != UCS_OK) return from_ucs(st, "ucp_worker_get_address");
    auto* bytes = reinterpret_cast<uint8_t*>(addr);
    w->address_.assign(bytes, bytes + addr_len);
    ucp_worker_release_address(handle, addr);
  }

  if (wakeup) {
    st = ucp_worker_get_efd(handle, &w->event_fd_);
    if (st != UCS_OK) return from_ucs(st, "ucp_worker_get_efd");
  }
  // tcp has no one-sided transport: the fabric carries puts and gets itself (soft_rma.h). rdma
  // and shm take UCX's own one-sided operations.
  if (ctx.traits().soft_rma) SLOTSTREAM_RETURN_IF_ERROR(SoftRma::create(*w, &w->soft_));
  *out = std::move(w);
  return Status::ok();
}

Worker::Worker(Context& ctx, ucp_worker* handle) : ctx_(ctx), handle_(handle) {}

Worker::~Worker() {
  if (ctx_.transport() == Transport::kRdma) g_pinned_workers.fetch_sub(1);
  listener_.reset();  // closes the endpoints it accepted
  soft_.reset();      // its handlers and replies use the worker
  handle_.reset();    // before the AM handlers it may still point to
  kept_.clear();      // buffers of requests that ended with the worker
}

void Worker::keep(std::shared_ptr<const void> buffer) {
  std::lock_guard lock(kept_mutex_);
  kept_.push_back(std::move(buffer));
}

unsigned Worker::progress() {
  const auto t0 = std::chrono::steady_clock::now();
  const unsigned n = ucp_worker_progress(handle());
  if (soft_) soft_->reap();
  if (listener_) listener_->reap();
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
  g_counters.progress_calls.fetch_add(1, std::memory_order_relaxed);
  g_counters.progress_ns.fetch_add(uint64_t(ns), std::memory_order_relaxed);
  if (n != 0) g_counters.progress_useful.fetch_add(1, std::memory_order_relaxed);
  return n;
}

unsigned Worker::progress_setup() {
  const unsigned n = ucp_worker_progress(handle());
  if (soft_) soft_->reap();
  g_counters.setup_progress_calls.fetch_add(1, std::memory_order_relaxed);
  return n;
}

Status Worker::fence() { return from_ucs(ucp_worker_fence(handle()), "ucp_worker_fence"); }

Status Worker::wait_for_event(std::chrono::microseconds timeout) {
  if (event_fd_ < 0) return {Code::kInvalidArgument, "worker created without wakeup"};
  // Drain everything first; arm only when UCX says it is idle (UCS_ERR_BUSY means: progress more).
  bool worked = false;
  while (progress() != 0) worked = true;
  if (worked) return Status::ok();
  ucs_status_t st = ucp_worker_arm(handle());
  if (st == UCS_ERR_BUSY) return Status::ok();
  if (st != UCS_OK) return from_ucs(st, "ucp_worker_arm");
  pollfd pfd{event_fd_, POLLIN, 0};
  // ppoll counts microseconds: the short waits of PollBackoff::pause(worker) sleep as long as
  // asked (a millisecond poll() would round them up to 1 ms), and a zero timeout is not asked for.
  const auto us = std::max<int64_t>(1, timeout.count());
  const timespec ts{static_cast<time_t>(us / 1000000), static_cast<long>(us % 1000000) * 1000};
  int rc = ::ppoll(&pfd, 1, &ts, nullptr);
  if (rc < 0 && errno != EINTR) return {Code::kTransportError, std::string("poll: ") + strerror(errno)};
  return Status::ok();
}

void Worker::wait_or_sleep(std::chrono::microseconds timeout) {
  if (!wait_for_event(timeout).is_ok()) std::this_thread::sleep_for(timeout);
}

void Worker::signal() { ucp_worker_signal(handle()); }

void Worker::note_completion(std::chrono::nanoseconds sample) {
  const auto typical = wait_policy::update_typical(typical_completion(), sample);
  typical_completion_ns_.store(typical.count(), std::memory_order_relaxed);
}

Status Worker::am_reply(ReplyEp to, unsigned id, const void* header, size_t header_len, Request* req) {
  if (!to) return {Code::kPeerGone, "no reply endpoint"};
  ucp_request_param_t param{};
  g_counters.am_sends.fetch_add(1, std::memory_order_relaxed);
  return track(ucp_am_send_nbx(to.ep, id, header, header_len, nullptr, 0, &param), "ucp_am_send_nbx (reply)", req);
}

Status Worker::tag_recv(void* dst, size_t length, uint64_t tag, TagReceive* out) {
  *out = TagReceive();
  // Always a request, also when the message is already here: then it is complete at once and
  // check() reads its length (the immediate-completion path of UCX 1.13 left the length unset).
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  g_counters.tag_receives.fetch_add(1, std::memory_order_relaxed);
  ucs_status_ptr_t p = ucp_tag_recv_nbx(handle(), dst, length, tag, ~uint64_t(0), &param);
  if (UCS_PTR_IS_ERR(p)) return from_ucs(UCS_PTR_STATUS(p), "ucp_tag_recv_nbx");
  if (p == nullptr) return {Code::kTransportError, "ucp_tag_recv_nbx returned no request"};
  op_started();
  out->req_ = p;
  out->worker_ = handle();
  // Complete already: it matched a message that was waiting in UCX's unexpected queue, i.e.
  // one sent before this receive was posted.
  if (ucp_request_check_status(p) != UCS_INPROGRESS) {
    out->unexpected_ = true;
    g_counters.tag_unexpected.fetch_add(1, std::memory_order_relaxed);
  }
  return Status::ok();
}

Status Worker::set_am_handler(unsigned id, AmHandler handler, AmRegistration* out) {
  out->reset();  // first: it may hold this very id
  SLOTSTREAM_RETURN_IF_ERROR(install_am_handler(id, std::move(handler)));
  out->worker_ = this;
  out->id_ = id;
  return Status::ok();
}

void AmRegistration::reset() {
  if (worker_ == nullptr) return;
  // A no-op rather than no handler: UCX warns about every message for an id without one.
  Status st = std::exchange(worker_, nullptr)
                  ->install_am_handler(id_, [](std::span<const std::byte>, std::span<const std::byte>, ReplyEp) {});
  if (!st.is_ok()) spdlog::warn("unhooking active-message handler {}: {}", id_, st.to_string());
}

Status Worker::install_am_handler(unsigned id, AmHandler handler) {
  am_handlers_.push_back(std::make_unique<AmHandler>(std::move(handler)));
  ucp_am_handler_param_t param{};
  param.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG;
  param.id = id;
  param.arg = am_handlers_.back().get();
  param.cb = [](void* arg, const void* header, size_t header_len, void* data, size_t length,
                const ucp_am_recv_param_t* recv) -> ucs_status_t {
    auto& fn = *static_cast<AmHandler*>(arg);
    g_counters.am_received.fetch_add(1, std::memory_order_relaxed);
    // Protocols in slotstream send small notifications only; rendezvous data is not expected.
    if (recv->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) return UCS_OK;
    ReplyEp reply;
    if (recv->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) reply.ep = recv->reply_ep;
    fn({static_cast<const std::byte*>(header), header_len}, {static_cast<const std::byte*>(data), length}, reply);
    return UCS_OK;
  };
  return from_ucs(ucp_worker_set_am_recv_handler(handle(), &param), "ucp_worker_set_am_recv_handler");
}

// --------------------------------------------------------------------------- ProgressThread
struct ProgressThread::Impl {
  Worker& worker;
  std::atomic<bool> stop{false};
  std::mutex mutex;
  std::condition_variable resume;
  int drivers = 0;                  // Drivers holding the worker (guarded by mutex)
  std::atomic<uint64_t> driven{0};  // Driver::poll calls
  std::atomic<uint64_t> turns{0};   // this thread's event waits (turns())
  std::thread thread;
  explicit Impl(Worker& w) : worker(w) {
    thread = std::thread([this] {
      uint64_t seen = 0;
      while (!stop.load(std::memory_order_acquire)) {
        // Alone: wait for events up to a second. Standing in for a Driver that stopped polling:
        // only until the next look.
        std::chrono::microseconds wait = std::chrono::seconds(1);
        {
          std::unique_lock lock(mutex);
          // Standing down; every kDriverLook it looks whether the Drivers still poll: one that is
          // busy elsewhere (its sink's write) would leave every other session's data unplaced.
          const bool stood_down = resume.wait_for(
              lock, kDriverLook, [this] { return drivers == 0 || stop.load(std::memory_order_acquire); });
          if (!stood_down) {
            const uint64_t now = driven.load(std::memory_order_relaxed);
            if (now != std::exchange(seen, now)) continue;  // polled since the last look
            wait = kDriverLook;
          }
        }
        if (stop.load(std::memory_order_acquire)) break;
        turns.fetch_add(1, std::memory_order_relaxed);
        // A Driver taking over meanwhile costs one wake-up at most: the next event ends this wait.
        Status st = worker.wait_for_event(wait);
        if (!st.is_ok()) {
          spdlog::error("receiver progress thread: {}", st.to_string());
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      }
    });
  }
};

ProgressThread::ProgressThread(Worker& worker) : impl_(std::make_unique<Impl>(worker)) {}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stop.store(true, std::memory_order_release);
  }
  impl_->resume.notify_one();
  impl_->worker.signal();
  impl_->thread.join();
}

unsigned ProgressThread::Driver::poll() {
  if (thread_ == nullptr) return 0;
  if (!held_) {
    std::lock_guard lock(thread_->impl_->mutex);
    ++thread_->impl_->drivers;
    held_ = true;
  }
  thread_->impl_->driven.fetch_add(1, std::memory_order_relaxed);
  return thread_->impl_->worker.progress();
}

uint64_t ProgressThread::turns() const { return impl_->turns.load(std::memory_order_relaxed); }

void ProgressThread::Driver::release() {
  if (!held_) return;
  held_ = false;
  bool last = false;
  {
    std::lock_guard lock(thread_->impl_->mutex);
    last = --thread_->impl_->drivers == 0;
  }
  if (last) thread_->impl_->resume.notify_one();
}

}  // namespace slotstream::fabric
