// `recv --metrics HOST:PORT`: the receiver's counters as Prometheus metric families, served by
// prometheus-cpp's exposer (/metrics) with /health and /ready answers of our own (civetweb's
// begin_request).
#include "metrics.h"

#include <fcntl.h>
#include <unistd.h>

#include <prometheus/collectable.h>
#include <prometheus/exposer.h>

#include <CivetServer.h>
#include <civetweb.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <limits>
#include <stdexcept>

#include "process_metrics.h"

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
// 4,096 devices, and series for every declared device would grow by millions (100 such hellos: 2 million) that no
// stream ever fed.
bool carried_data(const DeviceStats& s) {
  return s.messages || s.bytes || s.gaps || s.duplicates || s.partial || s.dropped || s.lost || s.pauses || s.paused;
}

// Refused connections by reason, and authentication failures by what failed (Receiver::refusals).
void append_refusals(const RefusalCounts& counts, std::vector<MetricFamily>* out) {
  MetricFamily refused{"slotstream_refused_connections_total",
                       "Connections the receiver refused, by reason (authentication failures included).",
                       MetricType::Counter,
                       {}};
  for (const auto& [reason, n] : counts.refused) {
    refused.metric.push_back(sample({{"reason", reason}}, MetricType::Counter, double(n)));
  }
  MetricFamily auth{"slotstream_authentication_failures_total",
                    "Senders that failed authentication, by what failed (wrong_token, no_proof, unsigned_setup).",
                    MetricType::Counter,
                    {}};
  for (const auto& [reason, n] : counts.authentication_failures) {
    auth.metric.push_back(sample({{"reason", reason}}, MetricType::Counter, double(n)));
  }
  out->push_back(std::move(refused));
  out->push_back(std::move(auth));
}

// What /health and /ready of one server need, found by the port a request came in on (the
// exposer owns the civetweb server, so its user data is not ours to set).
struct Probes {
  ReadyFn ready;
  MetricsClock::time_point started = MetricsClock::now();
};
std::mutex g_probes_mutex;
std::map<int, std::shared_ptr<Probes>> g_probes;  // by listening port

std::shared_ptr<Probes> probes_for(int port) {
  std::lock_guard lock(g_probes_mutex);
  auto it = g_probes.find(port);
  return it == g_probes.end() ? nullptr : it->second;
}

void reply_json(mg_connection* conn, int status, const nlohmann::json& body) {
  const std::string text = body.dump() + "\n";
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nCache-Control: no-store\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            status, status == 200 ? "OK" : "Service Unavailable", text.size());
  mg_write(conn, text.data(), text.size());
}

// /health: the process serves requests (liveness; no dependency is checked, so a restart is never
// asked for because of something a restart cannot fix). /ready: what receiver_readiness checks.
int serve_probes(mg_connection* conn) {
  const mg_request_info* req = mg_get_request_info(conn);
  if (!req || !req->local_uri) return 0;
  const bool health = std::strcmp(req->local_uri, "/health") == 0;
  if (!health && std::strcmp(req->local_uri, "/ready") != 0) return 0;  // civetweb's turn (/metrics)
  auto probes = probes_for(req->server_port);
  if (health) {
    const double up = probes ? std::chrono::duration<double>(MetricsClock::now() - probes->started).count() : 0.0;
    reply_json(conn, 200, {{"status", "ok"}, {"version", version()}, {"uptime_seconds", up}});
    return 200;
  }
  Readiness r;
  if (!probes) {
    r.check("started", false, "the server is starting");
  } else if (probes->ready) {
    r = probes->ready();
  }
  reply_json(conn, r.ready ? 200 : 503, {{"ready", r.ready}, {"checks", r.checks}});
  return r.ready ? 200 : 503;
}

}  // namespace

void Readiness::check(const std::string& name, bool ok, const std::string& detail) {
  checks[name] = {{"ok", ok}, {"detail", detail}};
  ready = ready && ok;
}

std::string probe_writable(const std::string& dir) {
  const std::string path = dir + "/.slotstream-ready-" + std::to_string(getpid());
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return "cannot create a file in " + dir + ": " + std::strerror(errno);
  const bool wrote = ::write(fd, "r", 1) == 1;
  const int err = errno;
  ::close(fd);
  ::unlink(path.c_str());
  return wrote ? "" : "cannot write in " + dir + ": " + std::strerror(err);
}

Readiness store_readiness(const std::string& out) {
  Readiness r;
  if (out.empty()) {
    r.check("sinks_writable", true, "nothing is stored (--discard)");
  } else {
    const std::string why = probe_writable(out);
    r.check("sinks_writable", why.empty(), why.empty() ? out + " takes files" : why);
  }
  return r;
}

Readiness receiver_readiness(const Receiver& rx, const std::string& out, const DirectoryWorkers* workers) {
  Readiness r = store_readiness(out);
  r.check("listening", rx.accepting(), rx.accepting() ? rx.listen_address() : "the control listener is closed");
  if (workers) {
    std::string down;
    size_t n = 0;
    for (const auto& s : workers->stats()) {
      ++n;
      if (!s.running) down += (down.empty() ? "" : ", ") + s.sender + "/device-" + std::to_string(s.device);
    }
    r.check("workers", down.empty(),
            down.empty() ? std::to_string(n) + " running" : "not running (waiting to be restarted): " + down);
  }
  return r;
}

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

void worker_families(const DirectoryWorkers& workers, std::vector<MetricFamily>* out) {
  const auto ws = workers.stats();
  struct Worker {
    const char* name;
    MetricType type;
    const char* help;
    uint64_t DirectoryWorkerStats::*field;
  };
  for (Worker w : {Worker{"slotstream_worker_backlog_messages", MetricType::Gauge,
                          "Stored messages the worker has not finished.", &DirectoryWorkerStats::backlog_messages},
                   Worker{"slotstream_worker_backlog_bytes", MetricType::Gauge, "Bytes of those messages.",
                          &DirectoryWorkerStats::backlog_bytes},
                   Worker{"slotstream_worker_processed_total", MetricType::Counter,
                          "Messages the worker recorded as done.", &DirectoryWorkerStats::processed},
                   Worker{"slotstream_worker_restarts_total", MetricType::Counter, "Times the worker was restarted.",
                          &DirectoryWorkerStats::restarts}}) {
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

// Per sender: the store-latency histogram (stream::Delivery), cumulative buckets kept monotonic.
MetricFamily MetricsState::store_latency_family(const Totals& totals) {
  MetricFamily latency{"slotstream_message_store_seconds",
                       "Per sender: seconds from the receiver taking up a message's first block to the message "
                       "being stored (reassembly, back-pressure waits, the write; not end to end).",
                       MetricType::Histogram,
                       {}};
  for (const auto& [sender, t] : totals) {
    const LatencyHistogram& h = t.store_latency;
    ClientMetric m;
    m.label = {{"sender", sender}};
    uint64_t cumulative = 0;
    for (size_t i = 0; i < LatencyHistogram::kBounds.size(); ++i) {
      cumulative += h.buckets[i];
      const std::string bucket = "le" + std::to_string(i);
      m.histogram.bucket.push_back({uint64_t(monotonic(sender, latency.name.c_str(), bucket, double(cumulative))),
                                    LatencyHistogram::kBounds[i]});
    }
    m.histogram.bucket.push_back({uint64_t(monotonic(sender, latency.name.c_str(), "count", double(h.count))),
                                  std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = m.histogram.bucket.back().cumulative_count;
    m.histogram.sample_sum = monotonic(sender, latency.name.c_str(), "sum", h.sum_seconds);
    latency.metric.push_back(std::move(m));
  }
  return latency;
}

std::vector<MetricFamily> MetricsState::collect(const Receiver& rx, const DirectoryWorkers* workers,
                                                MetricsClock::time_point now) {
  std::vector<MetricFamily> out = collect(rx.live_sessions(), workers, now);
  append_refusals(rx.refusals(), &out);
  return out;
}

std::vector<MetricFamily> MetricsState::collect(const std::vector<SessionReport>& live, const DirectoryWorkers* workers,
                                                MetricsClock::time_point now) {
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
  out.push_back({"slotstream_active_senders",
                 "Senders being served now (one per sender name, whatever its number of connections).",
                 MetricType::Gauge,
                 {sample({}, MetricType::Gauge, double(live.size()))}});
  out.push_back(store_latency_family(all));
  if (workers) worker_families(*workers, &out);
  return out;
}

namespace {

// What the exposer scrapes: a receiver's families, read at scrape time (from civetweb's threads),
// with the process metrics and the build info.
class Collector : public prometheus::Collectable {
 public:
  explicit Collector(CollectFn collect) : collect_(std::move(collect)) {}
  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out = collect_();
    for (auto* more : {&process_families, &build_info_families}) {
      auto families = (*more)();
      std::move(families.begin(), families.end(), std::back_inserter(out));
    }
    return out;
  }

 private:
  CollectFn collect_;
};

}  // namespace

MetricsServer::~MetricsServer() {
  exposer_.reset();  // stops (joins civetweb's threads): no request is being answered after this
  std::lock_guard lock(g_probes_mutex);
  g_probes.erase(port_);
}

Status MetricsServer::start(const std::string& address, const Receiver& rx, MetricsState& state,
                            const DirectoryWorkers* workers, ReadyFn ready, std::unique_ptr<MetricsServer>* out) {
  return start(
      address, [&rx, &state, workers] { return state.collect(rx, workers); }, out, std::move(ready));
}

Status MetricsServer::start(const std::string& address, CollectFn collect, std::unique_ptr<MetricsServer>* out,
                            ReadyFn ready) {
  std::string host;
  uint16_t port = 0;
  SLOTSTREAM_RETURN_IF_ERROR(parse_address(address, &host, &port));
  const std::string bracketed = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  CivetCallbacks callbacks;
  callbacks.begin_request = serve_probes;
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
  server->port_ = ports.empty() ? port : ports.front();
  server->address_ = bracketed + ":" + std::to_string(server->port_);
  {
    auto probes = std::make_shared<Probes>();
    probes->ready = std::move(ready);
    std::lock_guard lock(g_probes_mutex);
    g_probes[server->port_] = std::move(probes);
  }
  *out = std::move(server);
  return Status::ok();
}

}  // namespace slotstream::tools
