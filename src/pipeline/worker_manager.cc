#include "pipeline/worker_manager.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string_view>

#include "sink/dir_sink.h"

namespace slotstream::pipeline {
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {
constexpr auto kSupervisePeriod = 100ms;
constexpr auto kMaxBackoff = std::chrono::milliseconds(30000);
constexpr auto kStableRun = 10s;  // a worker that ran this long starts its back-off afresh
constexpr auto kStopGrace = 3s;

std::string worker_name(const std::string& sender, uint16_t device) {
  return "slotstream-" + sender + "-device-" + std::to_string(device);
}
}  // namespace

WorkerManager::WorkerManager(WorkerOptions options) : options_(std::move(options)) {
  if (options_.progress.empty()) options_.progress = options_.out;
  supervisor_ = std::thread([this] { supervise(); });
}

WorkerManager::~WorkerManager() { stop(); }

std::vector<std::string> WorkerManager::argv_for(const std::string& sender, uint16_t device) const {
  const std::string dev = std::to_string(device);
  if (options_.runtime == Runtime::kProcess) return {"/bin/sh", "-c", options_.command};
  fs::path base = fs::absolute(options_.out) / sender;
  // --user 0:0: the image's default user is the unprivileged daemon (10001), but a worker must own
  // what the receiver created for it. That is the container's root: the receiver's own root under
  // rootful podman, the receiver's user under rootless podman. It needs no capability to write its
  // own files, so it gets none (--cap-drop all, no-new-privileges).
  // --init: a tiny init as PID 1 forwards SIGTERM (a shell as PID 1 ignores it, so every stop
  // would wait out the timeout); it needs catatonit, which scripts/setup.sh installs.
  std::vector<std::string> a = {"podman",
                                "--runtime",
                                "runc",
                                "run",
                                "--rm",
                                "--replace",
                                "--init",
                                "--name",
                                worker_name(sender, device),
                                "--network",
                                "none",
                                "--user",
                                "0:0",
                                "--cap-drop",
                                "all",
                                "--security-opt",
                                "no-new-privileges",
                                "--ulimit",
                                "nofile=20000:20000",
                                "--ulimit",
                                "nproc=4096:4096",
                                "-v",
                                (base / ("device-" + dev)).string() + ":/data/device:ro",
                                "-v",
                                (base / ("worker-" + dev)).string() + ":/data/worker",
                                "-e",
                                "SLOTSTREAM_DEVICE_DIR=/data/device",
                                "-e",
                                "SLOTSTREAM_WORKER_DIR=/data/worker",
                                "-e",
                                "SLOTSTREAM_SENDER=" + sender,
                                "-e",
                                "SLOTSTREAM_DEVICE=" + dev};
  if (!options_.cpus.empty()) a.insert(a.end(), {"--cpus", options_.cpus});
  if (!options_.memory.empty()) a.insert(a.end(), {"--memory", options_.memory});
  a.insert(a.end(), {"--entrypoint", "/bin/sh", options_.image, "-c", options_.command});
  return a;
}

WorkerManager::DeviceWorker& WorkerManager::worker_locked(const std::string& sender, uint16_t device) {
  auto [it, fresh] = workers_.try_emplace({sender, device});
  DeviceWorker& w = it->second;
  if (fresh) {
    w.sender = sender;
    w.device = device;
    w.device_dir = options_.out / sender / ("device-" + std::to_string(device));
    w.worker_dir = options_.progress / sender / ("worker-" + std::to_string(device));
    std::error_code ec;
    if (!options_.command.empty()) fs::create_directories(w.worker_dir, ec);
    // Messages of an earlier run that the worker has not finished are backlog too.
    refresh_locked(w);
    for (const auto& e : fs::directory_iterator(w.device_dir, ec)) {
      std::string n = e.path().filename().string();
      if (n.size() != 14 || !n.ends_with(".bin") || n[0] == '.') continue;
      uint64_t seq = std::strtoull(n.c_str(), nullptr, 10);
      if (int64_t(seq) > w.done) {
        w.pending.emplace_back(seq, e.file_size(ec));
      } else if (options_.keep > 0) {
        w.finished.push_back(seq);  // finished in an earlier run, kept by its --keep
      }
      w.newest = std::max(w.newest, seq + 1);
    }
    std::sort(w.pending.begin(), w.pending.end());
    std::sort(w.finished.begin(), w.finished.end());
    for (auto& [s, b] : w.pending) w.pending_bytes += b;
  }
  return w;
}

namespace {

// Runs in the keeper process, after fork(): only async-signal-safe calls from here on.
//
// A worker command may start processes of its own (a compound shell command, a pipeline, a
// daemon). PR_SET_PDEATHSIG reaches only the direct child, so a SIGKILLed receiver would leave
// those grandchildren running. The keeper starts the command in a process group of its own,
// adopts anything that double-forks (child subreaper), and kills the whole group when the
// command ends, when the receiver stops the worker (SIGTERM) or when the receiver dies (the
// keeper's death signal). It then ends the way the command ended (same exit status or signal),
// so the receiver's supervisor sees the worker's own outcome.
[[noreturn]] void keep_worker(char* const* args, char* const* envp) {
  constexpr int kGraceMs = 2000;  // after SIGTERM, before SIGKILL
  sigset_t waitable, none;
  sigemptyset(&waitable);
  sigaddset(&waitable, SIGCHLD);
  sigaddset(&waitable, SIGTERM);
  sigaddset(&waitable, SIGINT);
  sigemptyset(&none);
  sigprocmask(SIG_BLOCK, &waitable, nullptr);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t command = fork();
  if (command == 0) {
    setpgid(0, 0);
    sigprocmask(SIG_SETMASK, &none, nullptr);  // the receiver blocks SIGINT/SIGTERM; workers must not
    execvpe(args[0], args, envp);
    static const char kMsg[] = "slotstream: cannot start the worker command\n";
    if (write(STDERR_FILENO, kMsg, sizeof kMsg - 1) < 0) { /* nothing left to tell */
    }
    _exit(127);
  }
  if (command < 0) _exit(126);
  setpgid(command, command);
  int status = 0;
  bool done = false, stopping = false;
  timespec grace{kGraceMs / 1000, (kGraceMs % 1000) * 1000000L};
  while (!done) {
    siginfo_t info;
    const int sig = stopping ? sigtimedwait(&waitable, &info, &grace) : sigwaitinfo(&waitable, &info);
    if (sig == SIGTERM || sig == SIGINT) {
      kill(-command, SIGTERM);
      stopping = true;
    } else if (sig < 0 && stopping) {
      kill(-command, SIGKILL);  // it did not stop within the grace time
    }
    // The command's own status only: the same pass may reap processes it left (adopted as subreaper)
    // after it, whose statuses are not the worker's outcome.
    for (int reaped = 0;;) {
      const pid_t r = waitpid(-1, &reaped, WNOHANG);
      if (r <= 0) break;
      if (r == command) {
        status = reaped;
        done = true;
      }
    }
  }
  // Whatever the command left behind in its group goes with it; then the adopted strays.
  kill(-command, SIGKILL);
  int ignored;
  while (waitpid(-1, &ignored, WNOHANG) > 0) {
  }
  if (WIFSIGNALED(status)) {
    signal(WTERMSIG(status), SIG_DFL);
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, WTERMSIG(status));
    sigprocmask(SIG_UNBLOCK, &one, nullptr);
    kill(getpid(), WTERMSIG(status));
  }
  _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace

void WorkerManager::start_locked(DeviceWorker& w) {
  std::error_code ec;
  fs::create_directories(w.worker_dir, ec);
  auto argv = argv_for(w.sender, w.device);
  std::string log = (w.worker_dir / "worker.log").string();
  std::string dev_dir = fs::absolute(w.device_dir).string(), wrk_dir = fs::absolute(w.worker_dir).string();
  // Everything the child needs is prepared before fork(): after it, only async-signal-safe calls.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("SLOTSTREAM_")) env.emplace_back(*e);
  }
  env.push_back("SLOTSTREAM_DEVICE_DIR=" + dev_dir);
  env.push_back("SLOTSTREAM_WORKER_DIR=" + wrk_dir);
  env.push_back("SLOTSTREAM_SENDER=" + w.sender);
  env.push_back("SLOTSTREAM_DEVICE=" + std::to_string(w.device));
  std::vector<char*> args, envp;
  for (auto& a : argv) args.push_back(a.data());
  args.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t receiver = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    // The keeper: it stays between the receiver and the worker command for the command's whole
    // life, so that nothing the command started outlives it (see keep_worker).
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGTERM);     // a receiver that dies, even by SIGKILL, stops its workers
    if (getppid() != receiver) _exit(1);  // it died before the line above took effect
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
    }
    int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) dup2(null, STDIN_FILENO);
    keep_worker(args.data(), envp.data());
  }
  if (pid < 0) {
    event("cannot start worker for " + w.sender + " device " + std::to_string(w.device) + ": " + strerror(errno));
    w.restart_at = Clock::now() + w.backoff;
    return;
  }
  setpgid(pid, pid);
  w.pid = pid;
  w.started = Clock::now();
  event("worker " + worker_name(w.sender, w.device) + " started (pid " + std::to_string(pid) + ", log " + log + ")");
}

void WorkerManager::refresh_locked(DeviceWorker& w) {
  std::ifstream in(w.worker_dir / "done");
  int64_t done = -1;
  if (!(in >> done) || done <= w.done) return;
  w.done = done;
  while (!w.pending.empty() && int64_t(w.pending.front().first) <= done) {
    auto [seq, bytes] = w.pending.front();
    w.pending.pop_front();
    w.pending_bytes -= bytes;
    ++w.processed;
    if (options_.keep > 0) {
      w.finished.push_back(seq);
    } else if (!options_.keep_processed) {
      std::error_code ec;
      fs::remove(w.device_dir / sink::DirSink::file_name(seq), ec);
    }
  }
  trim_locked(w);
}

void WorkerManager::trim_locked(DeviceWorker& w) {
  while (!w.finished.empty() && w.finished.front() + options_.keep < w.newest) {
    std::error_code ec;
    fs::remove(w.device_dir / sink::DirSink::file_name(w.finished.front()), ec);
    w.finished.pop_front();
  }
}

void WorkerManager::stored(const std::string& sender, uint16_t device, uint64_t seq, uint64_t bytes) {
  const StoredFile file{device, seq, bytes};
  stored(sender, std::span(&file, 1));
}

void WorkerManager::stored(const std::string& sender, std::span<const StoredFile> files) {
  std::lock_guard lock(mutex_);
  if (stopping_) return;
  for (const StoredFile& f : files) stored_locked(sender, f.device, f.seq, f.bytes);
}

void WorkerManager::stored_locked(const std::string& sender, uint16_t device, uint64_t seq, uint64_t bytes) {
  DeviceWorker& w = worker_locked(sender, device);
  w.newest = std::max(w.newest, seq + 1);
  if (int64_t(seq) > w.done && (w.pending.empty() || w.pending.back().first < seq)) {
    w.pending.emplace_back(seq, bytes);
    w.pending_bytes += bytes;
  }
  trim_locked(w);
  if (!options_.command.empty() && w.pid < 0 && w.restart_at == Clock::time_point{} && !w.ever_started) {
    // Workers are forked by the supervisor thread only: PR_SET_PDEATHSIG fires when the
    // *thread* that forked exits, and session threads end with their sender.
    w.ever_started = true;
    w.restart_at = Clock::now();
    w.first_start = true;
    wake_.notify_one();
  }
}

bool WorkerManager::over_limit(const std::string& sender, uint16_t device, std::string* why) {
  return over(device, backlog(sender, device), why);
}

WorkerManager::Backlog WorkerManager::backlog(const std::string& sender, uint16_t device) {
  std::lock_guard lock(mutex_);
  auto it = workers_.find({sender, device});
  if (it == workers_.end()) return {};
  DeviceWorker& w = it->second;
  refresh_locked(w);
  return {w.pending.size(), w.pending_bytes};
}

bool WorkerManager::over(uint16_t device, const Backlog& b, std::string* why) const {
  if (options_.backlog_messages && b.messages >= options_.backlog_messages) {
    *why = "device " + std::to_string(device) + " has " + std::to_string(b.messages) +
           " unprocessed messages (--backlog-messages " + std::to_string(options_.backlog_messages) + ")";
    return true;
  }
  if (options_.backlog_bytes && b.bytes >= options_.backlog_bytes) {
    *why = "device " + std::to_string(device) + " has " + std::to_string(b.bytes) +
           " unprocessed bytes (--backlog-bytes " + std::to_string(options_.backlog_bytes) + ")";
    return true;
  }
  return false;
}

std::vector<WorkerStats> WorkerManager::stats() const {
  std::lock_guard lock(mutex_);
  std::vector<WorkerStats> out;
  for (const auto& [key, w] : workers_) {
    out.push_back({w.sender, w.device, w.pending.size(), w.pending_bytes, w.processed, w.restarts, w.pid > 0});
  }
  return out;
}

uint64_t WorkerManager::total_backlog_bytes() const {
  std::lock_guard lock(mutex_);
  uint64_t total = 0;
  for (const auto& [key, w] : workers_) total += w.pending_bytes;
  return total;
}

void WorkerManager::supervise() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, kSupervisePeriod);
    if (stopping_) break;
    const auto now = Clock::now();
    for (auto& [key, w] : workers_) {
      refresh_locked(w);
      if (w.pid > 0) {
        int status = 0;
        if (waitpid(w.pid, &status, WNOHANG) != w.pid) continue;
        std::string how = WIFEXITED(status) ? "exited with status " + std::to_string(WEXITSTATUS(status))
                                            : "killed by signal " + std::to_string(WTERMSIG(status));
        w.pid = -1;
        w.backoff = now - w.started > kStableRun ? std::chrono::milliseconds(500)
                                                 : std::min<std::chrono::milliseconds>(kMaxBackoff, w.backoff * 2);
        w.restart_at = now + w.backoff;
        event("worker " + worker_name(w.sender, w.device) + " " + how + "; restarting in " +
              std::to_string(w.backoff.count()) + " ms at the first unprocessed message");
      } else if (w.restart_at != Clock::time_point{} && now >= w.restart_at) {
        w.restart_at = {};
        if (!w.first_start) ++w.restarts;
        w.first_start = false;
        start_locked(w);
      }
    }
  }
}

void WorkerManager::stop() {
  std::vector<pid_t> pids;
  std::vector<std::string> names;
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    for (auto& [key, w] : workers_) {
      if (w.pid > 0) {
        pids.push_back(w.pid);
        names.push_back(worker_name(w.sender, w.device));
      }
    }
  }
  wake_.notify_all();
  supervisor_.join();
  for (pid_t p : pids) kill(-p, SIGTERM);
  if (options_.runtime == Runtime::kPodman && !names.empty()) {
    // Stopping the podman clients does not remove their containers: one `podman rm` stops
    // (1 s grace) and removes them all at once, instead of one slow call per worker. -i: podman
    // 4.3 removes none of them if one name is missing (a worker between restarts) without it.
    std::string cmd = "podman rm -f -i -t 1";
    for (const auto& n : names) cmd += " " + n;
    cmd += " >/dev/null 2>&1";
    if (std::system(cmd.c_str()) != 0) { /* already gone */
    }
  }
  auto deadline = Clock::now() + kStopGrace;
  for (pid_t p : pids) {
    while (waitpid(p, nullptr, WNOHANG) == 0) {
      if (Clock::now() > deadline) {
        kill(-p, SIGKILL);
        waitpid(p, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(20ms);
    }
  }
}

// ------------------------------------------------------------------------------ the sink

namespace {

class PipelineSink final : public MessageSink, public sink::SkippableSink {
 public:
  PipelineSink(fs::path dir, std::string sender, WorkerManager& manager, std::map<uint16_t, uint64_t> first)
      : files_(std::move(dir), std::move(first)),
        sender_(std::move(sender)),
        manager_(manager) {}
  Status begin(uint16_t device) override {
    std::string why;
    if (manager_.over_limit(sender_, device, &why)) return {Code::kBusy, "worker backlog: " + why};
    return files_.begin(device);
  }
  Status append(uint16_t device, std::span<const std::byte> data) override { return files_.append(device, data); }
  Status commit(uint16_t device) override {
    const uint64_t before = files_.numbering(device)->already_stored;
    SLOTSTREAM_RETURN_IF_ERROR(files_.commit(device));
    if (files_.numbering(device)->already_stored != before) return Status::ok();  // its worker has it
    auto last = files_.last_committed(device);
    manager_.stored(sender_, device, last.seq, last.bytes);
    return Status::ok();
  }
  void abort(uint16_t device) override { files_.abort(device); }
  // A batch: each device's backlog is looked up once (one lock) and counted up as its messages
  // are stored, so the limit holds message by message; what was stored is told to the manager
  // in one call.
  Status deliver(std::span<const Message> batch, size_t* stored) override {
    *stored = 0;
    Status st;
    size_t n = 0;
    for (; n < batch.size(); ++n) {
      WorkerManager::Backlog& b = backlog_of(batch[n].device);
      std::string why;
      if (manager_.over(batch[n].device, b, &why)) {
        st = {Code::kBusy, "worker backlog: " + why};
        break;
      }
      const uint16_t d = batch[n].device;
      const uint64_t before = files_.numbering(d)->already_stored;
      size_t one = 0;
      st = files_.deliver(batch.subspan(n, 1), &one);
      if (!st.is_ok()) break;
      if (files_.numbering(d)->already_stored != before) continue;  // stored before: its worker has it
      ++b.messages;
      b.bytes += batch[n].data.size();
      files_done_.push_back({d, files_.last_committed(d).seq, batch[n].data.size()});
    }
    manager_.stored(sender_, files_done_);
    files_done_.clear();
    *stored = n;
    backlogs_.clear();
    return st;
  }
  std::optional<Numbering> numbering(uint16_t device) override { return files_.numbering(device); }
  Status skip_to(uint16_t device, uint64_t seq) override { return files_.skip_to(device, seq); }
  // The datagram transport's: paused while the device's backlog is over its limit (a partial message
  // too); a complete message stored is its worker's (a partial one is not: workers process SEQ.bin
  // files and skip a missing number, docs/workers.md).
  Status deliver_datagram(const DatagramMessage& m) override {
    std::string why;
    if (manager_.over_limit(sender_, m.device, &why)) return {Code::kBusy, "worker backlog: " + why};
    SLOTSTREAM_RETURN_IF_ERROR(files_.deliver_datagram(m));
    if (!m.partial) {
      const auto last = files_.last_committed(m.device);
      manager_.stored(sender_, m.device, last.seq, last.bytes);
    }
    return Status::ok();
  }

 private:
  WorkerManager::Backlog& backlog_of(uint16_t device) {
    for (auto& [d, b] : backlogs_) {
      if (d == device) return b;
    }
    return backlogs_.emplace_back(device, manager_.backlog(sender_, device)).second;
  }
  std::vector<std::pair<uint16_t, WorkerManager::Backlog>> backlogs_;
  std::vector<WorkerManager::StoredFile> files_done_;  // what a batch stored, told in one call
  sink::DirSink files_;
  std::string sender_;
  WorkerManager& manager_;
};

}  // namespace

std::unique_ptr<MessageSink> make_pipeline_sink(fs::path sender_dir, std::string sender, WorkerManager& manager,
                                                std::map<uint16_t, uint64_t> first) {
  return std::make_unique<PipelineSink>(std::move(sender_dir), std::move(sender), manager, std::move(first));
}

}  // namespace slotstream::pipeline
