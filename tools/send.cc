// `slotstream send`: one filler thread per device feeds the library's DeviceStream.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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
#include <tuple>
#include <variant>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "commands.h"
#include "log.h"
#include "send_plan.h"
#include "synthetic.h"

namespace slotstream::tools {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::vector<uint16_t> Plan::devices() const {
  std::vector<uint16_t> d;
  for (auto& [dev, _] : files) d.push_back(dev);
  for (auto& [dev, _] : videos) d.push_back(dev);
  if (synthetic) {
    for (uint32_t i = synthetic->first; i <= synthetic->last; ++i) d.push_back(uint16_t(i));
  }
  std::sort(d.begin(), d.end());
  d.erase(std::unique(d.begin(), d.end()), d.end());
  return d;
}

namespace {

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

// A file is read only after connecting: opening it now turns "permission denied" into a usage
// error before the receiver has seen anything.
Status check_readable(const char* opt, const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return {Code::kInvalidArgument, std::string(opt) + ": cannot read '" + path.string() + "': " + strerror(errno)};
  ::close(fd);
  return Status::ok();
}

}  // namespace

Status build_plan(const SendArgs& a, Plan* plan) {
  for (const auto& f : a.files) {
    uint16_t d;
    std::string path;
    SLOTSTREAM_RETURN_IF_ERROR(split_assignment("--file", f, &d, &path));
    std::error_code ec;
    if (!fs::is_regular_file(path, ec))
      return {Code::kInvalidArgument, "--file: '" + path + "' is not a readable regular file"};
    SLOTSTREAM_RETURN_IF_ERROR(check_readable("--file", path));
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
    std::sort(entries.begin(), entries.end(),
              [](const fs::path& x, const fs::path& y) { return x.filename().string() < y.filename().string(); });
    for (const auto& e : entries) SLOTSTREAM_RETURN_IF_ERROR(check_readable("--dir", e));
    auto& list = plan->files[d];
    list.insert(list.end(), entries.begin(), entries.end());
  }
  for (const auto& spec : a.videos) {
    uint16_t d;
    std::string source;
    SLOTSTREAM_RETURN_IF_ERROR(split_assignment("--video", spec, &d, &source));
    if (plan->files.contains(d) || plan->videos.contains(d)) {
      return {Code::kInvalidArgument, "device " + std::to_string(d) + " has more than one video or file source"};
    }
    if (!source.starts_with("lavfi:") && !fs::exists(source)) {
      return {Code::kInvalidArgument, "--video: '" + source + "' does not exist"};
    }
    plan->videos[d] = source;
  }
  if (!a.synthetic.empty()) {
    Synthetic s;
    SLOTSTREAM_RETURN_IF_ERROR(parse_synthetic(a.synthetic, &s));
    if (a.duration <= 0) return {Code::kInvalidArgument, "--synthetic needs --duration SEC (> 0)"};
    for (uint32_t i = s.first; i <= s.last; ++i) {
      if (plan->files.contains(uint16_t(i)) || plan->videos.contains(uint16_t(i))) {
        return {Code::kInvalidArgument, "device " + std::to_string(i) + " is both synthetic and a file source"};
      }
    }
    plan->synthetic = s;
  } else if (a.duration > 0) {
    return {Code::kInvalidArgument, "--duration only applies to --synthetic"};
  }
  if (plan->files.empty() && plan->videos.empty() && !plan->synthetic) {
    return {Code::kInvalidArgument,
            "nothing to send: give --file D=PATH, --dir D=DIR, --video D=SOURCE or --synthetic SPEC"};
  }
  return Status::ok();
}

Status send_file(MessageOut& dev, const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {Code::kIoError, "cannot open '" + path.string() + "': " + strerror(errno)};
  struct stat st {};
  fstat(fd, &st);
  Status result = dev.send_with(uint64_t(st.st_size), [&](uint64_t offset, std::span<std::byte> dst) -> Status {
    size_t done = 0;
    while (done < dst.size()) {
      ssize_t n = ::pread(fd, dst.data() + done, dst.size() - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        return {Code::kIoError, "cannot read '" + path.string() + "'" +
                                    (n == 0 ? ": file shrank while sending" : std::string(": ") + strerror(errno))};
      }
      done += size_t(n);
    }
    return Status::ok();
  });
  ::close(fd);
  return result;
}

Status send_synthetic(MessageOut& dev, const Synthetic& s, double duration, std::atomic<uint64_t>* late) {
  const auto t0 = Clock::now();
  const uint64_t slots = uint64_t(duration * s.fps);
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1 / s.fps));
  const uint32_t device = dev.device();
  uint32_t frame = 0;
  for (uint64_t k = 0; k < slots; ++k) {
    const auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(k / s.fps));
    const auto now = Clock::now();
    if (now > due + period + kLateAfter) {
      late->fetch_add(1, std::memory_order_relaxed);  // its time has passed: not produced, not queued
      continue;
    }
    if (now < due) std::this_thread::sleep_until(due);
    SLOTSTREAM_RETURN_IF_ERROR(dev.send_with(s.frame_bytes, [&](uint64_t offset, std::span<std::byte> dst) {
      fill_synthetic(device, frame, s.frame_bytes, offset, dst);
      return Status::ok();
    }));
    ++frame;
  }
  return Status::ok();
}

// Decodes a video with an ffmpeg subprocess into raw 640x480 rgb24 frames, one message each.
Status send_video(MessageOut& dev, const std::string& source, bool realtime) {
  std::vector<std::string> argv = {"ffmpeg", "-v", "error", "-nostdin"};
  if (realtime) argv.push_back("-re");
  if (source.starts_with("lavfi:")) {
    argv.insert(argv.end(), {"-f", "lavfi", "-i", source.substr(6)});
  } else {
    argv.insert(argv.end(), {"-i", source});
  }
  argv.insert(argv.end(), {"-vf", "scale=640:480", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"});
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {Code::kIoError, std::string("pipe: ") + strerror(errno)};
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    execvp(args[0], args.data());
    static const char kMsg[] = "slotstream send: cannot run ffmpeg (apt-get install ffmpeg)\n";
    if (write(STDERR_FILENO, kMsg, sizeof kMsg - 1) < 0) { /* nothing more to say */
    }
    _exit(127);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    return {Code::kIoError, std::string("fork: ") + strerror(errno)};
  }
  std::vector<std::byte> frame(kVideoFrame);
  Status result;
  uint64_t frames = 0;
  for (;;) {
    size_t got = 0;
    while (got < frame.size()) {
      ssize_t n = ::read(fds[0], frame.data() + got, frame.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += size_t(n);
    }
    if (got == 0) break;  // end of the video
    if (got < frame.size()) {
      result = {Code::kIoError, "video '" + source + "' ended mid-frame"};
      break;
    }
    if (result = dev.send(frame); !result.is_ok()) break;
    ++frames;
  }
  ::close(fds[0]);
  if (!result.is_ok()) kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  if (result.is_ok() && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    result = {Code::kIoError, "ffmpeg failed on '" + source + "' (exit " + std::to_string(WEXITSTATUS(status)) + ")"};
  }
  if (result.is_ok() && frames == 0) result = {Code::kIoError, "video '" + source + "' has no frames"};
  return result;
}

Status plan_send(const SendArgs& a, Plan* plan, std::string* name) {
  SLOTSTREAM_RETURN_IF_ERROR(build_plan(a, plan));
  *name = a.name_given ? a.name : default_name();
  if (auto why = invalid_sender_name(*name)) return {Code::kInvalidArgument, "--name: " + *why};
  return Status::ok();
}

Fillers::Fillers(const Plan& plan, const SendArgs& a, const OutFactory& out_for) {
  for (auto& [d, paths] : plan.files) {
    threads_.emplace_back([this, out = out_for(d), &paths = paths] {
      for (const auto& p : paths) {
        if (Status st = send_file(*out, p); !st.is_ok()) return record(st);
      }
    });
  }
  for (auto& [d, source] : plan.videos) {
    threads_.emplace_back(
        [this, &a, out = out_for(d), &source = source] { record(send_video(*out, source, a.realtime)); });
  }
  if (plan.synthetic) {
    for (uint32_t d = plan.synthetic->first; d <= plan.synthetic->last; ++d) late_frames_[uint16_t(d)];
    for (auto& [d, late] : late_frames_) {
      threads_.emplace_back([this, &plan, &a, out = out_for(d), late = &late] {
        record(send_synthetic(*out, *plan.synthetic, a.duration, late));
      });
    }
  }
}

uint64_t Fillers::late_frames() const {
  uint64_t n = 0;
  for (const auto& [d, late] : late_frames_) n += late.load();
  return n;
}

uint64_t Fillers::late_frames(uint16_t device) const {
  auto it = late_frames_.find(device);
  return it == late_frames_.end() ? 0 : it->second.load();
}

void Fillers::record(Status st) {
  std::lock_guard lock(mutex_);
  if (first_error_.is_ok() && !st.is_ok()) first_error_ = std::move(st);
}

Status Fillers::join() {
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  std::lock_guard lock(mutex_);
  return first_error_;
}

void warn_late_frames(uint64_t late, const Plan& plan) {
  if (late == 0 || !plan.synthetic) return;
  const Synthetic& s = *plan.synthetic;
  char fps[32];
  std::snprintf(fps, sizeof fps, "%g", s.fps);
  log_warning(std::to_string(late) + " synthetic frames were late and not sent: this sender could not produce " +
              std::to_string(s.last - s.first + 1) + " cameras of " + std::to_string(s.frame_bytes) + " B at " + fps +
              " fps (--duration is wall-clock time)");
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

// `--to A,B,C`: asks every receiver for its capacity and picks the least loaded one — fewest
// unprocessed worker bytes, then lowest load per CPU, then fewest connected senders.
Status choose_receiver(const std::string& list, std::string* host, uint16_t* port) {
  std::vector<std::string> addrs;
  for (size_t pos = 0; pos <= list.size();) {
    size_t comma = list.find(',', pos);
    if (comma == std::string::npos) comma = list.size();
    if (comma > pos) addrs.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  if (addrs.empty()) return {Code::kInvalidArgument, "--to: no address"};
  for (const auto& a : addrs) {
    SLOTSTREAM_RETURN_IF_ERROR(parse_address(a, host, port));
  }
  if (addrs.size() == 1) return Status::ok();
  struct Candidate {
    std::string addr, host;
    uint16_t port;
    Capacity cap;
  };
  std::vector<Candidate> ok;
  std::string report;
  for (const auto& a : addrs) {
    Candidate c{a, "", 0, {}};
    (void)parse_address(a, &c.host, &c.port);
    if (Status st = query_capacity(c.host, c.port, &c.cap); !st.is_ok()) {
      report += "\n  " + a + ": unavailable (" + st.message() + ")";
      continue;
    }
    char line[256];
    std::snprintf(line, sizeof line, "\n  %s: backlog %llu B, load %.2f per CPU, %u senders, %llu MB free in /dev/shm",
                  a.c_str(), (unsigned long long)c.cap.backlog_bytes, c.cap.load, c.cap.senders,
                  (unsigned long long)(c.cap.shm_free_bytes >> 20));
    report += line;
    ok.push_back(c);
  }
  if (ok.empty()) return {Code::kConnectFailed, "no receiver answered:" + report};
  auto best = std::min_element(ok.begin(), ok.end(), [](const Candidate& x, const Candidate& y) {
    return std::tie(x.cap.backlog_bytes, x.cap.load, x.cap.senders) <
           std::tie(y.cap.backlog_bytes, y.cap.load, y.cap.senders);
  });
  log_info("using " + best->addr + ", the least loaded (fewest unprocessed bytes, then load, then senders):" + report);
  *host = best->host;
  *port = best->port;
  return Status::ok();
}

// Everything `send` needs before connecting, checked before anything touches the network: the
// plan of what each device sends (every file opened), the sender's name and options, the
// protocol, the token; then the receiver (one, or the least loaded of a list, which asks each;
// none with --platform, which chooses). kExitOk, or the exit code after printing what is wrong.
int check_sender_options(const SendArgs& a, Plan* plan, SenderOptions* opt) {
  if (Status st = plan_send(a, plan, &opt->name); !st.is_ok()) {
    print_error("send", st.message());
    return kExitUsage;
  }
  opt->protocol = a.protocol;
  opt->transport = *parse_transport(a.transport);
  if (auto why = misplaced_rdma_options(a.transport, a.rdma_transport, a.rdma_device)) {
    print_error("send", *why);
    return kExitUsage;
  }
  opt->rdma = rdma_options(a.rdma_transport, a.rdma_device);
  opt->blocks = a.blocks;
  opt->block_size = a.block_size;
  opt->devices = plan->devices();
  opt->stall_timeout = std::chrono::milliseconds(int64_t(a.stall_timeout * 1000 + 0.5));
  if (!a.token_file.empty()) {
    if (Status st = read_token(a.token_file, &opt->token); !st.is_ok()) {
      print_error("send", st.message());
      return kExitUsage;
    }
  }
  if (Status st = Sender::validate(*opt); !st.is_ok()) {
    print_error("send", st.message());
    return kExitUsage;
  }
  if (Status st = a.to.empty() ? Status::ok() : choose_receiver(a.to, &opt->host, &opt->port); !st.is_ok()) {
    print_error("send", st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  return kExitOk;
}

namespace {

// Says so once when no message has gone out for kStallNotice: a receiver that holds its blocks
// (its disk full, its workers behind) stalls the sender on purpose, and a log without a word about
// it looks like a hang. Says so again when messages move on. A receiver that has also said nothing
// meanwhile (not even its keepalive) is stopped or hung: the notice says when the sender gives up.
class StallNotice {
 public:
  static constexpr auto kStallNotice = std::chrono::seconds(5);
  explicit StallNotice(std::chrono::milliseconds stall_timeout) : stall_timeout_(stall_timeout) {}
  void observe(const SenderStats& s, Clock::time_point now, Clock::duration receiver_silence) {
    if (s.bytes != bytes_) {  // (records are counted only at the end; messages and bytes live)
      if (said_) log_info("sending again after " + std::to_string(seconds_since(now)) + " s");
      bytes_ = s.bytes;
      since_ = now;
      said_ = false;
    } else if (!said_ && now - since_ >= kStallNotice) {
      const std::string stalled = "no message has gone out for " + std::to_string(seconds_since(now)) + " s: ";
      if (receiver_silence >= kStallNotice) {
        char limit[96];
        std::snprintf(limit, sizeof limit, "this sender gives up after %.0f s of silence (--stall-timeout)",
                      stall_timeout_.count() / 1000.0);
        log_warning(stalled + "the receiver has said nothing for " +
                    std::to_string(std::chrono::duration_cast<std::chrono::seconds>(receiver_silence).count()) +
                    " s, not even its keepalive: it may be stopped or hung; " +
                    (stall_timeout_.count() > 0 ? limit : "waiting for it (--stall-timeout 0)"));
      } else {
        log_warning(stalled +
                    "if messages are waiting, every receiver block is in use or held (the receiver's disk may be "
                    "full or its workers behind: its log says which); waiting, nothing is dropped");
      }
      said_ = true;
    }
  }

 private:
  long seconds_since(Clock::time_point now) const {
    return long(std::chrono::duration_cast<std::chrono::seconds>(now - since_).count());
  }
  uint64_t bytes_ = 0;
  Clock::time_point since_ = Clock::now();
  bool said_ = false;
  std::chrono::milliseconds stall_timeout_;
};

// Live progress on stderr, twice a second, when it is a terminal (a final newline on stop()); a
// stall notice either way.
class ProgressLine {
 public:
  ProgressLine(const Sender& sender, Clock::time_point t0, std::chrono::milliseconds stall_timeout) {
    thread_ = std::thread([this, &sender, t0, stall_timeout, tty = bool(isatty(STDERR_FILENO))] {
      StallNotice stall(stall_timeout);
      while (!done_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        auto s = sender.stats();
        stall.observe(s, Clock::now(), sender.receiver_silence());
        if (!tty) continue;
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        std::fprintf(stderr, "\r%llu messages, %.1f MB, %.1f MB/s, %llu held-block skips   ",
                     (unsigned long long)s.messages, s.bytes / 1e6, secs > 0 ? s.bytes / 1e6 / secs : 0.0,
                     (unsigned long long)s.held_skips);
      }
      if (tty) std::fprintf(stderr, "\n");
    });
  }
  ~ProgressLine() { stop(); }
  void stop() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// `send --json`: one line of the run's totals and the sender's counters.
void print_send_json(const Sender& sender, const SenderOptions& opt, double secs, double cpu, uint64_t late) {
  SenderStats s = sender.stats();
  nlohmann::json j;
  j["messages"] = s.messages;
  j["bytes"] = s.bytes;
  j["seconds"] = secs;
  j["mb_per_s"] = secs > 0 ? s.bytes / 1e6 / secs : 0.0;
  nlohmann::json per = nlohmann::json::object();
  for (auto& [d, n] : s.per_device) per[std::to_string(d)] = n;
  j["devices"] = per;
  j["cpu_seconds"] = cpu;
  j["transport"] = transport_name(sender.transport());
  j["transport_reason"] = sender.transport_reason();
  j["protocol"] = opt.protocol;
  j["blocks"] = opt.blocks;
  j["block_size"] = opt.block_size;
  j["records_sent"] = s.records;
  j["sync_operations"] = s.sync_operations;
  j["waits"] = s.waits;
  j["wait_seconds"] = s.wait_ns / 1e9;
  j["held_skips"] = s.held_skips;
  j["protocol_counters"] = s.protocol_counters;
  j["late_frames"] = late;
  std::printf("%s\n", j.dump().c_str());
}

}  // namespace

int run_send(const SendArgs& a) {
  SenderOptions opt;
  Plan plan;
  if (int rc = check_sender_options(a, &plan, &opt); rc != kExitOk) return rc;

  std::unique_ptr<Sender> sender;
  if (Status st = Sender::connect(opt, &sender); !st.is_ok()) {
    print_error("send", st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  // Which transport the receiver chose, and why (what failed before it, the UCX environment).
  print_line(stderr, "slotstream send: transport " + sender->transport_reason());
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();

  Fillers fillers(plan, a, [&](uint16_t d) -> std::unique_ptr<MessageOut> {
    return std::make_unique<StreamOut>(*sender->device(d));
  });
  ProgressLine progress(*sender, t0, opt.stall_timeout);
  Status st = fillers.join();
  Status fin = sender->finish();
  if (st.is_ok()) st = fin;
  progress.stop();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!st.is_ok()) {
    print_error("send", st.message());
    return kExitError;
  }
  warn_late_frames(fillers.late_frames(), plan);
  if (a.json) print_send_json(*sender, opt, secs, cpu_seconds() - cpu0, fillers.late_frames());
  return kExitOk;
}

}  // namespace slotstream::tools
