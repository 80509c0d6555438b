// What the protocols with two-sided notifications share (sliding_window, packed_ring,
// nic_assisted): routing notices that arrive at the receiver's shared worker to the receiver they
// name, and replies (ACKs) whose headers must outlive their requests.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "fabric/fabric.h"

namespace slotstream::protocol {

// The receiver's worker is shared by every connected sender and UCX takes one handler per AM id
// per worker, so a notice carries the session id its receiver handed out in the set-up, and the
// one handler routes it here. One router per protocol family, process-wide.
template <class Receiver>
class SessionRouter {
 public:
  uint64_t add(Receiver* r) {
    std::lock_guard lock(mutex_);
    const uint64_t id = next_++;
    sessions_[id] = r;
    return id;
  }
  void remove(uint64_t session) {
    std::lock_guard lock(mutex_);
    sessions_.erase(session);
  }
  // Runs fn(receiver) under the router's lock (so the receiver cannot go meanwhile); a notice for
  // no live session is counted as a stray.
  template <class Fn>
  void route(uint64_t session, Fn fn) {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(session);
    if (it == sessions_.end()) {
      ++strays_;
      return;
    }
    fn(*it->second);
  }
  void stray() { ++strays_; }  // a malformed notice
  uint64_t strays() const { return strays_.load(); }
  // Held while the one handler is registered on a worker.
  std::mutex& mutex() { return mutex_; }

 private:
  std::mutex mutex_;
  std::map<uint64_t, Receiver*> sessions_;
  uint64_t next_ = 1;
  std::atomic<uint64_t> strays_{0};
};

// Replies sent by a receiver's consumer thread on the sender's reply endpoint. UCX may keep a
// reply's header until its request completes (e.g. the shared-memory FIFO to the sender is full),
// so the header lives here until then. Consumer thread only.
template <class Header>
class ReplyQueue {
 public:
  ReplyQueue() = default;
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;
  // Gives the last replies a moment (the progress thread completes them); a header whose reply is
  // still stuck (the sender is gone) is leaked rather than freed under UCX.
  ~ReplyQueue() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (!pending_.empty() && std::chrono::steady_clock::now() < deadline) {
      reap();
      if (!pending_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (auto& p : pending_) (void)p.second.release();
  }

  Status send(fabric::Worker& worker, fabric::ReplyEp to, unsigned id, const Header& header) {
    auto h = std::make_unique<Header>(header);
    fabric::Request req;
    Status st = worker.am_reply(to, id, h.get(), sizeof(Header), &req);
    if (req.pending()) {
      // Queued, not sent: the consumer's own progress() pushes it on its next pass; wake the
      // progress thread too, which may be asleep in the kernel until its poll timeout.
      pending_.push_back({std::move(req), std::move(h)});
      worker.signal();
    }
    reap();
    return st;
  }

  void reap() {
    while (!pending_.empty() && pending_.front().first.check().code() != Code::kInProgress) pending_.pop_front();
  }

 private:
  std::deque<std::pair<fabric::Request, std::unique_ptr<Header>>> pending_;
};

}  // namespace slotstream::protocol
