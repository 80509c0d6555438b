// Prometheus metrics for `slotstream recv --metrics HOST:PORT` (/metrics, /health).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "net/control_socket.h"
#include "pipeline/worker_manager.h"
#include "slotstream/slotstream.h"

namespace slotstream::tools {

// A Prometheus label value: quotes and backslashes escaped.
std::string label(const std::string& value);

// Counters of senders that have ended (Prometheus counters never go back), plus the live ones
// read from the Receiver at scrape time.
class MetricsState {
 public:
  void session_ended(const SessionReport& r);
  std::string render(const Receiver& rx, const pipeline::WorkerManager* workers) const;

 private:
  struct Totals {
    std::map<uint16_t, DeviceStats> per_device;
    uint64_t stalls = 0;
    void add(const SessionReport& r);
  };
  mutable std::mutex mutex_;
  std::map<std::string, Totals> ended_;
  uint64_t sessions_ended_ = 0;
};

class MetricsServer {
 public:
  static Status start(const std::string& address, const Receiver& rx, const MetricsState& state,
                      const pipeline::WorkerManager* workers, std::unique_ptr<MetricsServer>* out);
  // Serves what `render` returns (called on the server's thread) on /metrics.
  static Status start(const std::string& address, std::function<std::string()> render,
                      std::unique_ptr<MetricsServer>* out);
  ~MetricsServer();
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::unique_ptr<net::Listener> listener_;
  std::string address_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace slotstream::tools
