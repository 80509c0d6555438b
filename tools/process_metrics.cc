// Process metrics from /proc/self (Linux), named as the Prometheus client libraries name them.
#include "process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include "metrics.h"
#include "slotstream/slotstream.h"

namespace slotstream::tools {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

// Fields of /proc/self/stat after the command name (which may contain spaces): field 14 is utime,
// 15 stime, 20 num_threads, 22 starttime (clock ticks since boot), 23 vsize (bytes), 24 rss (pages).
struct ProcStat {
  double utime = 0, stime = 0, threads = 0, starttime = 0, vsize = 0, rss = 0;
};

bool read_proc_stat(ProcStat* out) {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream fields(text.substr(close + 2));  // from field 3 (state) on
  std::vector<std::string> f((std::istream_iterator<std::string>(fields)), std::istream_iterator<std::string>());
  auto field = [&](size_t n) { return n - 3 < f.size() ? std::stod(f[n - 3]) : 0.0; };
  if (f.size() < 22) return false;
  *out = {field(14), field(15), field(20), field(22), field(23), field(24)};
  return true;
}

double boot_time_seconds() {
  std::ifstream in("/proc/stat");
  for (std::string key; in >> key;) {
    if (key == "btime") {
      double v = 0;
      in >> v;
      return v;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

MetricFamily gauge(const char* name, const char* help, double value, MetricType type = MetricType::Gauge) {
  return {name, help, type, {sample({}, type, value)}};
}

}  // namespace

std::vector<MetricFamily> process_families() {
  std::vector<MetricFamily> out;
  ProcStat st;
  const double tick = double(sysconf(_SC_CLK_TCK));
  if (read_proc_stat(&st) && tick > 0) {
    out.push_back(gauge("process_cpu_seconds_total", "Total user and system CPU time spent in seconds.",
                        (st.utime + st.stime) / tick, MetricType::Counter));
    out.push_back(gauge("process_resident_memory_bytes", "Resident memory size in bytes.",
                        st.rss * double(sysconf(_SC_PAGESIZE))));
    out.push_back(gauge("process_virtual_memory_bytes", "Virtual memory size in bytes.", st.vsize));
    out.push_back(gauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.",
                        boot_time_seconds() + st.starttime / tick));
    out.push_back(gauge("process_threads", "Number of OS threads in the process.", st.threads));
  }
  std::error_code ec;
  double fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec); !ec && it != end(it); it.increment(ec)) {
    ++fds;
  }
  out.push_back(gauge("process_open_fds", "Number of open file descriptors.", fds));
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    out.push_back(gauge("process_max_fds", "Maximum number of open file descriptors.", double(lim.rlim_cur)));
  }
  return out;
}

std::vector<MetricFamily> build_info_families() {
  return {{"slotstream_build_info",
           "Always 1; the labels say which slotstream this is.",
           MetricType::Gauge,
           {sample({{"version", version()}}, MetricType::Gauge, 1)}}};
}

}  // namespace slotstream::tools
