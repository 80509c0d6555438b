// Prometheus metrics for `slotstream recv --metrics HOST:PORT`: /metrics (text exposition) and
// /health ("ok"), served by prometheus-cpp's pull exposer (civetweb, a pool of threads with a
// bounded request time, so idle or slow connections cannot starve the liveness probe).
//
// Series exist only for accepted senders: the live ones come from Receiver::live_sessions() and
// the ended ones from on_session_end, and neither ever sees a sender that was refused. An ended
// sender's series stay for a grace period (a scraper sees its last counts), then go.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <prometheus/metric_family.h>

#include "pipeline/worker_manager.h"
#include "slotstream/slotstream.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace slotstream::tools {

using MetricsClock = std::chrono::steady_clock;
// Every metric family of a receiver, read at scrape time (label values are escaped by prometheus-cpp).
using CollectFn = std::function<std::vector<prometheus::MetricFamily>()>;

// One sample of a counter or gauge family.
prometheus::ClientMetric sample(std::vector<prometheus::ClientMetric::Label> labels, prometheus::MetricType type,
                                double value);

// Counters of senders that have ended (Prometheus counters never go back), plus the live ones
// read from the Receiver at scrape time. Threading: any thread (one mutex).
class MetricsState {
 public:
  // `prune_after`: how long an ended sender's series stay when it does not come back.
  explicit MetricsState(std::chrono::seconds prune_after = std::chrono::minutes(5)) : prune_after_(prune_after) {}
  // From Receiver's on_session_end. Reports of senders that were never accepted are ignored.
  void session_ended(const SessionReport& r);
  // Every metric family, now (for the exposer, or a test).
  std::vector<prometheus::MetricFamily> collect(const Receiver& rx, const pipeline::WorkerManager* workers,
                                                MetricsClock::time_point now = MetricsClock::now());

 private:
  struct Ended {
    SessionReport totals;           // every ended connection of this name, merged
    MetricsClock::time_point last;  // when the last one ended
  };
  std::mutex mutex_;
  std::chrono::seconds prune_after_;
  std::map<std::string, Ended> ended_;  // by sender name
  // What each counter series last showed, so that it never goes back: a lane that has just ended
  // is, for a moment, in neither the live view nor the ended totals (see collect()).
  std::map<std::string, double> last_;
  uint64_t sessions_ended_ = 0;
};

class MetricsServer {
 public:
  // Serves /metrics and /health on HOST:PORT (port 0: any free port, see address()).
  static Status start(const std::string& address, const Receiver& rx, MetricsState& state,
                      const pipeline::WorkerManager* workers, std::unique_ptr<MetricsServer>* out);
  // Serves what `collect` returns on /metrics (the datagram receiver's; called on the server's
  // threads, possibly two at once, so `collect` must be safe to call concurrently).
  static Status start(const std::string& address, CollectFn collect, std::unique_ptr<MetricsServer>* out);
  ~MetricsServer();
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<void> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
};

}  // namespace slotstream::tools
