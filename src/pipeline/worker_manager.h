// Per-device processing workers (paper §3.2.7; contract in docs/workers.md): one worker per
// (sender, device), started when that device's first message is stored, restarted with
// back-off when it dies, and the source of each device's backlog for back-pressure.
//
// Threading: every public method may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "slotstream/slotstream.h"
#include "slotstream/workers.h"

namespace slotstream::pipeline {

// The options and stats are the public ones (slotstream/workers.h, whose DirectoryWorkers wraps this).
using Runtime = WorkerRuntime;
using WorkerOptions = DirectoryWorkersOptions;
using WorkerStats = DirectoryWorkerStats;

class WorkerManager {
 public:
  explicit WorkerManager(WorkerOptions options);
  ~WorkerManager();  // stops every worker

  // Message file `seq` of `bytes` bytes was stored for (sender, device).
  void stored(const std::string& sender, uint16_t device, uint64_t seq, uint64_t bytes);
  struct StoredFile {
    uint16_t device = 0;
    uint64_t seq = 0;
    uint64_t bytes = 0;
  };
  // The same for a batch of files, under one lock.
  void stored(const std::string& sender, std::span<const StoredFile> files);
  // True (and the reason) while the device's unprocessed backlog is over a limit.
  bool over_limit(const std::string& sender, uint16_t device, std::string* why);
  // A device's unprocessed backlog now (what over_limit judges), for a sink that stores a batch
  // and counts what it adds.
  struct Backlog {
    uint64_t messages = 0;
    uint64_t bytes = 0;
  };
  Backlog backlog(const std::string& sender, uint16_t device);
  // Whether `b` is over the limits (and why).
  bool over(uint16_t device, const Backlog& b, std::string* why) const;
  std::vector<WorkerStats> stats() const;
  uint64_t total_backlog_bytes() const;
  void stop();

  // The argv that runs one worker (exposed for tests and for the docs).
  std::vector<std::string> argv_for(const std::string& sender, uint16_t device) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct DeviceWorker {  // one processing worker (a process or container) for one device of one sender
    std::string sender;
    uint16_t device = 0;
    std::filesystem::path device_dir, worker_dir;
    pid_t pid = -1;
    Clock::time_point started{}, restart_at{};
    std::chrono::milliseconds backoff{250};  // doubled before each restart: first wait 0.5 s
    uint64_t restarts = 0;
    bool ever_started = false;  // the first start has been requested
    bool first_start = false;   // the pending start is the first one (not a restart)
    uint64_t processed = 0;
    int64_t done = -1;                                  // last SEQ the worker recorded
    std::deque<std::pair<uint64_t, uint64_t>> pending;  // (seq, bytes) not yet processed
    std::deque<uint64_t> finished;                      // processed, kept for WorkerOptions::keep
    uint64_t newest = 0;                                // highest SEQ stored + 1
    uint64_t pending_bytes = 0;
  };

  DeviceWorker& worker_locked(const std::string& sender, uint16_t device);
  void stored_locked(const std::string& sender, uint16_t device, uint64_t seq, uint64_t bytes);
  void start_locked(DeviceWorker& w);
  void refresh_locked(DeviceWorker& w);  // reads `done`, forgets and deletes processed messages
  void trim_locked(DeviceWorker& w);     // deletes finished messages beyond the newest WorkerOptions::keep
  void supervise();
  void event(const std::string& text) const {
    if (options_.on_event) options_.on_event(text);
  }

  WorkerOptions options_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::map<std::pair<std::string, uint16_t>, DeviceWorker> workers_;
  bool stopping_ = false;
  std::thread supervisor_;
};

// The receiver's sink when workers run: stores like DirSink, tells the manager, and refuses
// (kBusy, retried: the data waits in its block) while the device's backlog is over its limit.
// `first`: SenderInfo::first_message (DirSink).
std::unique_ptr<MessageSink> make_pipeline_sink(std::filesystem::path sender_dir, std::string sender,
                                                WorkerManager& manager, std::map<uint16_t, uint64_t> first = {});

}  // namespace slotstream::pipeline
