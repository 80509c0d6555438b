// Replies (ACKs, credits) that a receiver sends from its consumer thread on the sender's reply
// endpoint: UCX may keep a reply's header until its request completes (e.g. the shared-memory
// FIFO to the sender is full), so the header lives here until then. Used by the protocols with
// two-sided notifications (sliding_window, packed_ring, nic_assisted; credit's updates go on an
// endpoint of the receiver's own).
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <thread>
#include <utility>

#include "engine/ucx/fabric/fabric.h"

namespace slotstream::protocol {

// Threading: the thread that progresses `worker` (the session's consumer).
template <class Header>
class ReplyQueue {
 public:
  explicit ReplyQueue(fabric::Worker& worker) : worker_(worker) {}
  ReplyQueue(const ReplyQueue&) = delete;
  ReplyQueue& operator=(const ReplyQueue&) = delete;
  // Gives the last replies a moment to leave; a header whose reply is still stuck (the sender is
  // gone) stays with the worker until it is destroyed, not freed under UCX.
  ~ReplyQueue() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(50);
    while (!pending_.empty() && std::chrono::steady_clock::now() < deadline) {
      worker_.progress();
      reap();
      if (!pending_.empty()) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    for (auto& p : pending_) worker_.keep_until_destroyed(std::move(p.second));
  }

  // Sends `header` as active message `id`; if it cannot leave at once, the next progress pushes it.
  Status send(fabric::ReplyEp to, unsigned id, const Header& header) {
    bool queued = false;
    return send_with(
        header, [&](const Header* h, fabric::Request* req) { return worker_.am_reply(to, id, h, sizeof(Header), req); },
        &queued);
  }
  // The same on an endpoint of the receiver's own; `*queued`: it waits for progress to leave.
  Status send(fabric::Endpoint& to, unsigned id, const Header& header, bool* queued) {
    return send_with(
        header,
        [&](const Header* h, fabric::Request* req) {
          return to.am_send(id, h, sizeof(Header), nullptr, 0, false, req);
        },
        queued);
  }

  // Frees the headers of replies that have left.
  void reap() {
    while (!pending_.empty() && pending_.front().first.check().code() != Code::kInProgress) pending_.pop_front();
  }

 private:
  template <class SendFn>
  Status send_with(const Header& header, SendFn send, bool* queued) {
    auto h = std::make_unique<Header>(header);
    fabric::Request req;
    Status st = send(h.get(), &req);
    *queued = req.pending();
    if (*queued) pending_.push_back({std::move(req), std::move(h)});
    reap();
    return st;
  }

  fabric::Worker& worker_;
  std::deque<std::pair<fabric::Request, std::unique_ptr<Header>>> pending_;
};

}  // namespace slotstream::protocol
