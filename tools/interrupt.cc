#include "interrupt.h"

#include <unistd.h>

#include <cstring>

#include "log.h"

namespace slotstream::tools {
const char* signal_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "signal"; }

Interrupt::Interrupt(std::string cmd) : cmd_(std::move(cmd)) {
  sigemptyset(&sigs_);
  sigaddset(&sigs_, SIGINT);
  sigaddset(&sigs_, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs_, nullptr);
  watcher_ = std::thread([this] { watch(); });
}

Interrupt::~Interrupt() {
  done_.store(true, std::memory_order_release);
  if (watcher_.joinable()) watcher_.join();
}

void Interrupt::watch() {
  while (!done_.load(std::memory_order_acquire)) {
    timespec tick{0, 100 * 1000 * 1000};
    const int sig = sigtimedwait(&sigs_, nullptr, &tick);
    if (sig != SIGINT && sig != SIGTERM) continue;
    if (!armed_.load(std::memory_order_acquire))
      die(sig, std::string(signal_name(sig)) + " before the connection was up");
    if (stop_.load(std::memory_order_acquire)) {
      die(sig, std::string("second ") + signal_name(sig) +
                   ": abandoning the stream (the receiver discards a partial message and reports this sender lost)");
    }
    signal_.store(sig, std::memory_order_release);
    stop_.store(true, std::memory_order_release);
    log_warning(std::string(signal_name(sig)) +
                ": finishing: no new message is started; what was sent is confirmed by the receiver, then the "
                "summary (" +
                (sig == SIGINT ? "Ctrl-C" : "the signal") + " again abandons it at once)");
  }
}

void Interrupt::die(int sig, const std::string& why) {
  log_warning(why + ": stopped");
  // Ended by the signal itself, as without this handling: the default action, unblocked here.
  ::signal(sig, SIG_DFL);
  sigset_t one;
  sigemptyset(&one);
  sigaddset(&one, sig);
  pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
  raise(sig);
  _exit(128 + sig);  // not reached
}

}  // namespace slotstream::tools
