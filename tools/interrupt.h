// Ctrl-C for `slotstream send` (every transport, --platform too): the first SIGINT or SIGTERM asks it
// to finish — no new message is started, what was started is sent, the receiver confirms the end
// (FIN, FIN_ACK) and the summary is printed; exit 128 + the signal (130, 143). A second one, or one
// that comes before the connection is up (nothing to finish), ends the process at once, killed by
// that signal as without this (the receiver then discards a partial message and reports the
// sender lost).
#pragma once

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <string>
#include <thread>

namespace slotstream::tools {

// "SIGINT", "SIGTERM" (else "signal").
const char* signal_name(int sig);

class Interrupt {
 public:
  // Blocks SIGINT and SIGTERM in the calling thread, and so in every thread it starts from now on
  // (construct it before any), and watches for them in a thread of its own. `cmd` names the
  // command in its stderr lines ("send").
  explicit Interrupt(std::string cmd);
  ~Interrupt();  // stops watching; the signals stay blocked (the process is ending)
  Interrupt(const Interrupt&) = delete;
  Interrupt& operator=(const Interrupt&) = delete;

  // Connected: from now on the first signal asks to finish instead of ending the process.
  void arm() { armed_.store(true, std::memory_order_release); }
  // Set by the first signal once armed; what the producers poll between messages.
  const std::atomic<bool>& stop() const { return stop_; }
  bool requested() const { return stop_.load(std::memory_order_acquire); }
  int signal() const { return signal_.load(std::memory_order_acquire); }  // 0 when none came
  // 128 + the signal (the shell's convention for a command a signal ended), 0 when none came.
  int exit_code() const { return signal() ? 128 + signal() : 0; }

 private:
  void watch();
  [[noreturn]] void die(int sig, const std::string& why);
  std::string cmd_;
  sigset_t sigs_;
  std::atomic<bool> armed_{false};
  std::atomic<bool> stop_{false};
  std::atomic<int> signal_{0};
  std::atomic<bool> done_{false};
  std::thread watcher_;  // last: starts when everything above exists
};

}  // namespace slotstream::tools
