// In-process per-device workers on zero-copy receive (include/slotstream/view_workers.h).
//
// One thread and one queue of views per (sender name, device), like the directory pipeline's one
// worker process per device (worker_manager.h), keyed by the sender's name so that a reconnecting
// sender's device keeps its worker. The session thread only queues a view (one lock, one notify);
// everything the worker does happens on its own thread, so one device's slow worker delays no
// other device's messages — until it holds as many blocks as the held limit allows.
#include "slotstream/view_workers.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

namespace slotstream {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kEventEvery{10};  // failure lines per device at most this often

// One device's worker: its queue, its thread, its counters.
struct DeviceQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<MessageView> queue;  // guarded by mu
  bool stopping = false;          // guarded by mu
  ViewWorkerStats stats;          // guarded by mu (stats.backlog is filled in by stats())
  // Worker thread only:
  bool failed_before = false;
  uint64_t failures_unreported = 0;
  Clock::time_point last_event{};
  std::thread thread;
};

}  // namespace

struct ViewWorkers::Impl : std::enable_shared_from_this<Impl> {
  ViewWorkersOptions options;
  mutable std::mutex mu;  // devices, stopped, and the idle wait
  mutable std::condition_variable idle_cv;
  std::map<std::pair<std::string, uint16_t>, std::shared_ptr<DeviceQueue>> devices;
  bool stopped = false;
  std::mutex stop_mu;                // one stop() at a time
  std::atomic<uint64_t> pending{0};  // views queued or being processed, all devices

  // The queue of (sender, device), its thread started on first use. *out stays null once stopped.
  Status device(const std::string& sender, uint16_t device, std::shared_ptr<DeviceQueue>* out) {
    std::lock_guard lock(mu);
    if (stopped) return {Code::kCancelled, "the view workers were stopped"};
    auto& q = devices[{sender, device}];
    if (q) {
      *out = q;
      return Status::ok();
    }
    auto fresh = std::make_shared<DeviceQueue>();
    fresh->stats.sender = sender;
    fresh->stats.device = device;
    try {
      fresh->thread = std::thread([self = shared_from_this(), raw = fresh.get()] { self->run(*raw); });
    } catch (const std::system_error& e) {
      devices.erase({sender, device});
      return {Code::kBusy, "could not start the worker thread of " + sender + " device " + std::to_string(device) +
                               " (" + e.what() + "); its messages wait"};
    }
    *out = q = std::move(fresh);
    return Status::ok();
  }

  Status take(DeviceQueue& q, MessageView& view) {
    std::lock_guard lock(q.mu);
    if (q.stopping) return {Code::kCancelled, "the view workers were stopped"};
    if (options.backlog_messages && q.queue.size() >= options.backlog_messages) {
      ++q.stats.busy;
      return {Code::kBusy, "the worker of " + q.stats.sender + " device " + std::to_string(q.stats.device) +
                               " is behind (" + std::to_string(q.queue.size()) + " messages queued)"};
    }
    pending.fetch_add(1, std::memory_order_relaxed);
    q.queue.push_back(std::move(view));
    q.cv.notify_one();
    return Status::ok();
  }

  // The device's worker thread: its views in order, one at a time, until stopped and drained.
  void run(DeviceQueue& q) {
    ViewWorker worker;
    for (;;) {
      MessageView view;
      {
        std::unique_lock lock(q.mu);
        q.cv.wait(lock, [&] { return !q.queue.empty() || q.stopping; });
        if (q.queue.empty()) break;
        view = std::move(q.queue.front());
        q.queue.pop_front();
      }
      const bool ok = process(q, worker, view);
      view.release();
      if (!ok) worker = nullptr;  // a failed worker goes, with every view it kept
      {
        std::lock_guard lock(q.mu);
        ++(ok ? q.stats.processed : q.stats.failed);
      }
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(mu);
        idle_cv.notify_all();
      }
    }
    worker = nullptr;  // what the worker kept is released on its own thread, before it ends
  }

  // Runs the worker (made first if there is none) on one view; false when it failed.
  bool process(DeviceQueue& q, ViewWorker& worker, MessageView& view) {
    const uint32_t packet = view.packet();
    std::string why;
    try {
      Status st;
      if (!worker) st = make(q, &worker);
      if (st.is_ok()) st = worker(view);
      if (!st.is_ok()) why = st.to_string();
    } catch (const std::exception& e) {
      why = std::string("threw: ") + e.what();
    } catch (...) {
      why = "threw a non-standard exception";
    }
    if (why.empty()) return true;
    report(q, packet, why);
    q.failed_before = true;
    return false;
  }

  Status make(DeviceQueue& q, ViewWorker* worker) {
    if (q.failed_before) {
      std::lock_guard lock(q.mu);
      ++q.stats.restarts;
    }
    SLOTSTREAM_RETURN_IF_ERROR(options.make_worker(q.stats.sender, q.stats.device, worker));
    if (!*worker) return {Code::kInvalidArgument, "make_worker made no worker"};
    return Status::ok();
  }

  void report(DeviceQueue& q, uint32_t packet, const std::string& why) {
    ++q.failures_unreported;
    const auto now = Clock::now();
    if (!options.on_event || now - q.last_event < kEventEvery) return;
    q.last_event = now;
    options.on_event("the view worker of " + q.stats.sender + " device " + std::to_string(q.stats.device) +
                     " failed on packet " + std::to_string(packet) + " (" + why + "); " +
                     std::to_string(q.failures_unreported) +
                     " failure(s) since the last report: each message's view was released and a fresh worker "
                     "takes the next one");
    q.failures_unreported = 0;
  }

  void stop() {
    std::lock_guard stopping(stop_mu);
    std::vector<std::shared_ptr<DeviceQueue>> all;
    {
      std::lock_guard lock(mu);
      stopped = true;
      for (auto& [key, q] : devices) all.push_back(q);
    }
    for (auto& q : all) {
      std::lock_guard lock(q->mu);
      q->stopping = true;
      q->cv.notify_all();
    }
    for (auto& q : all) {
      if (q->thread.joinable()) q->thread.join();
    }
  }
};

namespace {

// The receiver's ViewSink for one sender: routes each view to its device's queue.
class WorkerSink final : public ViewSink {
 public:
  WorkerSink(std::shared_ptr<ViewWorkers::Impl> impl, std::string sender)
      : impl_(std::move(impl)),
        sender_(std::move(sender)) {}
  Status take(MessageView& view) override {
    auto& q = queues_[view.device()];
    if (!q) SLOTSTREAM_RETURN_IF_ERROR(impl_->device(sender_, view.device(), &q));
    return impl_->take(*q, view);
  }

 private:
  std::shared_ptr<ViewWorkers::Impl> impl_;
  std::string sender_;
  std::map<uint16_t, std::shared_ptr<DeviceQueue>> queues_;  // this sender's, looked up once each
};

}  // namespace

Status ViewWorkers::start(ViewWorkersOptions options, std::unique_ptr<ViewWorkers>* out) {
  if (!options.make_worker) return {Code::kInvalidArgument, "ViewWorkersOptions::make_worker is not set"};
  auto impl = std::make_shared<Impl>();
  impl->options = std::move(options);
  out->reset(new ViewWorkers(std::move(impl)));
  return Status::ok();
}

ViewWorkers::~ViewWorkers() { stop(); }

std::function<Status(const SenderInfo&, std::unique_ptr<ViewSink>*)> ViewWorkers::view_sink() {
  return [impl = impl_](const SenderInfo& info, std::unique_ptr<ViewSink>* out) {
    *out = std::make_unique<WorkerSink>(impl, info.name);
    return Status::ok();
  };
}

bool ViewWorkers::idle() const { return impl_->pending.load(std::memory_order_acquire) == 0; }

bool ViewWorkers::wait_idle(std::chrono::milliseconds timeout) const {
  std::unique_lock lock(impl_->mu);
  return impl_->idle_cv.wait_for(lock, timeout, [&] { return idle(); });
}

void ViewWorkers::stop() { impl_->stop(); }

std::vector<ViewWorkerStats> ViewWorkers::stats() const {
  std::vector<std::shared_ptr<DeviceQueue>> all;
  {
    std::lock_guard lock(impl_->mu);
    for (auto& [key, q] : impl_->devices) all.push_back(q);
  }
  std::vector<ViewWorkerStats> out;
  for (auto& q : all) {
    std::lock_guard lock(q->mu);
    out.push_back(q->stats);
    out.back().backlog = q->queue.size();
  }
  return out;
}

}  // namespace slotstream
