// Per-device processing workers on stored files (contract in docs/workers.md): one worker per (sender,
// device), a process (or a podman container) started when that device's first message is stored,
// restarted with back-off when it dies, reading the device's directory and recording what it finished
// in worker-<D>/done. What a worker has not finished is its device's backlog; past a limit the device's
// sink refuses (kBusy) and its data waits in the receiver's blocks: back-pressure, never loss.
// `slotstream recv --worker` and `slotstream edge --worker` run them. The in-process form, handed
// zero-copy views instead of files, is slotstream/view_workers.h.
//
//   DirectoryWorkers workers({.out = "/data", .command = "python3 analyse.py"});
//   ReceiverOptions o;
//   o.make_sink = [&](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
//     *sink = workers.make_sink("/data/" + info.name, info.name, info.first_message);
//     return Status::ok();
//   };
//   o.backlog_bytes = [&] { return workers.total_backlog_bytes(); };
//   ...  rx->stop();  workers.stop();
//
// Threading: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"

namespace slotstream {

enum class WorkerRuntime { kProcess, kPodman };

struct DirectoryWorkersOptions {
  std::filesystem::path out;       // the receiver's output directory (OUT/<sender>/device-<D>)
  std::filesystem::path progress;  // where workers keep worker-<D>/done (default: out)
  std::string command;             // run by /bin/sh -c; empty: workers run elsewhere (e.g. pods) and are
                                   // only watched
  WorkerRuntime runtime = WorkerRuntime::kProcess;
  std::string image = "localhost/slotstream:latest";  // podman
  std::string cpus;                                   // podman --cpus (empty: no limit)
  std::string memory;                                 // podman --memory (empty: no limit)
  uint64_t backlog_messages = 0;                      // per device; 0: no limit
  uint64_t backlog_bytes = 0;                         // per device; 0: no limit
  bool keep_processed = false;                        // keep message files the worker has finished
  // A finished message file stays while it is among the device's `keep` newest (0: removed at once, or
  // kept for good with keep_processed); an unfinished one is never removed (`recv --keep`).
  uint64_t keep = 0;
  std::function<void(const std::string&)> on_event;  // starts, exits, restarts (any thread)
};

struct DirectoryWorkerStats {
  std::string sender;
  uint16_t device = 0;
  uint64_t backlog_messages = 0;  // stored, not yet finished by the worker
  uint64_t backlog_bytes = 0;
  uint64_t processed = 0;  // messages the worker recorded as done since these workers started
  uint64_t restarts = 0;
  bool running = false;
};

class DirectoryWorkers {
 public:
  explicit DirectoryWorkers(DirectoryWorkersOptions options);
  ~DirectoryWorkers();  // stops every worker
  DirectoryWorkers(const DirectoryWorkers&) = delete;
  DirectoryWorkers& operator=(const DirectoryWorkers&) = delete;

  // The sink of one sender: stores as make_directory_sink does (it is a SkippableSink), tells the
  // workers, and refuses (kBusy: the receiver retries, the data waits in its block) while the device's
  // backlog is over a limit. `first`: SenderInfo::first_message. The sink must not outlive the workers.
  std::unique_ptr<MessageSink> make_sink(std::filesystem::path sender_dir, std::string sender,
                                         std::map<uint16_t, uint64_t> first = {});

  std::vector<DirectoryWorkerStats> stats() const;
  // Every device's unfinished bytes together (ReceiverOptions::backlog_bytes, the platform's record).
  uint64_t total_backlog_bytes() const;
  // Stops every worker (their unfinished messages stay on disk for the next run).
  void stop();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream
