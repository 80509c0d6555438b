#include "engine/dgram/recv/store_queue.h"

#include <chrono>

#include "clock.h"

namespace slotstream::dgram {
namespace {
// A paused device's messages, and a failing store, are tried again this often.
constexpr int64_t kRetryNs = 100'000'000;
}  // namespace

bool StoreState::paused(uint16_t device) const {
  if (!any_paused()) return false;
  std::lock_guard lock(mu_);
  auto it = pauses_.find(device);
  return it != pauses_.end() && it->second.now;
}

std::map<uint16_t, StoreState::Pause> StoreState::pauses() const {
  std::lock_guard lock(mu_);
  return pauses_;
}

void StoreState::set_paused(uint16_t device, bool on) {
  std::lock_guard lock(mu_);
  Pause& p = pauses_[device];
  if (p.now == on) return;
  p.now = on;
  p.count += on;
  paused_devices_ += on ? 1 : -1;
}

StoreQueue::StoreQueue(EventLog& log, std::function<void()> wake) : log_(log), wake_(std::move(wake)) {}

StoreQueue::~StoreQueue() { stop(); }

void StoreQueue::start() {
  thread_ = std::thread([this] { run(); });
}

void StoreQueue::stop() {
  stopping_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void StoreQueue::push(std::shared_ptr<StoreState> s, Session::Ready r) {
  if (!s->store_) return;
  Item w;
  w.bytes = r.completion.data.size();
  w.delivered.device = r.device;
  w.delivered.msn = r.msn;
  w.delivered.partial = r.partial;
  w.delivered.length_known = r.completion.length_known;
  w.delivered.first_ns = r.completion.first_ns;
  w.delivered.done_ns = r.completion.done_ns;
  w.completion = std::move(r.completion);
  w.state = std::move(s);
  enqueue(std::move(w));
}

void StoreQueue::push_fin(std::shared_ptr<StoreState> s) {
  Item w;
  w.state = std::move(s);
  w.fin_marker = true;
  enqueue(std::move(w));
}

void StoreQueue::enqueue(Item w) {
  w.state->backlog_ += w.bytes;
  backlog_ += w.bytes;
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(w));
  }
  cv_.notify_one();
}

void StoreQueue::run() {
  Item w;
  while (next(&w)) {
    handle(w);
    if (!parked_.empty() && now_ns() >= next_retry_ns_) retry_parked();
  }
}

// The next item; false once stopping. Wakes up for the retries while devices are paused.
bool StoreQueue::next(Item* w) {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      auto ready = [&] { return !queue_.empty() || stopping_.load(); };
      if (parked_.empty()) {
        cv_.wait(lock, ready);
      } else {
        cv_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(0, next_retry_ns_ - now_ns())), ready);
      }
      if (stopping_) return false;
      if (!queue_.empty()) {
        *w = std::move(queue_.front());
        queue_.pop_front();
        return true;
      }
    }
    retry_parked();
  }
}

void StoreQueue::handle(Item& w) {
  auto parked = parked_.find(w.state.get());
  if (w.fin_marker) {
    if (parked == parked_.end()) return finish_fin(w);
    parked->second.fin = std::move(w);  // reached once everything before it is stored
    return;
  }
  if (parked != parked_.end()) {
    auto dev = parked->second.devices.find(w.delivered.device);
    if (dev != parked->second.devices.end()) return dev->second.push_back(std::move(w));  // keeps its order
  }
  const Status st = attempt(w);
  if (st.code() != Code::kBusy) return done(w);
  // The device is paused: its messages wait, in order; the others go on.
  w.state->set_paused(w.delivered.device, true);
  log_("pause", "sender " + w.state->name() + ": device " + std::to_string(w.delivered.device) +
                    " paused while its store is busy (" + st.message() + ")");
  if (next_retry_ns_ < now_ns()) next_retry_ns_ = now_ns() + kRetryNs;
  parked_[w.state.get()].devices[w.delivered.device].push_back(std::move(w));
}

// Stores one message: ok, or kBusy (the device is paused). Any other failure is retried here every
// 100 ms (reported once): it concerns every session (a full disk), and the data waits.
Status StoreQueue::attempt(Item& w) {
  w.delivered.data = w.completion.data;
  w.delivered.valid = &w.completion.valid;
  bool reported = false;
  for (;;) {
    Status st = w.state->store_->store(w.delivered);
    if (st.is_ok() || st.code() == Code::kBusy || stopping_) return st;
    if (!reported) {
      log_("store",
           "cannot store a message of sender " + w.state->name() + " (retrying every 100 ms): " + st.message());
      reported = true;
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(kRetryNs));
  }
}

void StoreQueue::done(Item& w) {
  w.state->backlog_ -= w.bytes;
  backlog_ -= w.bytes;
}

void StoreQueue::finish_fin(Item& w) {
  w.state->stored_all_ = true;
  if (wake_) wake_();
}

void StoreQueue::retry_parked() {
  next_retry_ns_ = now_ns() + kRetryNs;
  for (auto it = parked_.begin(); it != parked_.end() && !stopping_;) {
    Parked& p = it->second;
    for (auto dev = p.devices.begin(); dev != p.devices.end();) {
      if (!retry_device(dev->second)) {
        ++dev;
        continue;
      }
      it->first->set_paused(dev->first, false);
      dev = p.devices.erase(dev);
    }
    if (!p.devices.empty()) {
      ++it;
      continue;
    }
    if (p.fin) finish_fin(*p.fin);
    it = parked_.erase(it);
  }
}

// Stores a paused device's messages in order while its store takes them; true once all are stored.
bool StoreQueue::retry_device(std::deque<Item>& items) {
  while (!items.empty() && !stopping_) {
    if (attempt(items.front()).code() == Code::kBusy) return false;
    done(items.front());
    items.pop_front();
  }
  return items.empty();
}

}  // namespace slotstream::dgram
