// `slotstream bench-peer recv|send`: the two measuring processes behind `slotstream bench`
// (contract: docs/bench-peer.md). Each prints JSON; the orchestrator (bench/) does the rest.
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "bench_peer.h"
#include "commands.h"
#include "slotstream/instruments.h"

namespace slotstream::tools {
namespace {

using Clock = std::chrono::steady_clock;  // CLOCK_MONOTONIC on Linux: shared by both peers
using nlohmann::json;

struct Usage {
  double cpu_seconds;
  long peak_rss_kb;
};
Usage usage() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return {ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6, ru.ru_maxrss};
}

json resources_json(uint64_t connections) {
  const TransportCounters c = transport_counters();
  return {{"endpoints", c.endpoints},
          {"registered_bytes", c.registered_bytes},
          {"puts", c.puts},
          {"gets", c.gets},
          {"am_sends", c.am_sends},
          {"am_received", c.am_received},
          {"tag_sends", c.tag_sends},
          {"tag_receives", c.tag_receives},
          {"tag_unexpected", c.tag_unexpected},
          {"max_outstanding", c.max_outstanding},
          {"completions", c.completions},
          {"progress_calls", c.progress_calls},
          {"progress_useful", c.progress_useful},
          {"progress_seconds", c.progress_ns / 1e9},
          {"setup_progress_calls", c.setup_progress_calls},
          {"connections", connections}};
}

// The per-stage trace (--trace): [stage, device, packet, ns] per event, null when off.
json trace_json() {
  if (!tracing()) return nullptr;
  json events = json::array();
  for (const TraceEvent& e : trace_events()) events.push_back({e.stage, e.device, e.packet, e.ns});
  return events;
}

void print_json(const json& j) {
  static std::mutex m;
  std::lock_guard lock(m);
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

// The receiver's processing of every byte it gets (--process-ns-per-byte, the cache experiment):
// a read of every byte — a sum the compiler cannot drop, bound by where the data sits (cache or
// DRAM) — then `ns_per_byte` of compute (a spin). The read's time per byte is the cache-miss
// proxy (these VMs have no hardware counters); the spin is the application's own work.
struct Processing {
  double ns_per_byte = 0;
  uint64_t bytes = 0;
  uint64_t read_ns = 0;   // reading every byte
  uint64_t total_ns = 0;  // reading plus compute
  uint64_t checksum = 0;
  void run(std::span<const std::byte> data) {
    const auto t0 = Clock::now();
    uint64_t sum = 0;
    size_t i = 0;
    for (; i + 8 <= data.size(); i += 8) {
      uint64_t w;
      std::memcpy(&w, data.data() + i, 8);
      sum += w;
    }
    for (; i < data.size(); ++i) sum += std::to_integer<uint8_t>(data[i]);
    const auto t1 = Clock::now();
    const auto until = t1 + std::chrono::nanoseconds(uint64_t(ns_per_byte * double(data.size())));
    while (Clock::now() < until) {
    }
    checksum += sum;
    bytes += data.size();
    read_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count();
    total_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(until, t1) - t0).count();
  }
};

// Samples per vector reserved up front: a vector that grows while messages are timed copies
// itself inside the timed path (the messages at powers of two took 15-60 µs longer).
constexpr uint64_t kReservedSamples = uint64_t(1) << 20;  // 8 MiB of address space; touched as used

// What the receiver peer records for one sender (all of its connections).
struct Recording {
  Recording() {
    arrivals_ns.reserve(kReservedSamples);
    latencies_ns.reserve(kReservedSamples);
  }
  std::mutex mutex;
  std::vector<uint64_t> arrivals_ns;
  std::vector<uint64_t> latencies_ns;
  // --process-ns-per-byte: one per connection (its sink's), added up when the sender has ended.
  std::vector<std::shared_ptr<Processing>> processing;
  std::map<std::string, uint64_t> protocol_counters;
  uint64_t connections = 0;
  double cpu_start = 0;
  uint64_t start_ns = 0;  // when the receiver accepted the sender (--hold-block counts from its first data)
  // --rate: messages counted, first and last arrival (one clock read per batch of messages).
  uint64_t counted = 0;
  uint64_t first_ns = 0;
  uint64_t last_ns = 0;
  void message(uint64_t stamp) {
    uint64_t t = monotonic_ns();
    std::lock_guard lock(mutex);
    arrivals_ns.push_back(t);
    latencies_ns.push_back(stamp != 0 && t > stamp ? t - stamp : 0);
  }
  void arrived(uint64_t n) {
    const uint64_t t = monotonic_ns();
    std::lock_guard lock(mutex);
    if (counted == 0) first_ns = t;
    counted += n;
    last_ns = t;
  }
};

// --rate: what a message costs the receiver without the bench's per-message record — the count,
// and when the first and the last arrived.
class RateSink final : public MessageSink {
 public:
  explicit RateSink(std::shared_ptr<Recording> rec) : rec_(std::move(rec)) {}
  Status begin(uint16_t) override { return Status::ok(); }
  Status append(uint16_t, std::span<const std::byte>) override { return Status::ok(); }
  Status commit(uint16_t) override {
    rec_->arrived(1);
    return Status::ok();
  }
  void abort(uint16_t) override {}
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    *stored = batch.size();
    rec_->arrived(batch.size());
    return Status::ok();
  }

 private:
  std::shared_ptr<Recording> rec_;
};

// Assembles nothing; reads the send stamp from each message's first 8 bytes.
class StampSink final : public MessageSink {
 public:
  StampSink(std::shared_ptr<Recording> rec, std::shared_ptr<Processing> processing)
      : rec_(std::move(rec)),
        processing_(std::move(processing)) {}
  Status begin(uint16_t device) override {
    auto& st = state_[device];
    st = {};
    return Status::ok();
  }
  Status append(uint16_t device, std::span<const std::byte> data) override {
    auto& st = state_[device];
    for (size_t i = 0; i < data.size() && st.have < 8; ++i, ++st.have) {
      st.stamp |= uint64_t(std::to_integer<uint8_t>(data[i])) << (8 * st.have);
    }
    // Before the record is released: carc's budget comes back only after this.
    if (processing_) processing_->run(data);
    return Status::ok();
  }
  Status commit(uint16_t device) override {
    // Messages shorter than the 8-byte stamp carry none: latency 0 (not measured).
    rec_->message(state_[device].have == 8 ? state_[device].stamp : 0);
    return Status::ok();
  }
  void abort(uint16_t) override {}
  // Every message of a batch arrived when the batch did: one clock read, one lock.
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    const uint64_t t = monotonic_ns();
    for (const Message& m : batch) {
      if (processing_) processing_->run(m.data);
    }
    std::lock_guard lock(rec_->mutex);
    for (const Message& m : batch) {
      uint64_t stamp = 0;
      if (m.data.size() >= 8) std::memcpy(&stamp, m.data.data(), 8);
      rec_->arrivals_ns.push_back(t);
      rec_->latencies_ns.push_back(stamp != 0 && t > stamp ? t - stamp : 0);
    }
    *stored = batch.size();
    return Status::ok();
  }

 private:
  struct State {
    uint64_t stamp = 0;
    int have = 0;
  };
  std::map<uint16_t, State> state_;
  std::shared_ptr<Recording> rec_;
  std::shared_ptr<Processing> processing_;
};

json session_json(const std::string& name, const std::string& protocol, const std::string& transport, uint64_t messages,
                  uint64_t bytes, double seconds, bool lost, uint64_t gaps, Recording& rec, double buffer_held = 0,
                  double buffer_useful = 0) {
  Usage u = usage();
  std::lock_guard lock(rec.mutex);
  json process = nullptr;
  if (!rec.processing.empty()) {
    Processing p{rec.processing.front()->ns_per_byte};
    for (const auto& c : rec.processing) {
      p.bytes += c->bytes;
      p.read_ns += c->read_ns;
      p.total_ns += c->total_ns;
      p.checksum += c->checksum;
    }
    process = {{"ns_per_byte", p.ns_per_byte},
               {"bytes", p.bytes},
               {"read_ns", p.read_ns},
               {"total_ns", p.total_ns},
               {"read_ns_per_byte", p.bytes ? double(p.read_ns) / double(p.bytes) : 0.0},
               {"checksum", p.checksum}};
  }
  return {{"event", "session"},
          {"sender", name},
          {"process", process},
          {"protocol_counters", rec.protocol_counters},
          {"protocol", protocol},
          {"transport", transport},
          {"messages", messages},
          {"bytes", bytes},
          {"seconds", seconds},
          {"arrivals_ns", rec.arrivals_ns},
          {"latencies_ns", rec.latencies_ns},
          {"gaps", gaps},
          {"lost", lost},
          {"cpu_seconds", u.cpu_seconds - rec.cpu_start},
          {"peak_rss_kb", u.peak_rss_kb},
          {"session_start_ns", rec.start_ns},
          {"buffer_held_avg", buffer_held},
          {"buffer_useful_avg", buffer_useful},
          {"counted", rec.counted},
          {"first_arrival_ns", rec.first_ns},
          {"last_arrival_ns", rec.last_ns},
          {"resources", resources_json(rec.connections)}};
}

// --------------------------------------------------------------------- plain TCP reference

Status read_full(int fd, void* p, size_t n, bool* eof) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::recv(fd, static_cast<char*>(p) + off, n - off, 0);
    if (r == 0) {
      *eof = true;
      return Status::ok();
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return {Code::kIoError, std::string("recv: ") + strerror(errno)};
    off += size_t(r);
  }
  return Status::ok();
}

Status write_full(int fd, const void* p, size_t n) {
  size_t off = 0;
  while (off < n) {
    ssize_t r = ::send(fd, static_cast<const char*>(p) + off, n - off, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return {Code::kIoError, std::string("send: ") + strerror(errno)};
    off += size_t(r);
  }
  return Status::ok();
}

int blocking(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

// A socket that closes itself.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// HOST:PORT of a bound or connected socket, the numeric host in brackets for IPv6.
std::string socket_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  char host[NI_MAXHOST] = "?", port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
              NI_NUMERICHOST | NI_NUMERICSERV);
  return ss.ss_family == AF_INET6 ? std::string("[") + host + "]:" + port : std::string(host) + ":" + port;
}

// How long the plain-TCP reference's sender waits for its connection to be accepted: a receiver that is
// not there, or a host that drops the SYN, is an error naming the address, not a hang.
constexpr std::chrono::milliseconds kTcpConnectTimeout{5000};

// connect(2) bounded by `timeout`: a non-blocking connect, then poll for writability. The socket is left
// non-blocking (blocking() clears that). 0, or -1 with errno set (ETIMEDOUT when the time ran out).
int connect_within(int fd, const sockaddr* addr, socklen_t len, std::chrono::milliseconds timeout) {
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) != 0) return -1;
  if (::connect(fd, addr, len) == 0) return 0;
  if (errno != EINPROGRESS) return -1;
  pollfd pfd{fd, POLLOUT, 0};
  int rc;
  do {
    rc = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  } while (rc < 0 && errno == EINTR);
  if (rc < 0) return -1;
  if (rc == 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  int err = 0;
  socklen_t err_len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &err_len) != 0) return -1;
  errno = err;
  return err == 0 ? 0 : -1;
}

// The reference is the kernel's TCP alone: plain sockets, nothing of slotstream's.
Status tcp_socket_to(const std::string& host, uint16_t port, bool listen, int* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = listen ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const char* node = listen && (host.empty() || host == "*") ? nullptr : host.c_str();
  if (int rc = getaddrinfo(node, std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return {Code::kInvalidArgument, "cannot resolve '" + host + "': " + gai_strerror(rc)};
  }
  Status st;
  int fd = ::socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  int one = 1;
  if (fd >= 0 && listen) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || (listen ? ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 64) != 0
                        : connect_within(fd, res->ai_addr, res->ai_addrlen, kTcpConnectTimeout) != 0)) {
    const bool timed_out = !listen && errno == ETIMEDOUT;
    st = {listen ? Code::kIoError : Code::kConnectFailed,
          std::string(listen ? "cannot listen on " : "cannot connect to ") + host + ":" + std::to_string(port) + ": " +
              (timed_out ? "no answer within " + std::to_string(kTcpConnectTimeout.count() / 1000) + " s"
                         : std::string(strerror(errno)))};
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  *out = fd;
  return st;
}

int recv_tcp_socket(int listener, const BenchRecvArgs& a) {
  for (uint64_t s = 0; s < a.sessions; ++s) {
    Fd conn{::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC)};
    if (conn.fd < 0) {
      print_error("bench-peer", std::string("accept: ") + strerror(errno));
      return kExitError;
    }
    int fd = blocking(conn.fd);
    Recording rec;
    rec.connections = 1;
    rec.cpu_start = usage().cpu_seconds;
    rec.start_ns = monotonic_ns();
    auto t0 = Clock::now();
    uint64_t messages = 0, bytes = 0;
    std::vector<std::byte> buf;
    for (;;) {
      uint32_t len = 0;
      bool eof = false;
      if (Status st = read_full(fd, &len, 4, &eof); !st.is_ok() || eof) break;
      buf.resize(len);
      if (Status st = read_full(fd, buf.data(), len, &eof); !st.is_ok() || eof) break;
      uint64_t stamp = 0;
      if (len >= 8) std::memcpy(&stamp, buf.data(), 8);
      rec.message(stamp);
      ++messages;
      bytes += len;
    }
    uint8_t ack = 1;
    (void)write_full(fd, &ack, 1);  // tells the sender everything was read
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    print_json(session_json("tcp", "tcp_socket", "tcp", messages, bytes, secs, false, 0, rec));
  }
  return kExitOk;
}

// Fills one message: the send stamp, then a fixed pattern (the same for every protocol).
void fill_payload(uint64_t offset, std::span<std::byte> dst, uint64_t stamp) {
  std::memset(dst.data(), 0xA5, dst.size());
  for (uint64_t i = offset; i < 8 && i - offset < dst.size(); ++i) dst[i - offset] = std::byte(stamp >> (8 * i));
}

json sender_json(const BenchSendArgs& a, const std::string& protocol, const std::string& transport, uint64_t messages,
                 uint64_t bytes, double secs, double cpu, const SenderStats& stats,
                 const std::vector<uint64_t>& send_times, uint64_t connections) {
  return {{"event", "sender"},
          {"protocol", protocol},
          {"transport", transport},
          {"messages", messages},
          {"bytes", bytes},
          {"seconds", secs},
          {"mb_per_s", secs > 0 ? bytes / 1e6 / secs : 0.0},
          {"cpu_seconds", cpu},
          {"peak_rss_kb", usage().peak_rss_kb},
          {"wait_samples_ns", stats.wait_samples_ns},
          {"sync_op_samples_ns", stats.sync_op_samples_ns},
          {"waits", stats.waits},
          {"wait_ns", stats.wait_ns},
          {"sync_operations", stats.sync_operations},
          {"protocol_counters", stats.protocol_counters},
          {"send_times_ns", send_times},
          {"size", a.size},
          {"blocks", a.blocks},
          {"block_size", a.block_size ? a.block_size : a.size + kBlockHeaderBytes},
          {"resources", resources_json(connections)}};
}

// When a sender started at t0 stops with --seconds (checked only when a.seconds > 0).
Clock::time_point stop_time(const BenchSendArgs& a, Clock::time_point t0) {
  return t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
}

// Paces message k of a run: fps spacing and/or a fixed gap after each message.
class Pacer {
 public:
  explicit Pacer(const BenchSendArgs& a) : a_(a), t0_(Clock::now()) {}
  void before(uint64_t k) const {
    if (a_.fps > 0) {
      std::this_thread::sleep_until(
          t0_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(k / a_.fps)));
    }
  }
  void after() const {
    if (a_.gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(a_.gap_us));
  }

 private:
  const BenchSendArgs& a_;
  Clock::time_point t0_;
};

int send_tcp_socket(const BenchSendArgs& a, const std::string& host, uint16_t port) {
  Fd conn;
  if (Status st = tcp_socket_to(host, port, /*listen=*/false, &conn.fd); !st.is_ok()) {
    print_error("bench-peer", st.message());
    return kExitError;
  }
  int fd = blocking(conn.fd);
  std::vector<std::byte> msg(a.size);
  std::vector<uint64_t> send_times;
  send_times.reserve(std::min(a.count * a.devices, kReservedSamples));
  const double cpu0 = usage().cpu_seconds;
  auto t0 = Clock::now();
  const auto stop_at = stop_time(a, t0);
  Pacer pacer(a);
  uint64_t sent = 0;  // per device, as --count
  for (; sent < a.count; ++sent) {
    if (a.seconds > 0 && Clock::now() >= stop_at) break;
    pacer.before(sent);
    for (uint32_t d = 0; d < a.devices; ++d) {
      uint64_t stamp = monotonic_ns();
      send_times.push_back(stamp);
      fill_payload(0, msg, stamp);
      uint32_t len = uint32_t(a.size);
      if (Status st = write_full(fd, &len, 4); !st.is_ok()) return print_error("bench-peer", st.message()), kExitError;
      if (Status st = write_full(fd, msg.data(), msg.size()); !st.is_ok())
        return print_error("bench-peer", st.message()), kExitError;
    }
    pacer.after();
  }
  shutdown(fd, SHUT_WR);
  uint8_t ack = 0;
  bool eof = false;
  (void)read_full(fd, &ack, 1, &eof);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t messages = sent * a.devices;
  print_json(sender_json(a, "tcp_socket", "tcp", messages, messages * a.size, secs, usage().cpu_seconds - cpu0,
                         SenderStats{}, send_times, 1));
  return ack == 1 ? kExitOk : kExitError;
}

}  // namespace

namespace {

// One Recording per sender name (its lanes share it), from its first connection to its report.
class Recordings {
 public:
  explicit Recordings(const BenchRecvArgs& a) : a_(a) {}

  Status make_sink(const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
    std::lock_guard lock(mutex_);
    auto& rec = by_name_[info.name];
    if (!rec) {
      rec = std::make_shared<Recording>();
      rec->cpu_start = usage().cpu_seconds;
      rec->start_ns = monotonic_ns();
      reset_transport_counters();
    }
    ++rec->connections;
    std::shared_ptr<Processing> processing;
    if (a_.process_ns_per_byte >= 0) {
      processing = std::make_shared<Processing>(Processing{a_.process_ns_per_byte});
      std::lock_guard rl(rec->mutex);
      rec->processing.push_back(processing);
    }
    if (a_.rate) {
      *sink = std::make_unique<RateSink>(rec);
    } else {
      *sink = std::make_unique<StampSink>(rec, processing);
    }
    return Status::ok();
  }

  // Prints the sender's session record.
  void end_session(const SessionReport& r) {
    std::shared_ptr<Recording> rec;
    {
      std::lock_guard lock(mutex_);
      rec = by_name_[r.sender.name];
      by_name_.erase(r.sender.name);
    }
    if (!rec) return;
    {
      std::lock_guard lock(rec->mutex);
      rec->protocol_counters = r.protocol_counters;
    }
    json session = session_json(r.sender.name, r.sender.protocol, transport_name(r.sender.transport), r.messages,
                                r.bytes, r.seconds, !r.finished, r.gaps, *rec, r.buffer_held_avg, r.buffer_useful_avg);
    session["trace"] = trace_json();
    print_json(session);
  }

 private:
  const BenchRecvArgs& a_;
  std::mutex mutex_;
  std::map<std::string, std::shared_ptr<Recording>> by_name_;
};

int listen_tcp_socket(const BenchRecvArgs& a, const std::string& host, uint16_t port) {
  Fd listener;
  if (Status st = tcp_socket_to(host, port, /*listen=*/true, &listener.fd); !st.is_ok()) {
    print_error("bench-peer", st.message());
    return kExitError;
  }
  print_json_line("listening on " + socket_address(listener.fd));
  return recv_tcp_socket(listener.fd, a);
}

}  // namespace

int run_bench_recv(const BenchRecvArgs& a) {
  ReceiverOptions opt;
  if (Status st = parse_address(a.listen, &opt.host, &opt.port); !st.is_ok()) {
    print_error("bench-peer", "--listen: " + st.message());
    return kExitUsage;
  }
  if (a.tcp_socket) return listen_tcp_socket(a, opt.host, opt.port);
  opt.transport = *parse_transport(a.transport);
  opt.rdma = rdma_options(a.rdma_transport, a.rdma_device);
  opt.busy_poll = a.busy_poll;
  if (a.trace) enable_trace(a.trace);
  opt.round_robin = a.round_robin;
  for (const auto& h : a.holds) {
    HoldSpec spec;
    if (!parse_hold_spec(h, &spec)) {
      print_error("bench-peer", "--hold-block expects INDEX:FROM_MS:TO_MS, got '" + h + "'");
      return kExitUsage;
    }
    opt.holds.push_back(spec);
  }
  Recordings recordings(a);
  opt.make_sink = [&](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
    return recordings.make_sink(info, sink);
  };
  opt.on_session_end = [&](const SessionReport& r) { recordings.end_session(r); };
  opt.on_event = [](const std::string& text) { std::fprintf(stderr, "bench-peer recv: %s\n", text.c_str()); };
  std::unique_ptr<Receiver> rx;
  if (Status st = Receiver::start(std::move(opt), &rx); !st.is_ok()) {
    print_error("bench-peer", st.to_string());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  print_json_line("listening on " + rx->listen_address());
  rx->wait_sessions(a.sessions);
  rx->stop();
  return kExitOk;
}

namespace {

// What the fillers of run_bench_send record: per device, each message's send time and each
// burst's end; the first error any of them met.
struct SendLog {
  explicit SendLog(const BenchSendArgs& a) : send_times(a.devices), burst_ends(a.devices) {
    for (auto* times : {&send_times, &burst_ends}) {
      for (auto& v : *times) v.reserve(std::min(a.count, kReservedSamples));
    }
  }
  void fail(const Status& st) {
    std::lock_guard lock(mutex);
    if (first_error.is_ok()) first_error = st;
  }
  std::vector<std::vector<uint64_t>> send_times;
  std::vector<std::vector<uint64_t>> burst_ends;
  std::mutex mutex;
  Status first_error;
};

// --rate: every message is the same prepared payload, sent with one call and no clock read.
void send_at_rate(DeviceStream* dev, const BenchSendArgs& a, std::span<const std::byte> payload,
                  Clock::time_point stop_at, SendLog* log) {
  for (uint64_t k = 0; k < a.count; ++k) {
    if (a.seconds > 0 && (k & 1023) == 0 && Clock::now() >= stop_at) break;
    if (Status st = dev->send(payload); !st.is_ok()) return log->fail(st);
  }
}

// Paced messages, each stamped with its send time, in bursts separated by computation when asked.
void send_paced(DeviceStream* dev, const BenchSendArgs& a, uint32_t d, Clock::time_point stop_at, SendLog* log) {
  Pacer pacer(a);
  for (uint64_t k = 0; k < a.count; ++k) {
    if (a.seconds > 0 && Clock::now() >= stop_at) break;
    pacer.before(k);
    uint64_t stamp = monotonic_ns();
    log->send_times[d].push_back(stamp);
    Status st = dev->send_with(a.size, [&](uint64_t off, std::span<std::byte> dst) {
      fill_payload(off, dst, stamp);
      return Status::ok();
    });
    if (!st.is_ok()) return log->fail(st);
    if (a.burst && (k + 1) % a.burst == 0) {
      // SDP Fig. 5: the application computes between bursts and makes no library call. It
      // sleeps rather than spins: sender and receiver share this machine's cores, and a busy
      // loop took the core the sending thread and the receiver need (status_byte's last
      // message of a burst then arrived up to the whole computation late), which the paper's
      // separate nodes never had. Timer slack 1 ns keeps the sleep close to C.
      log->burst_ends[d].push_back(monotonic_ns());
      prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
      std::this_thread::sleep_until(Clock::now() + std::chrono::microseconds(a.compute_us));
    }
    pacer.after();
  }
}

// Usage errors of bench-peer send (exit code), or nullopt; *host and *port from --to.
std::optional<int> check_bench_send(const BenchSendArgs& a, std::string* host, uint16_t* port) {
  if (Status st = parse_address(a.to, host, port); !st.is_ok()) {
    print_error("bench-peer", "--to: " + st.message());
    return kExitUsage;
  }
  if (a.size < 1 || a.count == 0 || a.devices == 0 || a.devices > 4096) {
    print_error("bench-peer", "--size must be >= 1, --count >= 1, --devices 1..4096");
    return kExitUsage;
  }
  if (a.compute_us != 0 && a.burst == 0) {
    print_error("bench-peer", "--compute-us needs --burst");
    return kExitUsage;
  }
  return std::nullopt;
}

SenderOptions bench_sender_options(const BenchSendArgs& a, const std::string& host, uint16_t port) {
  SenderOptions opt;
  opt.host = host;
  opt.port = port;
  opt.name = a.name;
  opt.protocol = a.protocol;
  opt.transport = *parse_transport(a.transport);
  opt.rdma = rdma_options(a.rdma_transport, a.rdma_device);
  opt.blocks = a.blocks;
  opt.block_size = a.block_size ? a.block_size : uint32_t(a.size + kBlockHeaderBytes);
  opt.allow_reference = true;
  opt.skip_packet_every = a.skip_packet_every;
  for (uint32_t d = 0; d < a.devices; ++d) opt.devices.push_back(uint16_t(d));
  return opt;
}

json bench_send_report(const BenchSendArgs& a, Sender& sender, const SendLog& log, Clock::time_point t0, double secs,
                       double cpu) {
  SenderStats s = sender.stats();
  std::vector<uint64_t> all_times;
  for (auto& v : log.send_times) all_times.insert(all_times.end(), v.begin(), v.end());
  json out = sender_json(a, a.protocol, transport_name(sender.transport()), s.messages, s.bytes, secs, cpu, s,
                         all_times, s.connections);
  if (a.burst) {
    std::vector<uint64_t> ends;
    for (auto& v : log.burst_ends) ends.insert(ends.end(), v.begin(), v.end());
    out["burst_ends_ns"] = ends;
    out["compute_us"] = a.compute_us;
  }
  out["trace"] = trace_json();
  out["start_ns"] = uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(t0.time_since_epoch()).count());
  out["records"] = s.records;
  out["units"] = s.units;
  return out;
}

}  // namespace

int run_bench_send(const BenchSendArgs& a) {
  std::string host;
  uint16_t port = 0;
  if (auto usage_error = check_bench_send(a, &host, &port)) return *usage_error;
  if (a.tcp_socket) return send_tcp_socket(a, host, port);
  if (a.trace) enable_trace(a.trace);
  std::unique_ptr<Sender> sender;
  if (Status st = Sender::connect(bench_sender_options(a, host, port), &sender); !st.is_ok()) {
    print_error("bench-peer", st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  SendLog log(a);
  // CPU, UCX counters and elapsed time all start here, after the connection is set up: the
  // same window for every figure (connecting is not what the experiments measure).
  reset_transport_counters();
  const double cpu0 = usage().cpu_seconds;
  const auto t0 = Clock::now();
  const auto stop_at = stop_time(a, t0);
  std::vector<std::byte> payload(a.rate ? a.size : 0, std::byte{0xA5});
  std::vector<std::thread> fillers;
  for (uint32_t d = 0; d < a.devices; ++d) {
    fillers.emplace_back([&, d] {
      DeviceStream* dev = sender->device(uint16_t(d));
      if (a.rate) return send_at_rate(dev, a, payload, stop_at, &log);
      send_paced(dev, a, d, stop_at, &log);
    });
  }
  for (auto& t : fillers) t.join();
  if (Status st = sender->finish(); log.first_error.is_ok()) log.first_error = st;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!log.first_error.is_ok()) {
    print_error("bench-peer", log.first_error.message());
    return kExitError;
  }
  print_json(bench_send_report(a, *sender, log, t0, secs, usage().cpu_seconds - cpu0));
  return kExitOk;
}

void print_json_line(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

#ifndef SLOTSTREAM_BENCH_FROM_BIN  // set by cmake/install.cmake from the install directories
#define SLOTSTREAM_BENCH_FROM_BIN "../share/slotstream/bench"
#endif

int run_bench(const std::vector<std::string>& args, const std::string& self_exe) {
  // The orchestrator is installed beside the binary (P/bin -> P/share/slotstream/bench, set by
  // cmake/install.cmake); a binary in a build directory finds it in the source tree above it.
  std::filesystem::path exe(self_exe);
  std::filesystem::path script = exe.parent_path() / SLOTSTREAM_BENCH_FROM_BIN / "slotstream_bench.py";
  for (auto dir = exe.parent_path(); !std::filesystem::exists(script) && !dir.empty() && dir != dir.root_path();
       dir = dir.parent_path()) {
    script = dir / "bench/slotstream_bench.py";
  }
  if (!std::filesystem::exists(script)) {
    print_error("bench", "cannot find slotstream_bench.py in " + exe.parent_path().string() + "/" +
                             SLOTSTREAM_BENCH_FROM_BIN + " (an installed slotstream) nor in a bench/ directory above " +
                             exe.parent_path().string() + " (a build directory in the source tree)");
    return kExitError;
  }
  script = std::filesystem::weakly_canonical(script);
  std::string python = std::filesystem::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";
  std::vector<std::string> argv = {python, script.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  setenv("SLOTSTREAM_BIN", self_exe.c_str(), 1);
  execvp(cargv[0], cargv.data());
  print_error("bench", "cannot run " + python + ": " + strerror(errno));
  return kExitError;
}

}  // namespace slotstream::tools
