// `slotstream edge`: its options, the load it reads (--load), and its output. The edge server itself —
// each device processed here or offloaded through the platform, the moves, the numbers — is the library's
// EdgeServer (slotstream/edge.h).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "platform_cli.h"
#include "slotstream/edge.h"
#include "slotstream/platform.h"
#include "slotstream/sinks.h"
#include "slotstream/workers.h"

namespace slotstream::tools {

namespace fs = std::filesystem;

CLI::App* add_edge(CLI::App& app, EdgeArgs* e) {
  auto* c = app.add_subcommand(
      "edge",
      "Process this edge server's devices locally (OUT/<NAME>/device-<D>, optional --worker per device) and "
      "offload devices to receivers the platform schedules while the load is above --offload-above, taking "
      "them back below --take-back-below (docs/platform.md).");
  SendArgs& s = e->source;
  c->add_option("--out", e->out, "where local messages are stored (OUT/<NAME>/device-<D>/<SEQ>.bin)")->required();
  c->add_option("--name", s.name, "this edge server's name: its directory here and on receivers (default: host name)");
  c->add_option("--file", s.files, "D=PATH: one message of device D (repeatable)");
  c->add_option("--dir", s.dirs, "D=DIR: each file in DIR, sorted, is one message of device D");
  c->add_option("--video", s.videos, "D=SOURCE: decoded RGB frames of the source's size (as send --video)");
  c->add_option("--video-size", s.video_size, "WxH: scale every --video to this size (as send --video-size)");
  c->add_flag("--realtime", s.realtime, "videos at their own frame rate");
  c->add_option("--synthetic", s.synthetic, "D0-D1:FPS:WxHxC synthetic cameras (as send --synthetic)");
  c->add_option("--duration", s.duration, "seconds of synthetic frames");
  c->add_option("--protocol", s.protocol, "protocol towards receivers")->default_str(kDefaultProtocol);
  c->add_option("--transport", s.transport, "towards receivers: shm, tcp, rdma or auto")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "rdma"}))
      ->default_str("auto");
  c->add_option("--blocks", s.blocks, "blocks towards receivers")->default_str(std::to_string(kDefaultBlocks));
  c->add_option("--block-size", s.block_size,
                "SIZE per block towards receivers incl. its 16-byte header, e.g. 64K or 1M (default 1M: one 640x480x3 "
                "frame per block)")
      ->transform(size_value(kMinBlockSize, kMaxBlockSize))
      ->default_str("1M");
  c->add_option("--token-file", s.token_file, "shared secret receivers ask for");
  c->add_option("--worker", e->worker, "COMMAND: a local processing worker per device (docs/workers.md)");
  c->add_option("--backlog-messages", e->backlog_messages,
                "local back-pressure: a device waits while its worker has this many unprocessed messages");
  c->add_option("--load", e->load,
                "what the thresholds compare: cpu (percent of all CPUs busy, the default), backlog (bytes waiting "
                "for the local workers), or file:PATH (the number written in PATH: an operator's or a test's)")
      ->default_str("cpu");
  c->add_option("--offload-above", e->above, "offload one more device while the load is above this (default 80)");
  c->add_option("--take-back-below", e->below, "take one device back while the load is below this (default 50)");
  c->add_option("--settle", e->settle, "seconds between moves, for the load to show the last one (default 2)");
  c->add_flag("--json", s.json, "print one JSON summary on stdout at the end");
  add_stall_timeout(c, &s.stall_timeout);
  add_platform_common(c, &s.platform);
  add_platform_need(c, &s.platform, /*per_device=*/true);
  c->callback([c] {
    if (c->count("--platform") == 0) throw CLI::RequiredError("--platform");
  });
  return c;
}

namespace {

// Where the edge's load comes from.
class LoadSource {
 public:
  static Status parse(const std::string& spec, DirectoryWorkers* workers, std::unique_ptr<LoadSource>* out) {
    auto s = std::make_unique<LoadSource>();
    if (spec == "cpu") {
      s->kind_ = Kind::kCpu;
    } else if (spec == "backlog") {
      if (!workers) return {Code::kInvalidArgument, "--load backlog needs --worker (the backlog is theirs)"};
      s->kind_ = Kind::kBacklog;
    } else if (spec.starts_with("file:") && spec.size() > 5) {
      s->kind_ = Kind::kFile;
      s->path_ = spec.substr(5);
    } else {
      return {Code::kInvalidArgument, "--load expects cpu, backlog or file:PATH, got '" + spec + "'"};
    }
    s->workers_ = workers;
    *out = std::move(s);
    return Status::ok();
  }
  double read() {
    switch (kind_) {
      case Kind::kCpu:
        return 100 * meter_.read().busy;
      case Kind::kBacklog:
        return double(workers_->total_backlog_bytes());
      case Kind::kFile: {
        double v = 0;
        std::ifstream f(path_);
        f >> v;
        return f ? v : 0;
      }
    }
    return 0;
  }

 private:
  enum class Kind { kCpu, kBacklog, kFile } kind_ = Kind::kCpu;
  std::string path_;
  DirectoryWorkers* workers_ = nullptr;
  CpuMeter meter_;
};

std::unique_ptr<DirectoryWorkers> edge_workers(const EdgeArgs& args) {
  if (args.worker.empty()) return nullptr;
  DirectoryWorkersOptions wo;
  wo.out = args.out;
  wo.command = args.worker;
  wo.backlog_messages = args.backlog_messages;
  wo.on_event = [](const std::string& text) { print_line(stderr, "slotstream edge: " + text); };
  return std::make_unique<DirectoryWorkers>(std::move(wo));
}

// The edge's platform sender, with no device offloaded yet; `*devices` all its devices and
// `*per_device` what one offloaded device needs. kExitOk, or the exit code after printing why not.
int connect_edge(const EdgeArgs& args, SendArgs& a, Plan* plan, std::vector<uint16_t>* devices,
                 PlatformNeed* per_device, std::unique_ptr<PlatformSender>* remote) {
  PlatformSenderOptions po;
  if (Status st = platform_sender_options(a, plan, &po, "edge"); !st.is_ok()) {
    print_error("edge", st.message());
    return exit_code_of(st);
  }
  if (Status st = prepare_out_dir(args.out); !st.is_ok()) {
    print_error("edge", st.message());
    return kExitError;
  }
  *devices = po.sender.devices;
  const double n = double(devices->size());
  // --synthetic's rate and bandwidth are the cameras' sum; --need-cpu is per device already.
  *per_device = {a.platform.need_cpu, po.need.bandwidth / n, po.need.fps / n};
  po.movable = *devices;      // declared on every connection: a move is one device's (NUMBER)
  po.sender.devices.clear();  // nothing offloaded yet
  a.name = po.sender.name;
  if (Status st = PlatformSender::connect(po, remote); !st.is_ok()) {
    print_error("edge", st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  return kExitOk;
}

// `--json`: the edge server's counts per device and per move, and the platform sender's.
nlohmann::json edge_summary(const EdgeServerStats& e, const PlatformSenderStats& s, const Fillers& fillers) {
  nlohmann::json per = nlohmann::json::object();
  for (const auto& [d, r] : e.devices) {
    per[std::to_string(d)] = {{"local", r.local},
                              {"remote", r.remote},
                              {"held", r.held},
                              {"holds", r.holds},
                              {"late", fillers.late_frames(d)}};
  }
  return {{"devices", per},
          {"moves", e.moves},
          {"refused_moves", e.refused_moves},
          {"late_frames", fillers.late_frames()},
          {"resent", s.resent},
          {"reschedules", s.reschedules},
          {"connections", s.connections},
          {"moves_in_place", s.moves_in_place},
          {"reconnect_moves", e.reconnect_moves},
          {"move_ms", e.move_ms},
          {"schedule_ms", s.schedule_ms}};
}

}  // namespace

int run_edge(const EdgeArgs& args) {
  OffloadPolicy policy{args.above, args.below, std::chrono::milliseconds(int64_t(args.settle * 1000))};
  if (Status st = check_offload_policy(policy); !st.is_ok()) {
    print_error("edge", st.message());
    return kExitUsage;
  }
  SendArgs a = args.source;
  a.to.clear();
  a.name_given = !a.name.empty();
  Plan plan;
  std::vector<uint16_t> devices;
  PlatformNeed per_device;
  std::unique_ptr<PlatformSender> remote;
  if (int rc = connect_edge(args, a, &plan, &devices, &per_device, &remote); rc != kExitOk) return rc;
  auto workers = edge_workers(args);
  std::unique_ptr<LoadSource> load;
  if (Status st = LoadSource::parse(args.load, workers.get(), &load); !st.is_ok()) {
    print_error("edge", st.message());
    return kExitUsage;
  }
  const std::string name = a.name;
  EdgeServerOptions eo;
  eo.policy = policy;
  eo.per_device = per_device;
  eo.load = [&load] { return load->read(); };
  eo.on_event = [](const std::string& text) { print_line(stderr, "slotstream edge: " + text); };
  EdgeServer edge(std::move(eo), *remote);
  for (uint16_t d : devices) {
    if (workers) {
      edge.add(d, workers->make_sink(fs::path(args.out) / name, name));
    } else {
      edge.add(d, make_directory_sink({.dir = fs::path(args.out) / name}));
    }
  }
  std::atomic<bool> done{false};
  std::thread controller([&] { edge.control(done); });
  Fillers fillers(plan, a, [&](uint16_t d) -> std::unique_ptr<MessageOut> {
    return std::make_unique<DeviceOut<EdgeServer>>(edge, d);
  });
  Status st = fillers.join();
  done.store(true);
  controller.join();           // a move in progress lands what its devices held
  Status fin = edge.finish();  // what went to receivers is stored there; every number checked
  if (st.is_ok()) st = fin;
  if (workers) workers->stop();
  warn_late_frames(fillers.late_frames(), plan);
  if (!st.is_ok()) {
    print_error("edge", st.message());
    return kExitError;
  }
  if (a.json) std::printf("%s\n", edge_summary(edge.stats(), remote->stats(), fillers).dump().c_str());
  return kExitOk;
}

}  // namespace slotstream::tools
