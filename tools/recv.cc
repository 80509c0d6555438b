// `slotstream recv`: the passive receiver daemon.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <mutex>

#include "cli_util.h"
#include "commands.h"
#include "dgram_cli.h"
#include "log.h"
#include "metrics.h"
#include "platform_cli.h"
#include "slotstream/sinks.h"
#include "slotstream/workers.h"

namespace slotstream::tools {
namespace fs = std::filesystem;

void print_error(const char* cmd, const std::string& message) {
  std::fprintf(stderr, "slotstream %s: error: %s\n", cmd, message.c_str());
}

std::optional<std::string> misplaced_rdma_options(const std::string& transport, const std::string& rdma_transport,
                                                  const std::string& rdma_device) {
  if (rdma_transport.empty() && rdma_device.empty()) return std::nullopt;
  if (transport == "rdma" || transport == "auto") return std::nullopt;
  return "--rdma-transport and --rdma-device apply to --transport rdma or auto, not " + transport;
}

RdmaOptions rdma_options(const std::string& transport, const std::string& device) {
  RdmaOptions o;
  if (!transport.empty()) o.transport = parse_rdma_transport(transport);
  o.device = device;
  return o;
}

bool parse_hold_spec(const std::string& text, HoldSpec* out) {
  unsigned idx = 0, from = 0, to = 0;
  char extra;
  if (std::sscanf(text.c_str(), "%u:%u:%u%c", &idx, &from, &to, &extra) != 3 || from > to) return false;
  *out = {idx, from, to};
  return true;
}

namespace {
std::mutex g_print_mutex;
}  // namespace

void print_line(FILE* f, const std::string& line) {
  std::lock_guard lock(g_print_mutex);
  std::fprintf(f, "%s\n", line.c_str());
  std::fflush(f);
}

Status prepare_out_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    return {Code::kIoError, "cannot create output directory '" + dir + "': " + (ec ? ec.message() : "not a directory")};
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return {Code::kIoError, "output directory '" + dir + "' is not writable"};
  return Status::ok();
}

sigset_t block_stop_signals() {
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  return sigs;
}

void wait_for_stop(const sigset_t& sigs, const std::function<bool()>& done) {
  for (;;) {
    timespec tick{0, 100 * 1000 * 1000};
    int sig = sigtimedwait(&sigs, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      log_info(std::string(sig == SIGINT ? "SIGINT" : "SIGTERM") + ", shutting down (partial messages are discarded)");
      return;
    }
    if (done()) return;
  }
}

int parse_holds(const RecvArgs& args, std::vector<HoldSpec>* holds) {
  for (const auto& h : args.holds) {
    HoldSpec spec;
    if (!parse_hold_spec(h, &spec)) {
      print_error("recv", "--hold-block expects INDEX:FROM_MS:TO_MS with FROM <= TO, got '" + h + "'");
      return kExitUsage;
    }
    // A sender chooses at most kMaxBlocks blocks (udp: message slots), so a larger index could never be
    // held: refuse it rather than ignore it silently.
    if (auto why = out_of_range(*find_option("hold_block"), spec.index)) {
      print_error("recv", "--hold-block: block index " + *why + " (a sender has at most " + std::to_string(kMaxBlocks) +
                              " blocks), got '" + h + "'");
      return kExitUsage;
    }
    holds->push_back(spec);
  }
  return kExitOk;
}

bool uses_workers(const RecvArgs& args) { return !args.worker.empty() || !args.worker_dir.empty(); }

// Where messages go (--discard, --out, --worker) must be one consistent choice.
int check_sink_options(const RecvArgs& args) {
  if (uses_workers(args) && args.discard) {
    print_error("recv", "--worker needs --out (workers read the stored files)");
    return kExitUsage;
  }
  if (args.keep && (args.discard || args.keep_processed || args.transport == "udp")) {
    print_error("recv", std::string("--keep bounds the messages stored on disk: not with ") +
                            (args.discard          ? "--discard (nothing is stored)"
                             : args.keep_processed ? "--keep-processed (which keeps every finished message)"
                                                   : "--transport udp (not available there yet)"));
    return kExitUsage;
  }
  if (!uses_workers(args) && (args.backlog_bytes || args.backlog_messages)) {
    print_error("recv",
                "--backlog-messages/--backlog-bytes need --worker or --worker-dir (nothing else consumes the backlog)");
    return kExitUsage;
  }
  return kExitOk;
}

std::unique_ptr<DirectoryWorkers> start_workers(const RecvArgs& args) {
  DirectoryWorkersOptions wo;
  wo.out = args.out;
  wo.progress = args.worker_dir;
  wo.command = args.worker;
  wo.runtime = args.worker_runtime == "podman" ? WorkerRuntime::kPodman : WorkerRuntime::kProcess;
  wo.image = args.worker_image;
  wo.cpus = args.worker_cpus;
  wo.memory = args.worker_memory;
  wo.backlog_messages = args.backlog_messages;
  wo.backlog_bytes = args.backlog_bytes;
  wo.keep_processed = args.keep_processed;
  wo.keep = args.keep;
  wo.on_event = [](const std::string& text) { log_info(text); };
  return std::make_unique<DirectoryWorkers>(std::move(wo));
}

namespace {

std::string session_line(const SessionReport& r) {
  char buf[512];
  if (r.finished) {
    std::snprintf(buf, sizeof buf,
                  "sender %s finished: messages=%llu bytes=%llu gaps=%llu duplicates=%llu unknown_device=%llu "
                  "out_of_window=%llu transport=%s seconds=%.2f",
                  r.sender.name.c_str(), (unsigned long long)r.messages, (unsigned long long)r.bytes,
                  (unsigned long long)r.gaps, (unsigned long long)r.duplicates, (unsigned long long)r.unknown_device,
                  (unsigned long long)r.out_of_window, transport_name(r.sender.transport), r.seconds);
  } else {
    std::snprintf(buf, sizeof buf,
                  "sender %s lost: kept %llu complete messages, discarded %llu partial (%s); gaps=%llu "
                  "duplicates=%llu unknown_device=%llu out_of_window=%llu",
                  r.sender.name.c_str(), (unsigned long long)r.messages, (unsigned long long)r.partial_discarded,
                  r.reason.c_str(), (unsigned long long)r.gaps, (unsigned long long)r.duplicates,
                  (unsigned long long)r.unknown_device, (unsigned long long)r.out_of_window);
  }
  return buf;
}

// The receiver's own options from the command line: where it listens, transport, held blocks,
// memory budget, token. kExitOk, or kExitUsage after printing what is wrong.
int check_receiver_options(const RecvArgs& args, ReceiverOptions* opt) {
  if (Status st = parse_address(args.listen, &opt->host, &opt->port); !st.is_ok()) {
    print_error("recv", "--listen: " + st.message());
    return kExitUsage;
  }
  opt->transport = *parse_transport(args.transport);
  if (auto why = misplaced_rdma_options(args.transport, args.rdma_transport, args.rdma_device)) {
    print_error("recv", *why);
    return kExitUsage;
  }
  opt->rdma = rdma_options(args.rdma_transport, args.rdma_device);
  if (int rc = parse_holds(args, &opt->holds); rc != kExitOk) return rc;
  if (args.max_memory) {
    auto bytes = parse_size(*args.max_memory);
    if (!bytes || *bytes == 0) {
      print_error("recv", "--max-memory expects a size such as 512M or 4G, got '" + *args.max_memory + "'");
      return kExitUsage;
    }
    opt->max_memory = *bytes;
  }
  if (!args.token_file.empty()) {
    if (Status st = read_token(args.token_file, &opt->token); !st.is_ok()) {
      print_error("recv", st.message());
      return kExitUsage;
    }
  }
  return kExitOk;
}

// Each sender's sink: nothing (--discard), its directory below --out, or its directory feeding
// the per-device workers (started here, into *workers). kExitOk, or kExitError if --out cannot
// be used.
int set_up_sinks(const RecvArgs& args, ReceiverOptions* opt, std::unique_ptr<DirectoryWorkers>* workers) {
  if (args.discard) {
    opt->make_sink = [](const SenderInfo&, std::unique_ptr<MessageSink>* sink) {
      *sink = make_null_sink();
      return Status::ok();
    };
    return kExitOk;
  }
  if (Status st = prepare_out_dir(args.out); !st.is_ok()) {
    print_error("recv", st.message());
    return kExitError;
  }
  const fs::path out = args.out;
  if (!uses_workers(args)) {
    opt->make_sink = [out, keep = args.keep](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
      *sink = make_directory_sink({.dir = out / info.name, .first = info.first_message, .keep = keep});
      return Status::ok();
    };
    return kExitOk;
  }
  *workers = start_workers(args);
  DirectoryWorkers* wm = workers->get();
  opt->backlog_bytes = [wm] { return wm->total_backlog_bytes(); };
  opt->make_sink = [out, wm](const SenderInfo& info, std::unique_ptr<MessageSink>* sink) {
    *sink = wm->make_sink(out / info.name, info.name, info.first_message);
    return Status::ok();
  };
  return kExitOk;
}

// Every ended session is one line on stdout (udp: with the datagram counters) and leaves the metrics;
// events go to stderr.
void report_sessions(MetricsState& metrics_state, bool udp, ReceiverOptions* opt) {
  opt->on_session_end = [&metrics_state, udp](const SessionReport& r) {
    metrics_state.session_ended(r);
    print_line(stdout, udp ? datagram_session_line(r) : session_line(r));
  };
  opt->on_event = [](const std::string& text) { log_info(text); };
  opt->on_warning = [](const std::string& text) { log_warning(text); };
}

// --metrics: the /metrics and /health server. kExitOk (also without --metrics), or kExitError.
int start_metrics(const RecvArgs& args, Receiver& rx, MetricsState& metrics_state, DirectoryWorkers* workers,
                  std::unique_ptr<MetricsServer>* metrics) {
  if (args.metrics.empty()) return kExitOk;
  // Workers are checked only where this receiver runs them (--worker), not with --worker-dir alone.
  ReadyFn ready = [&rx, out = args.discard ? std::string() : args.out,
                   managed = args.worker.empty() ? nullptr : workers] { return receiver_readiness(rx, out, managed); };
  Status st = args.transport == "udp"
                  ? MetricsServer::start(
                        args.metrics,
                        [&rx, &metrics_state, workers] { return collect_datagram_metrics(rx, metrics_state, workers); },
                        metrics, std::move(ready))
                  : MetricsServer::start(args.metrics, rx, metrics_state, workers, std::move(ready), metrics);
  if (!st.is_ok()) {
    print_error("recv", "--metrics: " + st.message());
    return kExitError;
  }
  log_info("metrics on http://" + (*metrics)->address() + "/metrics");
  return kExitOk;
}

}  // namespace

int run_recv(const RecvArgs& args, const DgramArgs& dgram) {
  const bool udp = args.transport == "udp";
  ReceiverOptions opt;
  if (int rc = check_receiver_options(args, &opt); rc != kExitOk) return rc;
  if (Status st = udp ? datagram_receive_options(dgram, &opt.datagram) : Status::ok(); !st.is_ok()) {
    print_error("recv", st.message());
    return kExitUsage;
  }
  if (int rc = check_sink_options(args); rc != kExitOk) return rc;
  std::unique_ptr<DirectoryWorkers> workers;
  if (int rc = set_up_sinks(args, &opt, &workers); rc != kExitOk) return rc;
  MetricsState metrics_state{std::chrono::seconds(args.metrics_prune_after),
                             udp ? datagram_families() : ExtraFamilies{}};
  report_sessions(metrics_state, udp, &opt);

  // Signals are taken synchronously by the main thread; every other thread inherits the mask.
  const sigset_t sigs = block_stop_signals();

  std::unique_ptr<Receiver> rx;
  if (Status st = Receiver::start(std::move(opt), &rx); !st.is_ok()) {
    // A transport this host cannot offer (rdma without a device) is a usage error: exit 2.
    // (a listen address in use: the message says so; "connect failed" would mislead)
    print_error("recv", st.code() == Code::kInvalidArgument || st.code() == Code::kConnectFailed ? st.message()
                                                                                                 : st.to_string());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  std::unique_ptr<MetricsServer> metrics;
  if (int rc = start_metrics(args, *rx, metrics_state, workers.get(), &metrics); rc != kExitOk) {
    rx->stop();
    return rc;
  }
  print_line(stdout, "listening on " + rx->listen_address());
  std::unique_ptr<PlatformRegistration> registration;
  if (!args.platform.url.empty()) {
    std::function<uint64_t()> backlog;
    if (workers) backlog = [wm = workers.get()] { return wm->total_backlog_bytes(); };
    if (int rc = register_on_platform(args, *rx, backlog, &registration); rc != kExitOk) {
      rx->stop();
      return rc;
    }
  }

  // A receiver whose platform name another one took (registration.h) leaves: its senders move on. After
  // the last sender, the receiver settles (udp: a finished sender may still repeat its FIN), then exits.
  wait_for_stop(sigs, [&] {
    return (args.exit_after > 0 && rx->sessions_ended() >= args.exit_after && rx->settled()) ||
           (registration && registration->lost());
  });
  const bool lost = registration && registration->lost();
  registration.reset();  // off the platform first: no sender is scheduled here any more
  rx->stop();
  metrics.reset();
  if (workers) workers->stop();
  return lost ? kExitError : kExitOk;
}

}  // namespace slotstream::tools
