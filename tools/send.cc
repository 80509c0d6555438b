// `slotstream send`: one filler thread per device feeds the library's DeviceStream.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
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
#include "dgram_cli.h"
#include "interrupt.h"
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

Status parse_video_size(const std::string& text, Video* v) {
  unsigned w = 0, h = 0;
  char tail;
  if (std::sscanf(text.c_str(), "%ux%u%c", &w, &h, &tail) != 2 || w == 0 || h == 0 || w > 16384 || h > 16384) {
    return {Code::kInvalidArgument, "--video-size expects WxH (1..16384 each), e.g. 1280x720, got '" + text + "'"};
  }
  v->width = w;
  v->height = h;
  v->scaled = true;
  return Status::ok();
}

// Runs argv (no shell) and returns its stdout; *ok says whether it exited 0.
std::string run_capture(const std::vector<std::string>& argv, bool* ok) {
  *ok = false;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "";
  std::vector<char*> args;
  for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, STDERR_FILENO);
    execvp(args[0], args.data());
    _exit(127);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; pid > 0 && ((n = ::read(fds[0], buf, sizeof buf)) > 0 || (n < 0 && errno == EINTR));) {
    if (n > 0) out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  int status = 0;
  if (pid > 0 && waitpid(pid, &status, 0) == pid) *ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return out;
}

// ffmpeg's input arguments for a --video source.
std::vector<std::string> video_input(const std::string& source) {
  if (source.starts_with("lavfi:")) return {"-f", "lavfi", "-i", source.substr(6)};
  return {"-i", source};
}

}  // namespace

Status probe_video(Video* v) {
  std::vector<std::string> argv = {"ffprobe", "-v", "error", "-select_streams", "v:0", "-show_entries"};
  argv.insert(argv.end(), {"stream=width,height", "-of", "default=noprint_wrappers=1"});
  for (auto& arg : video_input(v->source)) argv.push_back(arg);
  bool ok = false;
  const std::string out = run_capture(argv, &ok);
  unsigned w = 0, h = 0;
  for (size_t pos = 0; pos < out.size();) {
    size_t end = out.find('\n', pos);
    if (end == std::string::npos) end = out.size();
    const std::string line = out.substr(pos, end - pos);
    if (line.starts_with("width=")) w = unsigned(std::strtoul(line.c_str() + 6, nullptr, 10));
    if (line.starts_with("height=")) h = unsigned(std::strtoul(line.c_str() + 7, nullptr, 10));
    pos = end + 1;
  }
  if (!ok || w == 0 || h == 0 || w > 16384 || h > 16384) {
    return {Code::kInvalidArgument,
            "--video: cannot tell the frame size of '" + v->source + "' (ffprobe " +
                (ok ? "found no video stream" : "failed: is it a video, and is ffmpeg installed?") +
                "); give --video-size WxH to have it scaled"};
  }
  v->width = w;
  v->height = h;
  return Status::ok();
}

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
    if (entries.empty()) {
      return {Code::kInvalidArgument, "--dir: '" + dir + "' has no regular file: device " + std::to_string(d) +
                                          " would send nothing (each file in it is one message)"};
    }
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
    Video v{source};
    if (!a.video_size.empty()) {
      SLOTSTREAM_RETURN_IF_ERROR(parse_video_size(a.video_size, &v));
    } else {
      SLOTSTREAM_RETURN_IF_ERROR(probe_video(&v));
    }
    plan->videos[d] = v;
  }
  if (!a.video_size.empty() && a.videos.empty()) {
    return {Code::kInvalidArgument, "--video-size only applies to --video"};
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

Status send_synthetic(MessageOut& dev, const Synthetic& s, double duration, std::atomic<uint64_t>* late,
                      const std::atomic<bool>* stop) {
  auto stopped = [stop] { return stop && stop->load(std::memory_order_acquire); };
  const auto t0 = Clock::now();
  const uint64_t slots = uint64_t(duration * s.fps);
  const auto period = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1 / s.fps));
  const uint32_t device = dev.device();
  uint32_t frame = 0;
  for (uint64_t k = 0; k < slots && !stopped(); ++k) {
    const auto due = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(k / s.fps));
    const auto now = Clock::now();
    if (now > due + period + kLateAfter) {
      late->fetch_add(1, std::memory_order_relaxed);  // its time has passed: not produced, not queued
      continue;
    }
    // Asleep in slices, so that a stop is seen at once even at a slow frame rate.
    while (Clock::now() < due && !stopped()) {
      std::this_thread::sleep_until(std::min(due, Clock::now() + std::chrono::milliseconds(50)));
    }
    if (stopped()) break;
    SLOTSTREAM_RETURN_IF_ERROR(dev.send_with(s.frame_bytes, [&](uint64_t offset, std::span<std::byte> dst) {
      fill_synthetic(device, frame, s.frame_bytes, offset, dst);
      return Status::ok();
    }));
    ++frame;
  }
  return Status::ok();
}

// Decodes a video with an ffmpeg subprocess into raw rgb24 frames of the plan's size, one message
// each. ffmpeg runs in a process group of its own: Ctrl-C reaches slotstream alone, which ends it
// when asked to stop, and it dies with slotstream (death signal, or its pipe closing).
Status send_video(MessageOut& dev, const Video& video, bool realtime, const std::atomic<bool>* stop) {
  std::vector<std::string> argv = {"ffmpeg", "-v", "error", "-nostdin"};
  if (realtime) argv.push_back("-re");
  for (auto& arg : video_input(video.source)) argv.push_back(arg);
  if (video.scaled) {
    argv.insert(argv.end(), {"-vf", "scale=" + std::to_string(video.width) + ":" + std::to_string(video.height)});
  }
  argv.insert(argv.end(), {"-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1"});
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return {Code::kIoError, std::string("pipe: ") + strerror(errno)};
  std::vector<char*> args;
  for (auto& s : argv) args.push_back(s.data());
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // send blocks SIGINT/SIGTERM (tools/interrupt.h); ffmpeg must not
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
  auto stopped = [stop] { return stop && stop->load(std::memory_order_acquire); };
  std::vector<std::byte> frame(video.frame_bytes());
  Status result;
  uint64_t frames = 0;
  while (!stopped()) {
    size_t got = 0;
    while (got < frame.size() && !stopped()) {
      pollfd pfd{fds[0], POLLIN, 0};
      if (::poll(&pfd, 1, 100) == 0) continue;  // a slow (-re) source: look at `stop` meanwhile
      ssize_t n = ::read(fds[0], frame.data() + got, frame.size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += size_t(n);
    }
    if (got == 0 || stopped()) break;  // the end of the video, or asked to stop (a part frame is not sent)
    if (got < frame.size()) {
      result = {Code::kIoError, "video '" + video.source + "' ended mid-frame"};
      break;
    }
    if (result = dev.send(frame); !result.is_ok()) break;
    ++frames;
  }
  const bool ended_early = !result.is_ok() || stopped();
  // Its output is not wanted any more: SIGKILL, as ffmpeg would answer SIGTERM by writing the rest
  // into the closed pipe ("Broken pipe" on stderr).
  if (ended_early) kill(pid, SIGKILL);
  ::close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!ended_early && (!WIFEXITED(status) || WEXITSTATUS(status) != 0)) {
    result = {Code::kIoError,
              "ffmpeg failed on '" + video.source + "' (exit " + std::to_string(WEXITSTATUS(status)) + ")"};
  }
  if (result.is_ok() && frames == 0 && !stopped())
    result = {Code::kIoError, "video '" + video.source + "' has no frames"};
  return result;
}

Status plan_send(const SendArgs& a, Plan* plan, std::string* name) {
  SLOTSTREAM_RETURN_IF_ERROR(build_plan(a, plan));
  *name = a.name_given ? a.name : default_name();
  if (auto why = invalid_sender_name(*name)) return {Code::kInvalidArgument, "--name: " + *why};
  return Status::ok();
}

// A device's MessageOut that counts what it sent (Fillers::sent).
class Fillers::CountingOut final : public MessageOut {
 public:
  CountingOut(std::unique_ptr<MessageOut> out, Count& count) : out_(std::move(out)), count_(count) {}
  uint16_t device() const override { return out_->device(); }
  Status send_with(uint64_t length, const DeviceStream::FillFn& fill) override {
    return counted(out_->send_with(length, fill), length);
  }
  Status send(std::span<const std::byte> message) override { return counted(out_->send(message), message.size()); }

 private:
  Status counted(Status st, uint64_t length) {
    if (st.is_ok()) {  // one thread per device writes these
      count_.messages.store(count_.messages.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
      count_.bytes.store(count_.bytes.load(std::memory_order_relaxed) + length, std::memory_order_relaxed);
    }
    return st;
  }
  std::unique_ptr<MessageOut> out_;
  Count& count_;
};

std::unique_ptr<MessageOut> Fillers::counted(uint16_t d, std::unique_ptr<MessageOut> out) {
  return std::make_unique<CountingOut>(std::move(out), counts_.at(d));
}

Fillers::Fillers(const Plan& plan, const SendArgs& a, const OutFactory& out_for, const std::atomic<bool>* stop) {
  for (uint16_t d : plan.devices()) counts_[d];
  for (auto& [d, paths] : plan.files) {
    threads_.emplace_back([this, stop, out = counted(d, out_for(d)), &paths = paths] {
      for (const auto& p : paths) {
        if (stop && stop->load(std::memory_order_acquire)) return;
        if (Status st = send_file(*out, p); !st.is_ok()) return record(st);
      }
    });
  }
  for (auto& [d, video] : plan.videos) {
    threads_.emplace_back([this, &a, stop, out = counted(d, out_for(d)), &video = video] {
      record(send_video(*out, video, a.realtime, stop));
    });
  }
  if (plan.synthetic) {
    for (uint32_t d = plan.synthetic->first; d <= plan.synthetic->last; ++d) late_frames_[uint16_t(d)];
    for (auto& [d, late] : late_frames_) {
      threads_.emplace_back([this, &plan, &a, stop, out = counted(d, out_for(d)), late = &late] {
        record(send_synthetic(*out, *plan.synthetic, a.duration, late, stop));
      });
    }
  }
}

std::map<uint16_t, uint64_t> Fillers::sent() const {
  std::map<uint16_t, uint64_t> out;
  for (const auto& [d, c] : counts_) out[d] = c.messages.load(std::memory_order_relaxed);
  return out;
}

uint64_t Fillers::sent_bytes() const {
  uint64_t n = 0;
  for (const auto& [d, c] : counts_) n += c.bytes.load(std::memory_order_relaxed);
  return n;
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

namespace {

// The largest message of the plan: what a datagram sender announces (the receiver's regions' size).
uint64_t largest_message(const Plan& plan) {
  uint64_t m = 1;
  for (const auto& [_, paths] : plan.files) {
    for (const auto& p : paths) {
      std::error_code ec;
      m = std::max<uint64_t>(m, fs::file_size(p, ec));
    }
  }
  for (const auto& [_, v] : plan.videos) m = std::max<uint64_t>(m, v.frame_bytes());
  if (plan.synthetic) m = std::max(m, plan.synthetic->frame_bytes);
  return m;
}

// The datagram transport's part of the options: one receiver, --segment-size, --ttl, --interface,
// --inject-*, and the plan's largest message.
Status datagram_sender_options(const SendArgs& a, const DgramArgs* dgram, const Plan& plan, SenderOptions* opt) {
  SLOTSTREAM_RETURN_IF_ERROR(check_datagram_protocol(a));
  if (a.to.find(',') != std::string::npos) {
    return {Code::kInvalidArgument, "--to: the datagram transport sends to one receiver"};
  }
  if (dgram) SLOTSTREAM_RETURN_IF_ERROR(datagram_send_options(*dgram, &opt->datagram));
  opt->datagram.max_message = largest_message(plan);
  return Status::ok();
}

}  // namespace

// Everything `send` needs before connecting, checked before anything touches the network: the
// plan of what each device sends (every file opened, every video's size known), the sender's name
// and options, the protocol, the token; then the receiver (one, or the least loaded of a list,
// which asks each; none with --platform, which chooses).
Status check_sender_options(const SendArgs& a, Plan* plan, SenderOptions* opt, const DgramArgs* dgram) {
  SLOTSTREAM_RETURN_IF_ERROR(plan_send(a, plan, &opt->name));
  const bool datagram = is_dgram_send(a);
  // Not given: the transport's default (the library's: udp has its own).
  opt->protocol = datagram && !a.protocol_given ? "" : a.protocol;
  opt->transport = *parse_transport(a.transport);
  if (auto why = misplaced_rdma_options(a.transport, a.rdma_transport, a.rdma_device)) {
    return {Code::kInvalidArgument, *why};
  }
  opt->rdma = rdma_options(a.rdma_transport, a.rdma_device);
  opt->blocks = a.blocks;
  opt->block_size = a.block_size;
  opt->devices = plan->devices();
  opt->stall_timeout = std::chrono::milliseconds(int64_t(a.stall_timeout * 1000 + 0.5));
  if (!a.token_file.empty()) {
    if (Status st = read_token(a.token_file, &opt->token); !st.is_ok()) return {Code::kInvalidArgument, st.message()};
  }
  if (datagram) SLOTSTREAM_RETURN_IF_ERROR(datagram_sender_options(a, dgram, *plan, opt));
  SLOTSTREAM_RETURN_IF_ERROR(Sender::validate(*opt));
  if (datagram) {
    Status st = parse_address(a.to, &opt->host, &opt->port);
    return st.is_ok() ? st : Status{Code::kInvalidArgument, "--to: " + st.message()};
  }
  return a.to.empty() ? Status::ok() : choose_receiver(a.to, &opt->host, &opt->port);
}

// One stderr line per video: the frames it becomes (the size is the source's, or --video-size).
void describe_videos(const Plan& plan) {
  for (const auto& [d, v] : plan.videos) {
    print_line(stderr, "slotstream send: device " + std::to_string(d) + ": '" + v.source + "' as " +
                           std::to_string(v.width) + "x" + std::to_string(v.height) + " rgb24 frames of " +
                           std::to_string(v.frame_bytes()) + " B" +
                           (v.scaled ? " (scaled: --video-size)" : " (its own size; --video-size WxH scales)"));
  }
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

// What plain `send` adds to the summary: the sender's own counters.
nlohmann::json sender_counters(const SenderStats& s) {
  return {{"records_sent", s.records},  {"sync_operations", s.sync_operations},
          {"waits", s.waits},           {"wait_seconds", s.wait_ns / 1e9},
          {"held_skips", s.held_skips}, {"protocol_counters", s.protocol_counters}};
}

}  // namespace

int run_send(const SendArgs& a, const DgramArgs& dgram) {
  Interrupt interrupt("send");  // before any thread: they all inherit its blocked signals
  SenderOptions opt;
  Plan plan;
  if (Status st = check_sender_options(a, &plan, &opt, &dgram); !st.is_ok()) {
    return send_failed(a, st, exit_code_of(st));
  }
  const bool datagram = is_dgram_send(a);
  describe_videos(plan);

  std::unique_ptr<Sender> sender;
  if (Status st = Sender::connect(opt, &sender); !st.is_ok()) return send_failed(a, st, exit_code_of(st));
  interrupt.arm();
  // Which transport the receiver chose, and why (what failed before it, the UCX environment). The
  // datagram transport has no choice to explain.
  if (!datagram) print_line(stderr, "slotstream send: transport " + sender->transport_reason());
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();

  Fillers fillers(
      plan, a,
      [&](uint16_t d) -> std::unique_ptr<MessageOut> { return std::make_unique<StreamOut>(*sender->device(d)); },
      &interrupt.stop());
  std::optional<ProgressLine> progress;  // a stall notice speaks of receiver blocks: not the datagram transport's
  if (!datagram) progress.emplace(*sender, t0, opt.stall_timeout);
  Status st = fillers.join();
  Status fin = sender->finish();
  if (st.is_ok()) st = fin;
  if (progress) progress->stop();
  SendSummary summary;
  fill_summary(fillers, t0, cpu0, &summary);
  summary.transport = transport_name(sender->transport());
  summary.protocol = a.protocol_given ? a.protocol : sender->protocol();
  summary.blocks = opt.blocks;
  summary.interrupted = interrupt.signal();
  const SenderStats stats = sender->stats();
  if (datagram) {
    summary.extra = datagram_send_extras(opt, stats);
    if (st.is_ok()) summary.extra["receiver"] = datagram_receiver_report(stats, sender->protocol());
  } else {
    summary.transport_reason = sender->transport_reason();
    summary.block_size = opt.block_size;
    summary.extra = sender_counters(stats);
  }
  return report_send(a, plan, summary, st);
}

}  // namespace slotstream::tools
