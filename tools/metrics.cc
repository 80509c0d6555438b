// `recv --metrics HOST:PORT`: Prometheus text exposition on /metrics and a /health check, served
// by one small thread (HTTP/1.0, one request per connection).
#include "metrics.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>

#include "net/control_socket.h"

namespace slotstream::tools {

std::string label(const std::string& sender) {
  std::string out;
  for (char c : sender) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out;
}

namespace {

void family(std::ostringstream& o, const char* name, const char* type, const char* help) {
  o << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

}  // namespace

void MetricsState::Totals::add(const SessionReport& r) {
  for (const auto& [d, s] : r.per_device) {
    auto& acc = per_device[d];
    acc.messages += s.messages;
    acc.bytes += s.bytes;
    acc.gaps += s.gaps;
    acc.duplicates += s.duplicates;
    acc.pauses += s.pauses;
  }
  stalls += r.stalls;
}

void MetricsState::session_ended(const SessionReport& r) {
  std::lock_guard lock(mutex_);
  ended_[r.sender.name].add(r);
  ++sessions_ended_;
}

std::string MetricsState::render(const Receiver& rx, const pipeline::WorkerManager* workers) const {
  std::map<std::string, Totals> totals;
  uint64_t ended;
  {
    std::lock_guard lock(mutex_);
    totals = ended_;
    ended = sessions_ended_;
  }
  auto live = rx.live_sessions();
  for (const auto& r : live) totals[r.sender.name].add(r);
  std::ostringstream o;
  struct Counter {
    const char* name;
    const char* help;
    uint64_t DeviceStats::*field;
  };
  for (Counter c : {Counter{"slotstream_messages_total", "Complete messages stored.", &DeviceStats::messages},
                    Counter{"slotstream_bytes_total", "Payload bytes of complete messages.", &DeviceStats::bytes},
                    Counter{"slotstream_gaps_total", "Packets that never arrived.", &DeviceStats::gaps},
                    Counter{"slotstream_duplicates_total", "Duplicate packets dropped.", &DeviceStats::duplicates}}) {
    family(o, c.name, "counter", c.help);
    for (const auto& [sender, t] : totals) {
      for (const auto& [d, s] : t.per_device) {
        o << c.name << "{sender=\"" << label(sender) << "\",device=\"" << d << "\"} " << s.*c.field << '\n';
      }
    }
  }
  family(o, "slotstream_device_pauses_total", "counter", "Times a device was paused because its worker was behind.");
  for (const auto& [sender, t] : totals) {
    for (const auto& [d, s] : t.per_device) {
      o << "slotstream_device_pauses_total{sender=\"" << label(sender) << "\",device=\"" << d << "\"} " << s.pauses << '\n';
    }
  }
  family(o, "slotstream_device_paused", "gauge", "1 while the device is paused (its worker is behind).");
  for (const auto& r : live) {
    for (const auto& [d, s] : r.per_device) {
      o << "slotstream_device_paused{sender=\"" << label(r.sender.name) << "\",device=\"" << d << "\"} " << (s.paused ? 1 : 0)
        << '\n';
    }
  }
  family(o, "slotstream_stalls_total", "counter", "Times the receiver refused data (a full disk, or a device paused).");
  for (const auto& [sender, t] : totals) o << "slotstream_stalls_total{sender=\"" << label(sender) << "\"} " << t.stalls << '\n';
  family(o, "slotstream_held_blocks", "gauge", "Receiver blocks held (status 2) right now.");
  for (const auto& r : live) o << "slotstream_held_blocks{sender=\"" << label(r.sender.name) << "\"} " << r.held_blocks << '\n';
  family(o, "slotstream_connection_info", "gauge", "One per connected sender: protocol, transport and block geometry.");
  for (const auto& r : live) {
    o << "slotstream_connection_info{sender=\"" << label(r.sender.name) << "\",protocol=\"" << r.sender.protocol
      << "\",transport=\"" << transport_name(r.sender.transport) << "\",blocks=\"" << r.sender.blocks
      << "\",block_size=\"" << r.sender.block_size << "\"} 1\n";
  }
  family(o, "slotstream_sessions_ended_total", "counter", "Sender connections that have ended.");
  o << "slotstream_sessions_ended_total " << ended << '\n';
  if (workers) {
    auto ws = workers->stats();
    struct Gauge {
      const char* name;
      const char* type;
      const char* help;
      uint64_t pipeline::WorkerStats::*field;
    };
    for (Gauge g : {Gauge{"slotstream_worker_backlog_messages", "gauge", "Stored messages the worker has not finished.",
                          &pipeline::WorkerStats::backlog_messages},
                    Gauge{"slotstream_worker_backlog_bytes", "gauge", "Bytes of those messages.",
                          &pipeline::WorkerStats::backlog_bytes},
                    Gauge{"slotstream_worker_processed_total", "counter", "Messages the worker recorded as done.",
                          &pipeline::WorkerStats::processed},
                    Gauge{"slotstream_worker_restarts_total", "counter", "Times the worker was restarted.",
                          &pipeline::WorkerStats::restarts}}) {
      family(o, g.name, g.type, g.help);
      for (const auto& w : ws) {
        o << g.name << "{sender=\"" << label(w.sender) << "\",device=\"" << w.device << "\"} " << w.*g.field << '\n';
      }
    }
    family(o, "slotstream_worker_running", "gauge", "1 while the worker process runs.");
    for (const auto& w : ws) {
      o << "slotstream_worker_running{sender=\"" << label(w.sender) << "\",device=\"" << w.device << "\"} "
        << (w.running ? 1 : 0) << '\n';
    }
  }
  return o.str();
}

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

Status MetricsServer::start(const std::string& address, const Receiver& rx, const MetricsState& state,
                            const pipeline::WorkerManager* workers, std::unique_ptr<MetricsServer>* out) {
  return start(address, [&rx, &state, workers] { return state.render(rx, workers); }, out);
}

Status MetricsServer::start(const std::string& address, std::function<std::string()> render,
                            std::unique_ptr<MetricsServer>* out) {
  std::string host;
  uint16_t port = 0;
  SLOTSTREAM_RETURN_IF_ERROR(net::parse_host_port(address, &host, &port));
  auto server = std::unique_ptr<MetricsServer>(new MetricsServer());
  SLOTSTREAM_RETURN_IF_ERROR(net::Listener::open(host, port, &server->listener_));
  server->address_ = server->listener_->address();
  MetricsServer* s = server.get();
  s->thread_ = std::thread([s, render = std::move(render)] {
    while (!s->stop_.load()) {
      std::unique_ptr<net::ControlSocket> conn;
      if (!s->listener_->accept(net::Millis(200), &conn).is_ok() || !conn) continue;
      char buf[2048];
      std::string req;
      for (int i = 0; i < 50 && req.find("\r\n\r\n") == std::string::npos && req.size() < sizeof buf; ++i) {
        ssize_t n = ::recv(conn->fd(), buf, sizeof buf, 0);
        if (n > 0) req.append(buf, size_t(n));
        else if (n == 0) break;
        else usleep(2000);
      }
      std::string status = "200 OK", type = "text/plain; version=0.0.4", body;
      if (req.starts_with("GET /metrics")) {
        body = render();
      } else if (req.starts_with("GET /health")) {
        body = "ok\n";
      } else {
        status = "404 Not Found";
        body = "try /metrics or /health\n";
      }
      std::string resp = "HTTP/1.0 " + status + "\r\nContent-Type: " + type + "\r\nContent-Length: " +
                         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
      size_t off = 0;
      for (int i = 0; off < resp.size() && i < 1000; ++i) {
        ssize_t n = ::send(conn->fd(), resp.data() + off, resp.size() - off, MSG_NOSIGNAL);
        if (n > 0) off += size_t(n);
        else if (n < 0 && errno != EAGAIN) break;
        else usleep(1000);
      }
    }
  });
  *out = std::move(server);
  return Status::ok();
}

}  // namespace slotstream::tools
