// Small public helpers: status names, transport names, sender-name validation, protocol list.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common.h"
#include "slotstream/slotstream.h"

namespace slotstream {

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk:
      return "ok";
    case Code::kInProgress:
      return "in progress";
    case Code::kInvalidArgument:
      return "invalid argument";
    case Code::kConnectFailed:
      return "connect failed";
    case Code::kProtocolError:
      return "protocol error";
    case Code::kVersionMismatch:
      return "version mismatch";
    case Code::kRefused:
      return "refused";
    case Code::kAuthFailed:
      return "authentication failed";
    case Code::kPeerGone:
      return "peer gone";
    case Code::kTransportError:
      return "transport error";
    case Code::kIoError:
      return "I/O error";
    case Code::kTimeout:
      return "timeout";
    case Code::kCancelled:
      return "cancelled";
    case Code::kBusy:
      return "busy";
  }
  return "unknown";
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  return std::string(code_name(code_)) + ": " + message_;
}

const char* version() { return SLOTSTREAM_VERSION; }

std::optional<Transport> parse_transport(std::string_view text) {
  if (text == "auto") return Transport::kAuto;
  if (text == "shm") return Transport::kShm;
  if (text == "tcp") return Transport::kTcp;
  if (text == "rdma") return Transport::kRdma;
  if (text == "udp") return Transport::kUdp;
  return std::nullopt;
}

const char* transport_name(Transport t) {
  switch (t) {
    case Transport::kAuto:
      return "auto";
    case Transport::kShm:
      return "shm";
    case Transport::kTcp:
      return "tcp";
    case Transport::kRdma:
      return "rdma";
    case Transport::kUdp:
      return "udp";
  }
  return "?";
}

std::optional<RdmaTransport> parse_rdma_transport(std::string_view text) {
  if (text == "rc") return RdmaTransport::kRc;
  if (text == "dc") return RdmaTransport::kDc;
  if (text == "ud") return RdmaTransport::kUd;
  return std::nullopt;
}

const char* rdma_transport_name(RdmaTransport t) {
  switch (t) {
    case RdmaTransport::kRc:
      return "rc";
    case RdmaTransport::kDc:
      return "dc";
    case RdmaTransport::kUd:
      return "ud";
  }
  return "?";
}

std::optional<std::string> invalid_sender_name(std::string_view name) {
  if (name.empty()) return "sender name is empty";
  if (name.size() > 64) return "sender name is longer than 64 characters";
  if (name[0] == '.') return "sender name must not start with '.'";
  // A directory named "-x" is read as an option by every shell tool a worker or an operator runs.
  if (name[0] == '-') return "sender name must not start with '-'";
  for (char c : name) {
    bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
    if (!ok) return "sender name may only contain letters, digits, '.', '_' and '-'";
  }
  return std::nullopt;
}

void LatencyHistogram::observe(double seconds, uint64_t n) {
  if (n == 0) return;
  const auto it = std::lower_bound(kBounds.begin(), kBounds.end(), seconds);  // first bound >= seconds
  buckets[size_t(it - kBounds.begin())] += n;
  count += n;
  sum_seconds += seconds * double(n);
}

void LatencyHistogram::merge(const LatencyHistogram& other) {
  for (size_t i = 0; i < buckets.size(); ++i) buckets[i] += other.buckets[i];
  count += other.count;
  sum_seconds += other.sum_seconds;
}

void SessionReport::merge(const SessionReport& lane) {
  finished = finished && lane.finished;
  if (reason.empty()) reason = lane.reason;
  messages += lane.messages;
  bytes += lane.bytes;
  gaps += lane.gaps;
  duplicates += lane.duplicates;
  unknown_device += lane.unknown_device;
  out_of_window += lane.out_of_window;
  bad_headers += lane.bad_headers;
  buffer_held_avg += lane.buffer_held_avg;  // each lane has a buffer of its own
  buffer_useful_avg += lane.buffer_useful_avg;
  partial_discarded += lane.partial_discarded;
  already_stored += lane.already_stored;
  held_blocks += lane.held_blocks;
  views_lent += lane.views_lent;
  views_held_blocks += lane.views_held_blocks;
  view_limit_waits += lane.view_limit_waits;
  stalls += lane.stalls;
  seconds = std::max(seconds, lane.seconds);
  for (const auto& [k, v] : lane.protocol_counters) protocol_counters[k] += v;
  store_latency.merge(lane.store_latency);
  sender.devices.insert(sender.devices.end(), lane.sender.devices.begin(), lane.sender.devices.end());
  for (const auto& [d, s] : lane.per_device) per_device[d].add(s);
}

void DeviceStats::add(const DeviceStats& o) {
  messages += o.messages;
  bytes += o.bytes;
  gaps += o.gaps;
  duplicates += o.duplicates;
  partial += o.partial;
  dropped += o.dropped;
  lost += o.lost;
  pauses += o.pauses;
  paused = paused || o.paused;
}

std::string host_id() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return id + "@" + host;
}

std::string bind_error_hint(int err) {
  switch (err) {
    case EADDRINUSE:
      return " (another process has that port: choose another, or port 0 for a free one)";
    case EADDRNOTAVAIL:
      return " (not an address of this host: give one of its addresses, or 0.0.0.0)";
    case EACCES:
      return " (ports below 1024 need CAP_NET_BIND_SERVICE: choose a port above 1023)";
    default:
      return "";
  }
}

std::string join(const std::vector<std::string>& items, const char* sep) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string shm_domain() {
  struct stat ipc {};
  const std::string ns = ::stat("/proc/self/ns/ipc", &ipc) == 0 ? std::to_string(ipc.st_ino) : "?";
  return "ipc=" + ns + ",uid=" + std::to_string(::geteuid());
}

std::optional<uint64_t> parse_size(std::string_view text) {
  uint64_t value = 0;
  size_t i = 0;
  for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) {
    if (value > (UINT64_MAX - 9) / 10) return std::nullopt;
    value = value * 10 + uint64_t(text[i] - '0');
  }
  if (i == 0) return std::nullopt;
  std::string unit(text.substr(i));
  for (char& c : unit) c = char(std::tolower(static_cast<unsigned char>(c)));
  int shift = 0;
  if (!unit.empty() && unit != "b") {
    const std::string_view prefixes = "kmgt";
    const size_t p = prefixes.find(unit[0]);
    const std::string_view rest = std::string_view(unit).substr(1);
    if (p == std::string_view::npos || (rest != "" && rest != "b" && rest != "ib")) return std::nullopt;
    shift = 10 * int(p + 1);
  }
  if (shift && value > (UINT64_MAX >> shift)) return std::nullopt;
  return value << shift;
}

std::string format_bytes(uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

namespace {

// The first number of a file (a cgroup value; "max" reads as nothing).
std::optional<uint64_t> read_number(const char* path) {
  std::ifstream in(path);
  uint64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;
}

}  // namespace

uint64_t available_memory() {
  uint64_t available = UINT64_MAX;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    if (key == "MemAvailable:" && meminfo >> kib) {
      available = kib * 1024;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  const std::pair<const char*, const char*> cgroups[] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (const auto& [limit_path, usage_path] : cgroups) {
    const auto limit = read_number(limit_path);
    const auto usage = read_number(usage_path);
    if (limit && usage) available = std::min(available, *limit > *usage ? *limit - *usage : 0);
  }
  return available;
}

uint64_t default_max_memory() {
  uint64_t physical = uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGESIZE));
  // In a container the cgroup's limit is what the OOM killer enforces (v2, then v1).
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::ifstream in(path);
    uint64_t limit = 0;
    if (in >> limit && limit > 0 && limit < physical) physical = limit;
  }
  return physical / 4;
}

}  // namespace slotstream
