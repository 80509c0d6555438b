// The platform in the CLI (docs/platform.md): `recv --platform` registers the receiver,
// `send --platform` asks the platform for a receiver (and another when it dies), `slotstream
// platform status` shows what the platform holds. Thin: the work is in src/platform.
#include "platform_cli.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "interrupt.h"
#include "log.h"
#include "send_plan.h"
#include "slotstream/platform.h"

namespace slotstream::tools {

using Clock = std::chrono::steady_clock;

void add_platform_access(CLI::App* app, PlatformAccessArgs* a) {
  app->add_option("--platform-cacert", a->cacert,
                  "PEM file of the CA that signed the etcd members' certificates: talk to etcd over TLS (https)");
  app->add_option("--platform-cert", a->cert,
                  "PEM file: this process's client certificate for etcd (--client-cert-auth); with --platform-key");
  app->add_option("--platform-key", a->key, "PEM file: the private key of --platform-cert");
  app->add_option("--platform-user", a->user,
                  "etcd user to authenticate as (etcd's own authentication); with --platform-password-file");
  app->add_option("--platform-password-file", a->password_file,
                  "file holding --platform-user's password (not on the command line, where every user of the host "
                  "can read it)");
}

void add_platform_common(CLI::App* app, PlatformArgs* p) {
  app->add_option("--platform", p->url,
                  "etcd://HOST:PORT[,HOST:PORT...]: the cloud-edge platform's etcd members (docs/platform.md)");
  add_platform_access(app, &p->access);
  app->add_option("--platform-ttl", p->ttl,
                  "seconds this process's platform record outlives it if it dies (its etcd lease; default 5)")
      ->check(CLI::Range(1, 3600));
}

void add_stall_timeout(CLI::App* app, double* seconds) {
  app->add_option("--stall-timeout", *seconds,
                  "DURATION to wait on a receiver that says nothing (a live one says it is alive every second, also "
                  "while it holds its blocks): then it is taken as stopped or hung and the sender exits 1 (--platform: "
                  "moves on); also how long a read of the receiver's memory may go unanswered (one the NIC lost); at "
                  "least 2s, 0 waits for ever (default 30s)")
      ->transform(duration_value("s"))
      ->check(schema_value("stall_timeout"))
      ->default_str("30s");
}

namespace {

// A password file: its content without the line end (nothing else is trimmed).
Status read_password(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {Code::kInvalidArgument, "cannot read password file '" + path + "': " + std::strerror(errno)};
  std::stringstream ss;
  ss << in.rdbuf();
  std::string p = ss.str();
  while (!p.empty() && (p.back() == '\n' || p.back() == '\r')) p.pop_back();
  if (p.empty()) return {Code::kInvalidArgument, "password file '" + path + "' is empty"};
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && (info.st_mode & S_IROTH)) {
    log_warning("password file '" + path + "' is readable by every user of this host: chmod o-r it (e.g. chmod 600)");
  }
  *out = std::move(p);
  return Status::ok();
}

}  // namespace

Status platform_security(const PlatformAccessArgs& a, PlatformSecurity* out) {
  PlatformSecurity s;
  s.cacert = a.cacert;
  s.cert = a.cert;
  s.key = a.key;
  s.user = a.user;
  if (!a.password_file.empty()) {
    if (Status st = read_password(a.password_file, &s.password); !st.is_ok()) {
      return {Code::kInvalidArgument, "--platform-password-file: " + st.message()};
    }
  }
  *out = std::move(s);
  return Status::ok();
}

void add_platform_recv(CLI::App* recv, PlatformArgs* p) {
  add_platform_common(recv, p);
  recv->add_option("--platform-name", p->name, "this receiver's name on the platform (default: its HOST:PORT)");
  recv->add_option("--advertise", p->advertise,
                   "HOST:PORT senders reach this receiver at (default: --listen, with the port it bound)");
  recv->add_option("--capacity-cpu", p->capacity_cpu,
                   "CPU cores platform senders may reserve for processing here (default: the online CPUs)");
  recv->add_option("--capacity-bandwidth", p->capacity_bandwidth,
                   "bytes/s platform senders may reserve, e.g. 500M (default: not limited)")
      ->transform(size_value());
  recv->add_option("--capacity-fps", p->capacity_fps, "messages/s platform senders may reserve (default: not limited)");
}

void add_platform_need(CLI::App* app, PlatformArgs* p, bool per_device) {
  app->add_option("--need-cpu", p->need_cpu,
                  per_device ? "CPU cores of processing to reserve on the receiver per offloaded device (default 0)"
                             : "CPU cores of processing to reserve on the receiver (default 0)");
  app->add_option("--need-bandwidth", p->need_bandwidth,
                  "bytes/s to reserve, e.g. 25M (default: --synthetic's frames x rate, else 0)")
      ->transform(size_value());
  app->add_option("--need-fps", p->need_fps, "messages/s to reserve (default: --synthetic's rate x cameras, else 0)");
  app->add_option("--reschedule-patience", p->patience,
                  "seconds to look for another receiver after losing one (default 30; a first request with no "
                  "receiver with room is refused at once)");
}

void add_platform_send(CLI::App* send, PlatformArgs* p) {
  add_platform_common(send, p);
  add_platform_need(send, p, /*per_device=*/false);
}

Status platform_need(const PlatformArgs& p, const Plan& plan, PlatformNeed* out) {
  PlatformNeed n;
  n.cpu = p.need_cpu;
  if (plan.synthetic) {
    const double cameras = plan.synthetic->last - plan.synthetic->first + 1;
    n.fps = plan.synthetic->fps * cameras;
    n.bandwidth = n.fps * double(plan.synthetic->frame_bytes);
  }
  if (p.need_fps) n.fps = *p.need_fps;
  if (p.need_bandwidth) {
    auto bytes = parse_size(*p.need_bandwidth);
    if (!bytes)
      return {Code::kInvalidArgument, "--need-bandwidth expects bytes/s such as 25M, got '" + *p.need_bandwidth + "'"};
    n.bandwidth = double(*bytes);
  }
  if (Status st = check_platform_need(n); !st.is_ok()) {
    return {Code::kInvalidArgument, "--need-cpu, --need-bandwidth, --need-fps: " + st.message()};
  }
  *out = n;
  return Status::ok();
}

// ------------------------------------------------------------------------------------ recv

int register_on_platform(const RecvArgs& args, const Receiver& rx, std::function<uint64_t()> backlog,
                         std::unique_ptr<PlatformRegistration>* out) {
  PlatformReceiverOptions ro;
  if (Status st = platform_security(args.platform.access, &ro.security); !st.is_ok()) {
    print_error("recv", st.message());
    return kExitUsage;
  }
  ro.platform = args.platform.url;
  ro.address = args.platform.advertise;
  ro.name = args.platform.name;
  ro.transport = *parse_transport(args.transport);
  ro.rdma = rdma_options(args.rdma_transport, args.rdma_device);
  ro.capacity.cpu = args.platform.capacity_cpu;
  if (args.platform.capacity_bandwidth) {
    auto bytes = parse_size(*args.platform.capacity_bandwidth);
    if (!bytes) {
      print_error("recv",
                  "--capacity-bandwidth expects bytes/s such as 500M, got '" + *args.platform.capacity_bandwidth + "'");
      return kExitUsage;
    }
    ro.capacity.bandwidth = double(*bytes);
  }
  ro.capacity.fps = args.platform.capacity_fps;
  ro.lease_ttl_seconds = args.platform.ttl;
  ro.backlog_bytes = std::move(backlog);
  ro.on_event = [](const std::string& text) { print_line(stderr, "slotstream recv: platform: " + text); };
  ro.on_lost = [](const std::string& text) { print_error("recv", "platform: " + text); };
  if (Status st = PlatformRegistration::start(rx, std::move(ro), out); !st.is_ok()) {
    print_error("recv", "--platform: " + st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  print_line(stderr,
             "slotstream recv: registered on the platform as " + (*out)->name() + " (" + (*out)->address() + ")");
  return kExitOk;
}

// ------------------------------------------------------------------------------------ send

Status platform_sender_options(const SendArgs& a, Plan* plan, PlatformSenderOptions* po, const std::string& cmd) {
  SLOTSTREAM_RETURN_IF_ERROR(check_sender_options(a, plan, &po->sender));
  SLOTSTREAM_RETURN_IF_ERROR(platform_need(a.platform, *plan, &po->need));
  po->platform = a.platform.url;
  SLOTSTREAM_RETURN_IF_ERROR(platform_security(a.platform.access, &po->security));
  po->lease_ttl_seconds = a.platform.ttl;
  po->patience = std::chrono::milliseconds(int64_t(a.platform.patience * 1000));
  const std::string prefix = "slotstream " + cmd + ": ";
  po->on_event = [prefix](const std::string& text) { print_line(stderr, prefix + text); };
  return Status::ok();
}

// `send --platform`: the same run, summary and Ctrl-C as plain send (tools/send.cc), its
// receiver chosen by the platform and replaced when lost; the summary adds connections,
// reschedules, resent and schedule_ms.
int run_platform_send(const SendArgs& a) {
  Interrupt interrupt("send");  // before any thread: they all inherit its blocked signals
  PlatformSenderOptions po;
  Plan plan;
  if (Status st = platform_sender_options(a, &plan, &po, "send"); !st.is_ok()) {
    return send_failed(a, st, exit_code_of(st));
  }
  std::unique_ptr<PlatformSender> sender;
  if (Status st = PlatformSender::connect(po, &sender); !st.is_ok()) return send_failed(a, st, exit_code_of(st));
  interrupt.arm();
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();
  Fillers fillers(
      plan, a,
      [&](uint16_t d) -> std::unique_ptr<MessageOut> {
        return std::make_unique<DeviceOut<PlatformSender>>(*sender, d);
      },
      &interrupt.stop());
  Status st = fillers.join();
  Status fin = sender->finish();
  if (st.is_ok()) st = fin;
  const PlatformSenderStats ps = sender->stats();
  SendSummary summary;
  fill_summary(fillers, t0, cpu0, &summary);
  summary.transport = ps.transport;
  summary.transport_reason = ps.transport_reason;
  summary.protocol = po.sender.protocol;
  summary.blocks = po.sender.blocks;
  summary.block_size = po.sender.block_size;
  summary.interrupted = interrupt.signal();
  summary.extra = {{"connections", ps.connections},
                   {"reschedules", ps.reschedules},
                   {"resent", ps.resent},
                   {"schedule_ms", ps.schedule_ms}};
  return report_send(a, plan, summary, st);
}

// ---------------------------------------------------------------------------- platform status

CLI::App* add_platform_status(CLI::App& app, PlatformStatusArgs* args) {
  auto* p = app.add_subcommand("platform", "Show what the cloud-edge platform holds: receivers and reservations.");
  p->add_option("--platform", args->url, "etcd://HOST:PORT[,HOST:PORT...]")->required();
  add_platform_access(p, &args->access);
  p->add_flag("--json", args->json, "one JSON object {receivers: [...], reservations: [...]}");
  return p;
}

namespace {

// "512 MiB", "15.6 GiB": a size at a glance (the JSON has the bytes).
std::string approx_size(uint64_t bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = double(bytes);
  int u = 0;
  for (; v >= 1024 && u < 4; ++u) v /= 1024;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, kUnits[u]);
  return buf;
}

}  // namespace

int run_platform_status(const PlatformStatusArgs& args) {
  PlatformSecurity security;
  if (Status st = platform_security(args.access, &security); !st.is_ok()) {
    print_error("platform", st.message());
    return kExitUsage;
  }
  PlatformState state;
  if (Status st = read_platform_state(args.url, security, &state); !st.is_ok()) {
    print_error("platform", st.message());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  for (const auto& line : state.skipped) print_line(stderr, "slotstream platform: warning: " + line);
  if (args.json) {
    nlohmann::json j = {{"revision", state.revision},
                        {"receivers", nlohmann::json::array()},
                        {"reservations", nlohmann::json::array()}};
    for (const auto& r : state.receivers) j["receivers"].push_back(nlohmann::json::parse(r.json));
    for (const auto& r : state.reservations) j["reservations"].push_back(nlohmann::json::parse(r.json));
    std::printf("%s\n", j.dump().c_str());
    return kExitOk;
  }
  std::printf("%zu receivers, %zu reservations (etcd revision %lld)\n", state.receivers.size(),
              state.reservations.size(), (long long)state.revision);
  for (const auto& r : state.receivers) {
    std::printf("receiver %s at %s: free cpu %.2f, %s free memory, %s free receive memory, %u senders\n",
                r.name.c_str(), r.address.c_str(), r.free_cpu, approx_size(r.free_memory).c_str(),
                approx_size(r.free_receive_memory).c_str(), r.senders);
  }
  for (const auto& r : state.reservations) {
    std::printf("reservation %s -> %s: %s\n", r.sender.c_str(), r.receiver.c_str(), r.amount.c_str());
  }
  return kExitOk;
}

}  // namespace slotstream::tools
