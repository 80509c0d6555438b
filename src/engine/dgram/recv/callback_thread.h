// The datagram receiver's callbacks (on_session_end, on_event), in the order they were posted, on a thread
// of their own. The receiver has one network thread, which also answers every sender's FINs and repeats
// lost FIN_ACKs: a callback that blocked there (`slotstream recv --transport udp` prints each session's
// line to stdout, a pipe nobody may be reading; dgram-peer a report of thousands of messages) stopped it,
// and with it every sender's end handshake and every new session. Here a callback that blocks delays only
// the callbacks after it, which wait (one small report or line each) until it returns.
// Threading: post() and stop() from any thread, a callback's own included.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace slotstream::dgram {

class CallbackThread {
 public:
  CallbackThread() : thread_([this] { run(); }) {}
  ~CallbackThread() { stop(); }
  CallbackThread(const CallbackThread&) = delete;
  CallbackThread& operator=(const CallbackThread&) = delete;

  // Runs `f` after everything posted before it. After stop(): at once, in the caller's thread, for nothing
  // may be dropped.
  void post(std::function<void()> f);
  // Runs everything posted so far, then ends; again: nothing. From a callback (DatagramReceiver::stop() in
  // on_session_end) it cannot wait for itself: the thread ends once that callback and the rest have run,
  // and the destructor joins it.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stopping_ = false;
  bool ended_ = false;
  std::mutex join_mu_;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace slotstream::dgram
