#include "engine/dgram/recv/callback_thread.h"

namespace slotstream::dgram {

void CallbackThread::post(std::function<void()> f) {
  {
    std::lock_guard lock(mu_);
    if (!ended_) {
      queue_.push_back(std::move(f));
      cv_.notify_one();
      return;
    }
  }
  f();  // after stop(): nothing may be dropped, so here, in the caller's thread
}

void CallbackThread::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_one();
  }
  if (std::this_thread::get_id() == thread_.get_id()) return;
  std::lock_guard join(join_mu_);
  if (thread_.joinable()) thread_.join();
}

void CallbackThread::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping, and everything has run
    std::function<void()> f = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    f();
    lock.lock();
  }
  ended_ = true;
}

}  // namespace slotstream::dgram
