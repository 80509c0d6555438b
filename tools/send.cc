// `slotstream send`: one filler thread per device feeds the library's DeviceStream.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>
#include <variant>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "net/auth.h"
#include "net/control_socket.h"
#include "synthetic.h"

namespace slotstream::tools {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

struct Synthetic {
  uint32_t first = 0, last = 0;
  double fps = 0;
  uint64_t frame_bytes = 0;
};

// What each device sends, in order.
struct Plan {
  std::map<uint16_t, std::vector<fs::path>> files;
  std::optional<Synthetic> synthetic;
  std::vector<uint16_t> devices() const {
    std::vector<uint16_t> d;
    for (auto& [dev, _] : files) d.push_back(dev);
    if (synthetic) {
      for (uint32_t i = synthetic->first; i <= synthetic->last; ++i) d.push_back(uint16_t(i));
    }
    std::sort(d.begin(), d.end());
    d.erase(std::unique(d.begin(), d.end()), d.end());
    return d;
  }
};

bool parse_device(const std::string& s, uint16_t* out) {
  if (s.empty() || s.size() > 5 || !std::all_of(s.begin(), s.end(), ::isdigit)) return false;
  unsigned long v = std::stoul(s);
  if (v > 65535) return false;
  *out = uint16_t(v);
  return true;
}

Status split_assignment(const std::string& opt, const std::string& text, uint16_t* dev, std::string* value) {
  auto eq = text.find('=');
  if (eq == std::string::npos || !parse_device(text.substr(0, eq), dev) || eq + 1 == text.size()) {
    return {Code::kInvalidArgument, opt + " expects D=PATH with a device number 0-65535, got '" + text + "'"};
  }
  *value = text.substr(eq + 1);
  return Status::ok();
}

Status parse_synthetic(const std::string& text, Synthetic* out) {
  const std::string usage = "--synthetic expects D0-D1:FPS:WxHxC (e.g. 0-11:25:640x480x3), got '" + text + "'";
  unsigned d0 = 0, d1 = 0, w = 0, h = 0, c = 0;
  double fps = 0;
  char tail;
  int n = std::sscanf(text.c_str(), "%u-%u:%lf:%ux%ux%u%c", &d0, &d1, &fps, &w, &h, &c, &tail);
  if (n != 6) {
    n = std::sscanf(text.c_str(), "%u:%lf:%ux%ux%u%c", &d0, &fps, &w, &h, &c, &tail);
    if (n != 5) return {Code::kInvalidArgument, usage};
    d1 = d0;
  }
  if (d0 > d1 || d1 > 65535 || fps <= 0 || fps > 100000 || w == 0 || h == 0 || c == 0) {
    return {Code::kInvalidArgument, usage + " (devices 0-65535 ascending, FPS > 0, sizes > 0)"};
  }
  uint64_t bytes = uint64_t(w) * h * c;
  if (bytes < kSyntheticHeader || bytes > (1ull << 32)) {
    return {Code::kInvalidArgument, "--synthetic frame must be 16 B .. 4 GiB, got " + std::to_string(bytes)};
  }
  *out = {d0, d1, fps, bytes};
  return Status::ok();
}

Status build_plan(const SendArgs& a, Plan* plan) {
  for (const auto& f : a.files) {
    uint16_t d;
    std::string path;
    SLOTSTREAM_RETURN_IF_ERROR(split_assignment("--file", f, &d, &path));
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return {Code::kInvalidArgument, "--file: '" + path + "' is not a readable regular file"};
    plan->files[d].push_back(path);
  }
  for (const auto& spec : a.dirs) {
    uint16_t d;
    std::string dir;
    SLOTSTREAM_RETURN_IF_ERROR(split_assignment("--dir", spec, &d, &dir));
    std::error_code ec;
    std::vector<fs::path> entries;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      if (e.is_regular_file()) entries.push_back(e.path());
    }
    if (ec) return {Code::kInvalidArgument, "--dir: cannot list '" + dir + "': " + ec.message()};
    std::sort(entries.begin(), entries.end(), [](const fs::path& x, const fs::path& y) {
      return x.filename().string() < y.filename().string();
    });
    auto& list = plan->files[d];
    list.insert(list.end(), entries.begin(), entries.end());
  }
  if (!a.synthetic.empty()) {
    Synthetic s;
    SLOTSTREAM_RETURN_IF_ERROR(parse_synthetic(a.synthetic, &s));
    if (a.duration <= 0) return {Code::kInvalidArgument, "--synthetic needs --duration SEC (> 0)"};
    for (uint32_t i = s.first; i <= s.last; ++i) {
      if (plan->files.contains(uint16_t(i))) {
        return {Code::kInvalidArgument, "device " + std::to_string(i) + " is both synthetic and a file source"};
      }
    }
    plan->synthetic = s;
  } else if (a.duration > 0) {
    return {Code::kInvalidArgument, "--duration only applies to --synthetic"};
  }
  if (plan->files.empty() && !plan->synthetic) {
    return {Code::kInvalidArgument, "nothing to send: give --file D=PATH, --dir D=DIR or --synthetic SPEC"};
  }
  return Status::ok();
}

Status send_file(DeviceStream& dev, const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {Code::kIoError, "cannot open '" + path.string() + "': " + strerror(errno)};
  struct stat st{};
  fstat(fd, &st);
  Status result = dev.send_with(uint64_t(st.st_size), [&](uint64_t offset, std::span<std::byte> dst) -> Status {
    size_t done = 0;
    while (done < dst.size()) {
      ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return {Code::kIoError, "cannot read '" + path.string() + "'" + (n == 0 ? ": file shrank while sending" : std::string(": ") + strerror(errno))};
      }
      done += size_t(n);
    }
    return Status::ok();
  });
  ::close(fd);
  return result;
}

Status send_synthetic(DeviceStream& dev, const Synthetic& s, double duration) {
  const auto t0 = Clock::now();
  const uint64_t frames = uint64_t(duration * s.fps);
  const uint32_t device = dev.device();
  for (uint64_t k = 0; k < frames; ++k) {
    std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(k / s.fps)));
    SLOTSTREAM_RETURN_IF_ERROR(dev.send_with(s.frame_bytes, [&](uint64_t offset, std::span<std::byte> dst) {
      fill_synthetic(device, uint32_t(k), s.frame_bytes, offset, dst);
      return Status::ok();
    }));
  }
  return Status::ok();
}

double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

std::string default_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

}  // namespace

int run_send(const SendArgs& a) {
  SenderOptions opt;
  if (Status st = net::parse_host_port(a.to, &opt.host, &opt.port); !st.is_ok()) {
    print_error("send", "--to: " + st.message());
    return kExitUsage;
  }
  Plan plan;
  if (Status st = build_plan(a, &plan); !st.is_ok()) {
    print_error("send", st.message());
    return kExitUsage;
  }
  opt.name = a.name_given ? a.name : default_name();
  if (auto why = invalid_sender_name(opt.name)) {
    print_error("send", "--name: " + *why);
    return kExitUsage;
  }
  opt.protocol = a.protocol;
  opt.transport = *parse_transport(a.transport);
  opt.blocks = a.blocks;
  opt.block_size = a.block_size;
  opt.devices = plan.devices();
  if (!a.token_file.empty()) {
    if (Status st = net::read_token_file(a.token_file, &opt.token); !st.is_ok()) {
      print_error("send", st.message());
      return kExitUsage;
    }
  }

  std::unique_ptr<Sender> sender;
  if (Status st = Sender::connect(opt, &sender); !st.is_ok()) {
    print_error("send", st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();

  std::mutex err_mutex;
  Status first_error;
  std::vector<std::thread> fillers;
  auto record = [&](Status st) {
    std::lock_guard lock(err_mutex);
    if (first_error.is_ok() && !st.is_ok()) first_error = std::move(st);
  };
  for (auto& [d, paths] : plan.files) {
    fillers.emplace_back([&, dev = sender->device(d), &paths = paths] {
      for (const auto& p : paths) {
        Status st = send_file(*dev, p);
        if (!st.is_ok()) return record(st);
      }
    });
  }
  if (plan.synthetic) {
    for (uint32_t d = plan.synthetic->first; d <= plan.synthetic->last; ++d) {
      fillers.emplace_back([&, dev = sender->device(uint16_t(d))] { record(send_synthetic(*dev, *plan.synthetic, a.duration)); });
    }
  }

  // Live progress on a terminal only.
  std::atomic<bool> done{false};
  std::thread progress;
  if (isatty(STDERR_FILENO)) {
    progress = std::thread([&] {
      while (!done.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        auto s = sender->stats();
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        std::fprintf(stderr, "\r%llu messages, %.1f MB, %.1f MB/s   ", (unsigned long long)s.messages, s.bytes / 1e6,
                     secs > 0 ? s.bytes / 1e6 / secs : 0.0);
      }
      std::fprintf(stderr, "\n");
    });
  }
  for (auto& t : fillers) t.join();
  Status st = first_error;
  Status fin = sender->finish();
  if (st.is_ok()) st = fin;
  done.store(true);
  if (progress.joinable()) progress.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.is_ok()) {
    print_error("send", st.message());
    return kExitError;
  }
  SenderStats s = sender->stats();
  if (a.json) {
    nlohmann::json j;
    j["messages"] = s.messages;
    j["bytes"] = s.bytes;
    j["seconds"] = secs;
    j["mb_per_s"] = secs > 0 ? s.bytes / 1e6 / secs : 0.0;
    nlohmann::json per = nlohmann::json::object();
    for (auto& [d, n] : s.per_device) per[std::to_string(d)] = n;
    j["devices"] = per;
    j["cpu_seconds"] = cpu_seconds() - cpu0;
    j["transport"] = transport_name(sender->transport());
    j["protocol"] = opt.protocol;
    j["blocks"] = opt.blocks;
    j["block_size"] = opt.block_size;
    j["blocks_sent"] = s.blocks;
    j["status_reads"] = s.status_reads;
    j["held_skips"] = s.held_skips;
    std::printf("%s\n", j.dump().c_str());
  }
  return kExitOk;
}

}  // namespace slotstream::tools
