// `slotstream edge`: an edge server that processes its own devices (their messages stored under
// OUT/<NAME>/device-<D>, per-device workers as `recv --worker` runs them) and, when its load
// passes a threshold, offloads devices one at a time to a receiver the platform schedules — taking
// them back when the load falls below another (slotstream/platform.h: OffloadPolicy). A device's messages keep
// their numbers across every move: an offloaded device's next message is numbered on the receiver
// from the local directory's next one (NUMBER on the open connection), and a device coming back
// continues locally after the last one the receiver confirmed stored, so every message is stored
// exactly once, here or on a receiver. A move is one device's: the others keep their connection
// (PlatformSender::set_devices; docs/platform.md says when a move must reconnect them).
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "platform_cli.h"
#include "slotstream/platform.h"
#include "slotstream/sinks.h"
#include "slotstream/workers.h"

namespace slotstream::tools {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

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

// Messages a device produces while a move changes where it goes wait in the edge instead of
// stalling its filler: a move finishes the remote connection and connects again (0.4-0.9 s seen
// on a loaded 2-core VM), longer than a synthetic camera's frame slot may wait (kLateAfter: the
// frames would be skipped). Beyond this many bytes over all devices, fillers wait for the move;
// the platform sender keeps as much for replay (PlatformSenderOptions::replay_limit).
constexpr uint64_t kMoveHoldBytes = 256ull << 20;

// One device: processed here (its own sink: a DirSink, or the pipeline's with workers) or sent
// through the platform. The filler holds `mutex` for a message; a move takes it to change where
// the device goes, and holds the device's new messages meanwhile (`moving`: they wait in `held`,
// in order, and go to the device's new place when the move is done).
struct Route {
  std::mutex mutex;
  bool remote = false;
  bool moving = false;
  std::deque<std::vector<std::byte>> held;
  Status error;  // a held message that could not be stored or sent: the device's filler fails with it
  std::unique_ptr<MessageSink> local;
  uint64_t first = 0;  // the number of this run's first message (the local directory's next one)
  uint64_t local_messages = 0, remote_messages = 0, held_messages = 0;
  uint64_t holds = 0;  // moves that held this device's messages (its own, and those that reconnected it)
};

class Edge {
 public:
  Edge(const EdgeArgs& args, std::string name, PlatformSender& remote, PlatformNeed per_device)
      : args_(args),
        name_(std::move(name)),
        remote_(remote),
        per_device_(per_device) {}
  Route& route(uint16_t d) { return *routes_.at(d); }
  void add(uint16_t d, std::unique_ptr<MessageSink> sink) {
    routes_[d] = std::make_unique<Route>();
    routes_[d]->first = sink->numbering(d).value_or(MessageSink::Numbering{}).next;
    routes_[d]->local = std::move(sink);
  }
  Status send_with(uint16_t d, uint64_t length, const DeviceStream::FillFn& fill);
  void control(LoadSource& load, const OffloadPolicy& policy, const std::atomic<bool>& done);
  Status finish();
  nlohmann::json summary(const Fillers& fillers) const;

 private:
  PlatformNeed need_for(size_t devices) const {
    return {per_device_.cpu * devices, per_device_.bandwidth * devices, per_device_.fps * devices};
  }
  Status deliver(Route& r, uint16_t d, std::span<const std::byte> message);
  bool hold(Route& r, std::vector<std::byte>& message);
  void move(OffloadMove m, double load);
  void hold_route(uint16_t t);
  void land(uint16_t d, const std::map<uint16_t, uint64_t>& removed, bool offloaded);
  Status check_numbers(uint16_t d, Route& r, const std::map<uint16_t, uint64_t>& removed);

  const EdgeArgs& args_;
  std::string name_;
  PlatformSender& remote_;
  PlatformNeed per_device_;
  std::map<uint16_t, std::unique_ptr<Route>> routes_;
  std::vector<uint16_t> offloaded_;  // in the order they went
  std::atomic<uint64_t> held_bytes_{0};
  uint64_t moves_ = 0, refused_ = 0, reconnect_moves_ = 0;
  std::vector<double> move_ms_;  // each move, from its decision until its devices landed
};

// Stores one message here or sends it through the platform, wherever the device goes now.
// Under r.mutex. kBusy: the local worker is behind (nothing was stored; retry).
Status Edge::deliver(Route& r, uint16_t d, std::span<const std::byte> message) {
  if (r.remote) {
    SLOTSTREAM_RETURN_IF_ERROR(remote_.send(d, message));
    ++r.remote_messages;
    return Status::ok();
  }
  Status st = r.local->begin(d);
  if (st.code() == Code::kBusy) return st;
  if (st.is_ok()) st = r.local->append(d, message);
  if (st.is_ok()) st = r.local->commit(d);
  if (!st.is_ok()) {
    r.local->abort(d);
    return st;
  }
  ++r.local_messages;
  return Status::ok();
}

// Keeps a message of a moving device (taking it from `message`); false when the hold is full.
// Under r.mutex.
bool Edge::hold(Route& r, std::vector<std::byte>& message) {
  if (!r.held.empty() && held_bytes_.load() + message.size() > kMoveHoldBytes) return false;
  held_bytes_ += message.size();
  ++r.held_messages;
  r.held.push_back(std::move(message));
  return true;
}

// One message of device d. A busy sink (the worker is behind) or a full hold is retried without
// holding the route, so that a move can take the device meanwhile.
Status Edge::send_with(uint16_t d, uint64_t length, const DeviceStream::FillFn& fill) {
  std::vector<std::byte> message(length);
  SLOTSTREAM_RETURN_IF_ERROR(fill(0, message));
  Route& r = route(d);
  for (;;) {
    {
      std::lock_guard lock(r.mutex);
      if (!r.error.is_ok()) return r.error;
      if (r.moving) {
        if (hold(r, message)) return Status::ok();
      } else if (Status st = deliver(r, d, message); st.code() != Code::kBusy) {
        return st;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

// After a move: where device d goes now (a device given back continues here after the last
// number its receiver stored), then what it held meanwhile, in order.
void Edge::land(uint16_t d, const std::map<uint16_t, uint64_t>& removed, bool offloaded) {
  Route& r = route(d);
  std::unique_lock lock(r.mutex);
  if (offloaded) r.remote = true;
  if (auto it = removed.find(d); it != removed.end()) {
    r.remote = false;
    std::erase(offloaded_, d);
    auto* numbered = dynamic_cast<SkippableSink*>(r.local.get());
    Status st = numbered ? numbered->skip_to(d, it->second)
                         : Status{Code::kInvalidArgument, "its local sink cannot continue at a number"};
    if (!st.is_ok()) {
      r.error = {st.code(), "device " + std::to_string(d) + " came back to continue at message " +
                                std::to_string(it->second) + ", but: " + st.message()};
    }
  }
  while (!r.held.empty() && r.error.is_ok()) {
    Status st = deliver(r, d, r.held.front());
    if (st.code() == Code::kBusy) {  // the worker is behind: the filler waits meanwhile (hold full) or holds on
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      lock.lock();
      continue;
    }
    if (!st.is_ok()) r.error = st;
    held_bytes_ -= r.held.front().size();
    r.held.pop_front();
  }
  r.moving = false;
}

// Marks device t moving: its new messages wait in the edge until land(). Waits for a message on
// its way (a remote one may wait for its receiver).
void Edge::hold_route(uint16_t t) {
  Route& r = route(t);
  std::lock_guard lock(r.mutex);
  r.moving = true;
  ++r.holds;
}

// One move. The moving device holds its new messages while the platform sender changes its set; the
// devices already offloaded keep their connection and keep flowing (a move in place: a per-device
// end or NUMBER on the open connection) — unless the move must reconnect (its receiver has no room
// for one more device, or a take-back of the last one ends the connection): then they hold theirs
// too, so that none goes either way meanwhile and no filler stalls.
void Edge::move(OffloadMove m, double load) {
  uint16_t d = 0;
  if (m == OffloadMove::kOffload) {
    for (auto& [dev, r] : routes_) {
      if (!r->remote) d = dev;  // the highest-numbered local device
    }
  } else {
    d = offloaded_.back();
  }
  std::vector<uint16_t> set = offloaded_, touched = {d};
  std::map<uint16_t, uint64_t> next, removed;
  char why[128];
  if (m == OffloadMove::kOffload) {
    set.push_back(d);
    std::snprintf(why, sizeof why, "load %.1f above %.1f: offloading device %u", load, args_.above, unsigned(d));
  } else {
    std::erase(set, d);
    std::snprintf(why, sizeof why, "load %.1f below %.1f: taking device %u back", load, args_.below, unsigned(d));
  }
  print_line(stderr, std::string("slotstream edge: ") + why);
  const auto t0 = Clock::now();
  hold_route(d);
  if (m == OffloadMove::kOffload) {
    Route& r = route(d);
    std::lock_guard lock(r.mutex);
    next[d] = r.local->numbering(d)->next;  // no local message now
  }
  auto reconnecting = [&] {  // the devices offloaded already go through the new connection too
    for (uint16_t t : offloaded_) {
      if (t != d) {
        hold_route(t);
        touched.push_back(t);
      }
    }
    if (touched.size() > 1) ++reconnect_moves_;
  };
  Status st = remote_.set_devices(set, next, need_for(set.size()), &removed, reconnecting);
  ++moves_;
  if (!st.is_ok()) {
    ++refused_;
    print_line(stderr, "slotstream edge: no receiver for the move, processing here: " + st.message());
  }
  const bool offloaded = st.is_ok() && m == OffloadMove::kOffload;
  if (offloaded) offloaded_.push_back(d);
  for (uint16_t t : touched) land(t, removed, offloaded && t == d);
  move_ms_.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

void Edge::control(LoadSource& load, const OffloadPolicy& policy, const std::atomic<bool>& done) {
  std::optional<Clock::time_point> last_move;
  while (!done.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const double l = load.read();
    std::optional<Clock::duration> since;
    if (last_move) since = Clock::now() - *last_move;
    const size_t remote = offloaded_.size(), local = routes_.size() - remote;
    const OffloadMove m = decide_offload(policy, l, local, remote, since);
    if (m == OffloadMove::kNone) continue;
    move(m, l);
    last_move = Clock::now();
  }
}

// Device d's numbers run on: this run's first number plus every message it handed on is where
// its next message would go, here or (`removed`: it ended offloaded) on its receiver.
Status Edge::check_numbers(uint16_t d, Route& r, const std::map<uint16_t, uint64_t>& removed) {
  std::lock_guard lock(r.mutex);
  if (!r.error.is_ok()) return r.error;
  auto it = removed.find(d);
  const uint64_t end = it != removed.end() ? it->second : r.local->numbering(d).value_or(MessageSink::Numbering{}).next;
  const uint64_t handed = r.local_messages + r.remote_messages;
  if (end == r.first + handed) return Status::ok();
  return {Code::kProtocolError, "device " + std::to_string(d) + ": " + std::to_string(handed) +
                                    " messages were stored here or sent, but their numbers run from " +
                                    std::to_string(r.first) + " to " + std::to_string(end) +
                                    " (some are missing or stored twice): report this as a bug"};
}

// The end: the remote connection is finished (FIN/FIN_ACK: what went to receivers is stored
// there), the reservation released, and every device's numbers checked.
Status Edge::finish() {
  std::map<uint16_t, uint64_t> removed;
  SLOTSTREAM_RETURN_IF_ERROR(remote_.set_devices({}, {}, {}, &removed));
  for (auto& [d, r] : routes_) SLOTSTREAM_RETURN_IF_ERROR(check_numbers(d, *r, removed));
  return Status::ok();
}

nlohmann::json Edge::summary(const Fillers& fillers) const {
  nlohmann::json per = nlohmann::json::object();
  for (const auto& [d, r] : routes_) {
    per[std::to_string(d)] = {{"local", r->local_messages},
                              {"remote", r->remote_messages},
                              {"held", r->held_messages},
                              {"holds", r->holds},
                              {"late", fillers.late_frames(d)}};
  }
  const PlatformSenderStats s = remote_.stats();
  return {{"devices", per},
          {"moves", moves_},
          {"refused_moves", refused_},
          {"late_frames", fillers.late_frames()},
          {"resent", s.resent},
          {"reschedules", s.reschedules},
          {"connections", s.connections},
          {"moves_in_place", s.moves_in_place},
          {"reconnect_moves", reconnect_moves_},
          {"move_ms", move_ms_},
          {"schedule_ms", s.schedule_ms}};
}

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
  Edge edge(args, name, *remote, per_device);
  for (uint16_t d : devices) {
    if (workers) {
      edge.add(d, workers->make_sink(fs::path(args.out) / name, name));
    } else {
      edge.add(d, make_directory_sink({.dir = fs::path(args.out) / name}));
    }
  }
  std::atomic<bool> done{false};
  std::thread controller([&] { edge.control(*load, policy, done); });
  Fillers fillers(
      plan, a, [&](uint16_t d) -> std::unique_ptr<MessageOut> { return std::make_unique<DeviceOut<Edge>>(edge, d); });
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
  if (a.json) std::printf("%s\n", edge.summary(fillers).dump().c_str());
  return kExitOk;
}

}  // namespace slotstream::tools
