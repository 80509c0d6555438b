// `recv --metrics HOST:PORT`: the receiver's counters as Prometheus metric families, served by
// prometheus-cpp's exposer (/metrics) with a /health answer of our own (civetweb's begin_request).
#include "metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <CivetServer.h>
#include <civetweb.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "net/control_socket.h"

namespace slotstream::tools {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// civetweb serves each connection on one thread of a fixed pool until the request is read, so
// the pool size and the request deadline bound what idle or slow clients can hold up: with 200
// idle connections, /health waits at most about (200 / kServerThreads) x kRequestTimeoutMs.
// Prometheus sends its request right after connecting; 250 ms is ample on a data-centre network.
constexpr int kServerThreads = 64;
constexpr int kRequestTimeoutMs = 250;

// A sender was accepted iff its report carries its declared devices: the receiver creates the
// per-device counters when it accepts, and a sender must declare at least one device. A sender
// refused after authentication (memory budget, failed set-up) ends with none.
bool accepted(const SessionReport& r) { return !r.per_device.empty(); }

// Series exist only for devices that have carried data (or been paused, or lost messages): a hello may declare up to
// 4,096 devices, and 100 of them made 2 million series (issue 19) that no stream ever fed.
bool carried_data(const DeviceStats& s) {
  return s.messages || s.bytes || s.gaps || s.duplicates || s.partial || s.dropped || s.lost || s.pauses || s.paused;
}

int serve_health(mg_connection* conn) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (!req || !req->local_uri || std::strcmp(req->local_uri, "/health") != 0) return 0;  // civetweb's turn
  static const char kReply[] =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n";
  mg_write(conn, kReply, sizeof kReply - 1);
  return 200;
}

}  // namespace

ClientMetric sample(std::vector<ClientMetric::Label> labels, MetricType type, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  (type == MetricType::Counter ? m.counter.value : m.gauge.value) = value;
  return m;
}

void MetricsState::session_ended(const SessionReport& r) {
  if (!accepted(r)) return;
  std::lock_guard lock(mutex_);
  auto [it, fresh] = ended_.try_emplace(r.sender.name, Ended{r, MetricsClock::now()});
  if (!fresh) {
    it->second.totals.merge(r);
    it->second.last = MetricsClock::now();
  }
  ++sessions_ended_;
}

namespace {

void worker_families(const pipeline::WorkerManager& workers, std::vector<MetricFamily>* out) {
  const auto ws = workers.stats();
  struct Worker {
    const char* name;
    MetricType type;
    const char* help;
    uint64_t pipeline::WorkerStats::*field;
  };
  for (Worker w : {Worker{"slotstream_worker_backlog_messages", MetricType::Gauge,
                          "Stored messages the worker has not finished.", &pipeline::WorkerStats::backlog_messages},
                   Worker{"slotstream_worker_backlog_bytes", MetricType::Gauge, "Bytes of those messages.",
                          &pipeline::WorkerStats::backlog_bytes},
                   Worker{"slotstream_worker_processed_total", MetricType::Counter,
                          "Messages the worker recorded as done.", &pipeline::WorkerStats::processed},
                   Worker{"slotstream_worker_restarts_total", MetricType::Counter, "Times the worker was restarted.",
                          &pipeline::WorkerStats::restarts}}) {
    MetricFamily f{w.name, w.help, w.type, {}};
    for (const auto& s : ws) {
      f.metric.push_back(
          sample({{"sender", s.sender}, {"device", std::to_string(s.device)}}, w.type, double(s.*w.field)));
    }
    out->push_back(std::move(f));
  }
  MetricFamily running{"slotstream_worker_running", "1 while the worker process runs.", MetricType::Gauge, {}};
  for (const auto& s : ws) {
    running.metric.push_back(
        sample({{"sender", s.sender}, {"device", std::to_string(s.device)}}, MetricType::Gauge, s.running ? 1 : 0));
  }
  out->push_back(std::move(running));
}

}  // namespace

MetricsState::Totals MetricsState::totals(const std::vector<SessionReport>& live, MetricsClock::time_point now) {
  // Per sender name: what has ended, merged with what is live now.
  Totals totals;
  for (auto it = ended_.begin(); it != ended_.end();) {
    const std::string& name = it->first;
    const bool back =
        std::any_of(live.begin(), live.end(), [&](const SessionReport& r) { return r.sender.name == name; });
    if (!back && now - it->second.last >= prune_after_) {
      // Gone for the grace period: its series go too (a later sender of this name starts at 0).
      std::erase_if(last_, [&](const auto& kv) { return kv.first.starts_with(name + '\n'); });
      it = ended_.erase(it);
      continue;
    }
    totals[name] = it->second.totals;
    ++it;
  }
  for (const SessionReport& r : live) {
    auto [it, fresh] = totals.try_emplace(r.sender.name, r);
    if (!fresh) it->second.merge(r);
  }
  return totals;
}

// A counter never goes back within a series' life (see last_).
double MetricsState::monotonic(const std::string& sender, const std::string& family, const std::string& device,
                               double value) {
  double& seen = last_[sender + '\n' + family + '\n' + device];
  seen = std::max(seen, value);
  return seen;
}

void MetricsState::device_families(const Totals& totals, std::vector<MetricFamily>* out) {
  std::vector<ExtraFamilies::Device> families = {
      {"slotstream_messages_total", "Complete messages stored.", &DeviceStats::messages},
      {"slotstream_bytes_total", "Payload bytes of stored messages.", &DeviceStats::bytes},
      {"slotstream_gaps_total", "Packets (datagram: messages) that never arrived.", &DeviceStats::gaps},
      {"slotstream_duplicates_total", "Duplicate packets (datagram: segments) dropped.", &DeviceStats::duplicates},
      {"slotstream_device_pauses_total", "Times a device was paused because its worker was behind.",
       &DeviceStats::pauses}};
  families.insert(families.end(), extra_.per_device.begin(), extra_.per_device.end());
  for (const auto& c : families) {
    MetricFamily f{c.name, c.help, MetricType::Counter, {}};
    for (const auto& [sender, t] : totals) {
      for (const auto& [d, s] : t.per_device) {
        if (!carried_data(s)) continue;
        const std::string device = std::to_string(d);
        f.metric.push_back(sample({{"sender", sender}, {"device", device}}, MetricType::Counter,
                                  monotonic(sender, c.name, device, double(s.*c.field))));
      }
    }
    out->push_back(std::move(f));
  }
}

void MetricsState::sender_families(const Totals& totals, const std::vector<SessionReport>& live,
                                   std::vector<MetricFamily>* out) {
  MetricFamily paused{
      "slotstream_device_paused", "1 while the device is paused (its worker is behind).", MetricType::Gauge, {}};
  for (const SessionReport& r : live) {
    for (const auto& [d, s] : r.per_device) {
      if (!carried_data(s)) continue;
      paused.metric.push_back(
          sample({{"sender", r.sender.name}, {"device", std::to_string(d)}}, MetricType::Gauge, s.paused ? 1 : 0));
    }
  }
  out->push_back(std::move(paused));
  MetricFamily stalls{"slotstream_stalls_total",
                      "Times the receiver refused data (a full disk, or a device paused).",
                      MetricType::Counter,
                      {}};
  for (const auto& [sender, t] : totals) {
    stalls.metric.push_back(sample({{"sender", sender}}, MetricType::Counter,
                                   monotonic(sender, "slotstream_stalls_total", "", double(t.stalls))));
  }
  out->push_back(std::move(stalls));
  for (const auto& c : extra_.per_sender) {
    MetricFamily f{c.name, c.help, MetricType::Counter, {}};
    for (const auto& [sender, t] : totals) {
      const auto it = t.protocol_counters.find(c.key);
      const double v = it == t.protocol_counters.end() ? 0 : double(it->second);
      f.metric.push_back(sample({{"sender", sender}}, MetricType::Counter, monotonic(sender, c.name, "", v)));
    }
    out->push_back(std::move(f));
  }
}

std::vector<MetricFamily> MetricsState::collect(const std::vector<SessionReport>& live,
                                                const pipeline::WorkerManager* workers, MetricsClock::time_point now) {
  std::lock_guard lock(mutex_);
  const Totals all = totals(live, now);
  std::vector<MetricFamily> out;
  device_families(all, &out);
  sender_families(all, live, &out);

  MetricFamily held{"slotstream_held_blocks", "Receiver blocks held (status 2) right now.", MetricType::Gauge, {}};
  MetricFamily info{"slotstream_connection_info",
                    "One per connected sender: protocol, transport and block geometry.",
                    MetricType::Gauge,
                    {}};
  for (const SessionReport& r : live) {
    held.metric.push_back(sample({{"sender", r.sender.name}}, MetricType::Gauge, double(r.held_blocks)));
    info.metric.push_back(sample({{"sender", r.sender.name},
                                  {"protocol", r.sender.protocol},
                                  {"transport", transport_name(r.sender.transport)},
                                  {"blocks", std::to_string(r.sender.blocks)},
                                  {"block_size", std::to_string(r.sender.block_size)}},
                                 MetricType::Gauge, 1));
  }
  out.push_back(std::move(held));
  out.push_back(std::move(info));
  out.push_back({"slotstream_sessions_ended_total",
                 "Accepted senders whose connections have all ended.",
                 MetricType::Counter,
                 {sample({}, MetricType::Counter, double(sessions_ended_))}});
  if (workers) worker_families(*workers, &out);
  return out;
}

namespace {

// What the exposer scrapes: a receiver's families, read at scrape time (from civetweb's threads).
class Collector : public prometheus::Collectable {
 public:
  explicit Collector(CollectFn collect) : collect_(std::move(collect)) {}
  std::vector<MetricFamily> Collect() const override { return collect_(); }

 private:
  CollectFn collect_;
};

}  // namespace

MetricsServer::~MetricsServer() = default;  // the exposer stops (joins civetweb's threads) first

Status MetricsServer::start(const std::string& address, const Receiver& rx, MetricsState& state,
                            const pipeline::WorkerManager* workers, std::unique_ptr<MetricsServer>* out) {
  return start(
      address, [&rx, &state, workers] { return state.collect(rx, workers); }, out);
}

Status MetricsServer::start(const std::string& address, CollectFn collect, std::unique_ptr<MetricsServer>* out) {
  std::string host;
  uint16_t port = 0;
  SLOTSTREAM_RETURN_IF_ERROR(net::parse_host_port(address, &host, &port));
  const std::string bracketed = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  CivetCallbacks callbacks;
  callbacks.begin_request = serve_health;
  try {
    server->exposer_ = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", bracketed + ":" + std::to_string(port), "num_threads",
                                 std::to_string(kServerThreads), "request_timeout_ms",
                                 std::to_string(kRequestTimeoutMs)},
        &callbacks);
  } catch (const std::exception&) {  // civetweb could not bind
    return {Code::kInvalidArgument,
            "cannot serve metrics on " + address + " (in use, or not an address of this host?)"};
  }
  auto collector = std::make_shared<Collector>(std::move(collect));
  server->exposer_->RegisterCollectable(collector);
  server->collectable_ = collector;
  const auto ports = server->exposer_->GetListeningPorts();
  server->address_ = bracketed + ":" + std::to_string(ports.empty() ? port : ports.front());
  *out = std::move(server);
  return Status::ok();
}

}  // namespace slotstream::tools
