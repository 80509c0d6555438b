// Prometheus metrics for `slotstream recv --metrics HOST:PORT`: /metrics (text exposition), /health
// (liveness) and /ready (readiness), both JSON, served by prometheus-cpp's pull exposer (civetweb,
// a pool of threads with a bounded request time, so idle or slow connections cannot starve the
// probes). Every /metrics also carries the process metrics and slotstream_build_info
// (process_metrics.h).
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
#include <nlohmann/json.hpp>

#include "slotstream/slotstream.h"
#include "slotstream/workers.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace slotstream::tools {

using MetricsClock = std::chrono::steady_clock;
// Every metric family of a receiver, read at scrape time (label values are escaped by prometheus-cpp).
using CollectFn = std::function<std::vector<prometheus::MetricFamily>()>;

// What /ready answers: 200 with {"ready": true, "checks": ...} or 503 with "ready": false. Each
// check is {"ok": bool, "detail": text}.
struct Readiness {
  bool ready = true;
  nlohmann::json checks = nlohmann::json::object();
  void check(const std::string& name, bool ok, const std::string& detail);
};
// Called on the server's threads (possibly two at once).
using ReadyFn = std::function<Readiness()>;

// The receiver's readiness: its control listener accepts, `out` takes a file (a real write and
// delete, so a read-only, full or vanished directory shows; empty `out`: nothing is stored), and
// every worker it started is running (not waiting to be restarted after a crash).
Readiness receiver_readiness(const Receiver& rx, const std::string& out, const DirectoryWorkers* workers);
// The output directory part alone (the datagram receiver's /ready: it serves while it runs).
Readiness store_readiness(const std::string& out);
// `dir` takes a new file now (created, written, deleted). Empty: why not. Any thread.
std::string probe_writable(const std::string& dir);

// One sample of a counter or gauge family.
prometheus::ClientMetric sample(std::vector<prometheus::ClientMetric::Label> labels, prometheus::MetricType type,
                                double value);

// Families a receiver shows beyond the ones every receiver has (the datagram receiver's, from
// engine/dgram/recv/report.h): per-device counters of DeviceStats, and per-sender counters read from a
// SessionReport's protocol_counters.
struct ExtraFamilies {
  struct Device {
    const char* name;
    const char* help;
    uint64_t DeviceStats::*field;
  };
  struct Counter {
    std::string key;  // of SessionReport::protocol_counters
    std::string name;
    std::string help;
  };
  std::vector<Device> per_device;
  std::vector<Counter> per_sender;
};

// Counters of senders that have ended (Prometheus counters never go back), plus the live ones
// read from the receiver at scrape time: one collector for the block receiver and the datagram
// receiver, whose reports are the same SessionReport. Threading: any thread (one mutex).
class MetricsState {
 public:
  // `prune_after`: how long an ended sender's series stay when it does not come back.
  explicit MetricsState(std::chrono::seconds prune_after = std::chrono::minutes(5), ExtraFamilies extra = {})
      : prune_after_(prune_after),
        extra_(std::move(extra)) {}
  // From the receiver's on_session_end. Reports of senders that were never accepted are ignored.
  void session_ended(const SessionReport& r);
  // Every metric family, now (for the exposer, or a test): `live` is the receiver's live_sessions().
  std::vector<prometheus::MetricFamily> collect(const std::vector<SessionReport>& live, const DirectoryWorkers* workers,
                                                MetricsClock::time_point now = MetricsClock::now());
  // The same for a block receiver, with its refusal counters.
  std::vector<prometheus::MetricFamily> collect(const Receiver& rx, const DirectoryWorkers* workers,
                                                MetricsClock::time_point now = MetricsClock::now());

 private:
  struct Ended {
    SessionReport totals;           // every ended connection of this name, merged
    MetricsClock::time_point last;  // when the last one ended
  };
  using Totals = std::map<std::string, SessionReport>;  // by sender name
  Totals totals(const std::vector<SessionReport>& live, MetricsClock::time_point now);
  double monotonic(const std::string& sender, const std::string& family, const std::string& device, double value);
  void device_families(const Totals& totals, std::vector<prometheus::MetricFamily>* out);
  prometheus::MetricFamily store_latency_family(const Totals& totals);
  void sender_families(const Totals& totals, const std::vector<SessionReport>& live,
                       std::vector<prometheus::MetricFamily>* out);

  std::mutex mutex_;
  std::chrono::seconds prune_after_;
  ExtraFamilies extra_;
  std::map<std::string, Ended> ended_;  // by sender name
  // What each counter series last showed, so that it never goes back: a lane that has just ended
  // is, for a moment, in neither the live view nor the ended totals (see collect()).
  std::map<std::string, double> last_;
  uint64_t sessions_ended_ = 0;
};

class MetricsServer {
 public:
  // Serves /metrics, /health and /ready on HOST:PORT (port 0: any free port, see address()).
  static Status start(const std::string& address, const Receiver& rx, MetricsState& state,
                      const DirectoryWorkers* workers, ReadyFn ready, std::unique_ptr<MetricsServer>* out);
  // Serves what `collect` returns on /metrics (called on the server's threads, possibly two at
  // once, so `collect` must be safe to call concurrently), and what `ready` says on /ready (none:
  // ready while serving).
  static Status start(const std::string& address, CollectFn collect, std::unique_ptr<MetricsServer>* out,
                      ReadyFn ready = {});
  ~MetricsServer();
  const std::string& address() const { return address_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<void> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::string address_;
  int port_ = 0;
};

}  // namespace slotstream::tools
