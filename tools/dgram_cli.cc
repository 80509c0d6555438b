// `slotstream recv|send --transport udp` and `send --transport tcp --protocol dgram_rc`.
#include "dgram_cli.h"
#include "cli_util.h"
#include "interrupt.h"
#include "log.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "dgram/protocol.h"
#include "dgram/receiver.h"
#include "dgram/sender.h"
#include "dgram/stores.h"
#include "metrics.h"
#include "pipeline/worker_manager.h"
#include "send_plan.h"

namespace slotstream::tools {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kGroup = "Datagram transport (--transport udp, docs/design.md)";
// How long a receiver told to exit after K senders stays to answer repeated FINs (the sender repeats every
// 200 ms until it hears a FIN_ACK).
constexpr int64_t kLinger = 1'000'000'000;

// Options of the UCX path that mean nothing to the datagram sender (the datagram receiver takes every
// option of the block receiver's; --rdma-* are refused there as for every transport but rdma).
constexpr const char* kUcxOnlySend[] = {"--block-size", "--rdma-transport", "--rdma-device"};
constexpr const char* kInjectOptions[] = {"--inject-loss", "--inject-reorder", "--inject-duplicate", "--inject-corrupt",
                                          "--inject-seed"};
constexpr const char* kDgramOnlyRecv[] = {"--partial", "--message-timeout", "--session-timeout", "--max-message",
                                          "--interface"};
constexpr const char* kDgramOnlySend[] = {"--segment-size", "--ttl", "--interface"};

std::string value_of(CLI::App* app, const char* name) {
  CLI::Option* o = app->get_option_no_throw(name);
  return o && o->count() > 0 ? o->results().front() : "";
}

// Throws a usage error if one of `names` was given on `app`.
template <size_t N>
void refuse_given(CLI::App* app, const char* const (&names)[N], const std::string& why) {
  for (const char* n : names) {
    CLI::Option* o = app->get_option_no_throw(n);
    if (o && o->count() > 0) throw CLI::ValidationError(n, why);
  }
}

void add_inject_options(CLI::App* app, DgramArgs* a, const char* side) {
  const std::string what = std::string("percent of the datagrams this end ") + side;
  app->add_option("--inject-loss", a->inject_loss, "P: drop P " + what + " (tests; seeded)")->group(kGroup);
  app->add_option("--inject-reorder", a->inject_reorder, "P: deliver P " + what + " after the next one")->group(kGroup);
  app->add_option("--inject-duplicate", a->inject_duplicate, "P: duplicate P " + what)->group(kGroup);
  app->add_option("--inject-corrupt", a->inject_corrupt, "P: flip one bit in P " + what + " (the CRC must catch it)")
      ->group(kGroup);
  app->add_option("--inject-seed", a->inject_seed, "seed of the fault injector (same seed, same faults)")
      ->default_str("1")
      ->group(kGroup);
}

Status parse_inject(const DgramArgs& a, dgram::InjectOptions* o) {
  struct {
    const std::string& text;
    double* out;
    const char* name;
  } items[] = {{a.inject_loss, &o->loss, "--inject-loss"},
               {a.inject_reorder, &o->reorder, "--inject-reorder"},
               {a.inject_duplicate, &o->duplicate, "--inject-duplicate"},
               {a.inject_corrupt, &o->corrupt, "--inject-corrupt"}};
  for (auto& it : items) {
    if (it.text.empty()) continue;
    if (!dgram::parse_percent(it.text, it.out)) {
      return {Code::kInvalidArgument, std::string(it.name) + " expects a percentage 0..100, got '" + it.text + "'"};
    }
  }
  o->seed = a.inject_seed;
  return Status::ok();
}

std::string protocol_list() {
  std::string s;
  for (const dgram::Descriptor* p : dgram::protocols())
    s += "\n  " + std::string(p->name) + ": " + std::string(p->summary);
  return s;
}

// ------------------------------------------------------------------------------------ recv

// The block receiver's line (docs/cli-contract.md) with the datagram counters after it: messages =
// complete ones, gaps = messages of which nothing arrived.
std::string report_line(const SessionReport& r) {
  const DeviceStats t = dgram::device_totals(r);
  auto counter = [&r](const char* key) { return dgram::counter(r, key); };
  std::ostringstream o;
  if (r.finished) {
    o << "sender " << r.sender.name << " finished: messages=" << t.messages << " bytes=" << t.bytes
      << " gaps=" << t.lost << " duplicates=" << r.duplicates << " unknown_device=" << r.unknown_device
      << " out_of_window=" << r.out_of_window;
  } else {
    o << "sender " << r.sender.name << " lost: kept " << t.messages << " complete messages, discarded " << t.dropped
      << " partial (" << r.reason << ");";
  }
  o << " transport=" << transport_name(r.sender.transport) << " protocol=" << r.sender.protocol
    << " sent=" << counter("sent") << " partial=" << t.partial << " dropped=" << t.dropped << " lost=" << t.lost
    << " retired=" << counter("retired") << " crc_errors=" << counter("crc_errors")
    << " malformed=" << counter("malformed") << " stale=" << counter("stale") << " datagrams=" << counter("datagrams");
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.2f", r.seconds);
  o << " seconds=" << secs;
  return o.str();
}

// What /metrics shows of the datagram receiver beyond the families every receiver has: the devices'
// partial, dropped and lost messages, and the session counters (dgram/report.h counter_docs()).
ExtraFamilies datagram_families() {
  ExtraFamilies x;
  x.per_device = {{"slotstream_dgram_partial_total", "Incomplete RDMA Write-Record messages kept (--partial keep).",
                   &DeviceStats::partial},
                  {"slotstream_dgram_dropped_total", "Incomplete messages discarded.", &DeviceStats::dropped},
                  {"slotstream_dgram_lost_total", "Messages of which no segment arrived.", &DeviceStats::lost}};
  for (const dgram::CounterDoc& d : dgram::counter_docs()) {
    if (d.metric) x.per_sender.push_back({d.key, d.metric, std::string(d.help) + " (sender=\"\": no session's)"});
  }
  return x;
}

// The datagrams that belonged to no session, as the sender="" sample of each session counter family.
void unattributed_samples(const dgram::DatagramCounters& c, std::vector<prometheus::MetricFamily>* out) {
  const std::map<std::string, uint64_t> values = dgram::protocol_counters(c);
  for (const dgram::CounterDoc& d : dgram::counter_docs()) {
    if (!d.metric) continue;
    for (auto& f : *out) {
      if (f.name == d.metric)
        f.metric.push_back(sample({{"sender", ""}}, prometheus::MetricType::Counter, double(values.at(d.key))));
    }
  }
}

// What the receiver turned away, and what it has promised: no labels, one sample each.
void receiver_metrics(const dgram::DatagramReceiver::Counters& rc, std::vector<prometheus::MetricFamily>* out) {
  using prometheus::MetricType;
  using R = dgram::ReceiverCounters;
  struct Counter {
    const char* name;
    const char* help;
    uint64_t R::*field;
  };
  for (Counter c :
       {Counter{"slotstream_dgram_hellos_refused_total",
                "HELLOs and AUTHs refused, and multicast senders (once per sender and reason).", &R::hellos_refused},
        Counter{"slotstream_dgram_challenges_total", "CHALLENGEs sent (recv --token-file).", &R::challenges},
        Counter{"slotstream_dgram_auth_failures_total", "AUTHs with a wrong proof or a stale or foreign cookie.",
                &R::auth_failures},
        Counter{"slotstream_dgram_replies_withheld_total",
                "Answers not sent because they were larger than an unauthenticated request.", &R::replies_withheld},
        Counter{"slotstream_dgram_sessions_evicted_total",
                "Unauthenticated sessions ended to make room for a new sender.", &R::sessions_evicted},
        Counter{"slotstream_dgram_memory_refusals_total", "Senders refused for recv --max-memory.",
                &R::memory_refusals},
        Counter{"slotstream_dgram_connections_refused_total", "TCP connections closed at once (cap reached).",
                &R::connections_refused},
        Counter{"slotstream_dgram_connections_evicted_total",
                "TCP connections without a session closed for a newer one.", &R::connections_evicted},
        Counter{"slotstream_dgram_connections_timed_out_total",
                "TCP connections without a session after the hello deadline.", &R::connections_timed_out},
        Counter{"slotstream_dgram_accept_errors_total", "Failed accept() calls (e.g. the descriptor limit).",
                &R::accept_errors},
        Counter{"slotstream_dgram_log_suppressed_total", "Log lines left out by the rate limit.", &R::log_suppressed},
        Counter{"slotstream_dgram_sessions_terminated_total",
                "Sessions ended by a TERMINATE (a protocol error), sent or received.", &R::sessions_terminated}}) {
    out->push_back(
        {c.name, c.help, MetricType::Counter, {sample({}, MetricType::Counter, double(rc.receiver.*c.field))}});
  }
  prometheus::MetricFamily refused{"slotstream_dgram_announces_refused_total",
                                   "Multicast senders refused, by reason (each once per reason; the sender is not "
                                   "told: a group's sender hears nothing back).",
                                   MetricType::Counter,
                                   {}};
  for (size_t i = 0; i < dgram::kAnnounceRefusals; ++i) {
    refused.metric.push_back(sample({{"reason", dgram::refusal_label(dgram::AnnounceRefusal(i))}}, MetricType::Counter,
                                    double(rc.receiver.announces_refused[i])));
  }
  out->push_back(std::move(refused));
  for (auto [name, help, value] :
       {std::tuple{"slotstream_dgram_memory_promised_bytes", "Memory promised to the live sessions.",
                   rc.memory_promised},
        std::tuple{"slotstream_dgram_memory_budget_bytes", "recv --max-memory.", rc.memory_budget},
        std::tuple{"slotstream_dgram_connections", "TCP connections open.", uint64_t(rc.connections)}}) {
    out->push_back({name, help, MetricType::Gauge, {sample({}, MetricType::Gauge, double(value))}});
  }
}

// The shared collector's families (tools/metrics.h) and the datagram receiver's own.
std::vector<prometheus::MetricFamily> collect_metrics(const dgram::DatagramReceiver& rx, MetricsState& state,
                                                      const pipeline::WorkerManager* workers) {
  std::vector<prometheus::MetricFamily> out = state.collect(rx.live_sessions(), workers);
  const dgram::DatagramReceiver::Counters rc = rx.counters();
  unattributed_samples(rc.unattributed, &out);
  receiver_metrics(rc, &out);
  return out;
}

// ------------------------------------------------------------------------------------ send

class DgramOut final : public MessageOut {
 public:
  DgramOut(dgram::DatagramSender& tx, uint16_t device) : tx_(tx), device_(device) {}
  uint16_t device() const override { return device_; }
  Status send_with(uint64_t length, const DeviceStream::FillFn& fill) override {
    return tx_.send_with(device_, length, fill);
  }
  Status send(std::span<const std::byte> message) override { return tx_.send(device_, message); }

 private:
  dgram::DatagramSender& tx_;
  uint16_t device_;
};

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

}  // namespace

void add_dgram_options(CLI::App* recv, CLI::App* send, DgramArgs* a) {
  recv->add_option("--partial", a->partial,
                   "keep|drop: an RDMA Write-Record message still incomplete when its timer fires is stored as "
                   "<SEQ>.partial (holes zero-filled) beside <SEQ>.valid (JSON [[offset, length], ...]), or counted "
                   "and discarded")
      ->check(CLI::IsMember({"keep", "drop"}))
      ->default_str("drop")
      ->group(kGroup);
  recv->add_option("--message-timeout", a->message_timeout_ms,
                   "MS from a message's first segment until it is given up as incomplete (and from a later message "
                   "until one of which nothing arrived counts as lost; also 2s, 500ms), 1..600000")
      ->transform(duration_value("ms"))
      ->check(CLI::Range(1.0, 600000.0))
      ->default_str("200")
      ->group(kGroup);
  recv->add_option("--session-timeout", a->session_timeout_s,
                   "S of silence after which a sender is lost, and a dgram_rd/dgram_rc message without a new byte "
                   "is given up (not while the receiver holds the sender back; also 90s, 5m, 1h), 0.1..86400")
      ->transform(duration_value("s"))
      ->check(CLI::Range(0.1, 86400.0))
      ->default_str("30")
      ->group(kGroup);
  recv->add_option("--max-message", a->max_message, "SIZE: largest message (region) a sender may announce")
      ->transform(size_value(1, uint64_t(1) << 32))
      ->default_str(std::to_string(64 << 20))
      ->group(kGroup);
  recv->add_option("--interface", a->interface,
                   "NAME: the network interface on which to join the multicast group of --listen GROUP:PORT "
                   "(default: the one the kernel routes the group to)")
      ->group(kGroup);
  add_inject_options(recv, a, "receives");
  send->add_option("--segment-size", a->segment_size,
                   "SIZE: payload bytes per datagram segment (udp: 64.." + std::to_string(dgram::kMaxSegmentPayload) +
                       "; 1408 fits a 1500-byte Ethernet MTU, 1392 with --token-file)")
      ->transform(size_value())
      ->default_str("8192")
      ->group(kGroup);
  send->add_option("--ttl", a->ttl,
                   "N: hop limit (IP TTL) of the datagrams to a multicast group (--to 239.x.y.z:PORT; default 1: "
                   "this network only)")
      ->check(CLI::Range(1, 255))
      ->group(kGroup);
  send->add_option("--interface", a->interface,
                   "NAME: the network interface a multicast group's datagrams leave by (default: by route)")
      ->group(kGroup);
  add_inject_options(send, a, "sends");
  for (auto [app, name, text] :
       {std::tuple{send, "--to",
                   "\n--transport udp: also an IP multicast group GROUP:PORT (239.x.y.z; UD protocols "
                   "write_record and dgram_send: every receiver on the group stores the stream)"},
        std::tuple{recv, "--listen",
                   "\n--transport udp: also an IP multicast group GROUP:PORT to join (with the "
                   "sender's port; its senders announce themselves, nothing is sent back)"}}) {
    CLI::Option* o = app->get_option(name);
    o->description(o->get_description() + text);
  }
  a->protocol_opt = send->get_option("--protocol");
  a->protocol_opt->description(a->protocol_opt->get_description() +
                               "\ndatagram protocols (--transport udp; dgram_rc: --transport tcp):" + protocol_list());

  recv->parse_complete_callback([recv] {
    if (value_of(recv, "--transport") != "udp") {
      refuse_given(recv, kDgramOnlyRecv, "applies to --transport udp only");
      refuse_given(recv, kInjectOptions, "applies to --transport udp only");
    }
  });
  send->parse_complete_callback([send] {
    const std::string t = value_of(send, "--transport"), p = value_of(send, "--protocol");
    if (t == "udp" || dgram::find_protocol(p)) {
      refuse_given(send, kUcxOnlySend, "does not apply to the datagram transport");
    } else {
      refuse_given(send, kDgramOnlySend, "applies to the datagram transport only (--transport udp)");
      refuse_given(send, kInjectOptions, "applies to the datagram transport only (--transport udp)");
    }
  });
}

bool is_dgram_send(const SendArgs& a) { return a.transport == "udp" || dgram::find_protocol(a.protocol) != nullptr; }

Status read_token_if_given(const std::string& file, std::string* token) {
  return file.empty() ? Status::ok() : read_token(file, token);
}

namespace {

// --max-memory and --token-file of `recv --transport udp`: what the UCX receiver reads too.
Status dgram_recv_limits(const RecvArgs& args, dgram::DatagramReceiverOptions* o) {
  if (args.max_memory) {
    auto bytes = parse_size(*args.max_memory);
    if (!bytes || *bytes == 0) {
      return {Code::kInvalidArgument, "--max-memory expects a size such as 512M or 4G, got '" + *args.max_memory + "'"};
    }
    o->max_memory = *bytes;
  }
  return read_token_if_given(args.token_file, &o->token);
}

// The receiver's options from the command line, as the block receiver reads them where they are the
// same (--listen, --hold-block, --max-memory, --token-file; --rdma-* are rdma's). kExitOk, or
// kExitUsage after printing what is wrong.
int dgram_recv_options(const RecvArgs& args, const DgramArgs& d, dgram::DatagramReceiverOptions* o) {
  if (Status st = parse_address(args.listen, &o->host, &o->port); !st.is_ok()) {
    print_error("recv", "--listen: " + st.message());
    return kExitUsage;
  }
  if (auto why = misplaced_rdma_options(args.transport, args.rdma_transport, args.rdma_device)) {
    print_error("recv", *why);
    return kExitUsage;
  }
  if (int rc = parse_holds(args, &o->holds); rc != kExitOk) return rc;
  for (Status st : {dgram_recv_limits(args, o), parse_inject(d, &o->inject)}) {
    if (!st.is_ok()) {
      print_error("recv", st.message());
      return kExitUsage;
    }
  }
  o->keep_partial = d.partial == "keep";
  o->interface = d.interface;
  o->message_timeout_ns = int64_t(d.message_timeout_ms * 1e6);
  o->session_timeout_ns = int64_t(d.session_timeout_s * 1e9);
  o->max_message = d.max_message;
  return kExitOk;
}

// Each sender's store: nothing (--discard), its directory below --out, or that directory feeding the
// per-device workers (started here, into *workers; a device whose worker is behind pauses, as over
// UCX). kExitOk, or kExitError if --out cannot be used.
int dgram_stores(const RecvArgs& args, dgram::DatagramReceiverOptions* o,
                 std::unique_ptr<pipeline::WorkerManager>* workers) {
  if (args.discard) {
    o->make_store = [](const std::string&, std::unique_ptr<dgram::MessageStore>* s) {
      *s = std::make_unique<dgram::NullStore>();
      return Status::ok();
    };
    return kExitOk;
  }
  if (Status st = prepare_out_dir(args.out); !st.is_ok()) {
    print_error("recv", st.message());
    return kExitError;
  }
  if (uses_workers(args)) *workers = start_workers(args);
  pipeline::WorkerManager* wm = workers->get();
  const fs::path out = args.out;
  o->make_store = [out, wm](const std::string& name, std::unique_ptr<dgram::MessageStore>* s) {
    dgram::DirStore::Workers w;
    if (wm) {
      w.over_limit = [wm, name](uint16_t d, std::string* why) { return wm->over_limit(name, d, why); };
      w.stored = [wm, name](uint16_t d, uint64_t seq, uint64_t bytes) { wm->stored(name, d, seq, bytes); };
    }
    *s = std::make_unique<dgram::DirStore>(out / name, std::move(w));
    return Status::ok();
  };
  return kExitOk;
}

}  // namespace

int run_dgram_recv(const RecvArgs& args, const DgramArgs& d) {
  dgram::DatagramReceiverOptions o;
  if (int rc = dgram_recv_options(args, d, &o); rc != kExitOk) return rc;
  if (int rc = check_sink_options(args); rc != kExitOk) return rc;
  std::unique_ptr<pipeline::WorkerManager> workers;
  if (int rc = dgram_stores(args, &o, &workers); rc != kExitOk) return rc;
  MetricsState metrics_state{std::chrono::seconds(args.metrics_prune_after), datagram_families()};
  o.on_session_end = [&metrics_state](const SessionReport& r) {
    metrics_state.session_ended(r);
    print_line(stdout, report_line(r));
  };
  o.on_event = [](const std::string& text) { log_info(text); };

  const sigset_t sigs = block_stop_signals();
  std::unique_ptr<dgram::DatagramReceiver> rx;
  if (Status st = dgram::DatagramReceiver::start(std::move(o), &rx); !st.is_ok()) {
    // (a listen address in use: the message says so; "connect failed" would mislead)
    print_error("recv", st.code() == Code::kInvalidArgument || st.code() == Code::kConnectFailed ? st.message()
                                                                                                 : st.to_string());
    return st.code() == Code::kInvalidArgument ? kExitUsage : kExitError;
  }
  std::unique_ptr<MetricsServer> metrics;
  if (!args.metrics.empty()) {
    const dgram::DatagramReceiver* r = rx.get();
    Status st = MetricsServer::start(
        args.metrics, [r, &metrics_state, wm = workers.get()] { return collect_metrics(*r, metrics_state, wm); },
        &metrics, [out = args.discard ? std::string() : args.out] { return store_readiness(out); });
    if (!st.is_ok()) {
      print_error("recv", "--metrics: " + st.message());
      return kExitError;
    }
    log_info("metrics on http://" + metrics->address() + "/metrics");
  }
  print_line(stdout, "listening on " + rx->listen_address());
  // After the last sender, linger while FINs are still being repeated (a lost FIN_ACK), then exit.
  wait_for_stop(sigs, [&] {
    return args.exit_after > 0 && rx->sessions_ended() >= args.exit_after && rx->since_last_fin_ack_ns() > kLinger;
  });
  rx->stop();
  metrics.reset();
  if (workers) workers->stop();
  return kExitOk;
}

namespace {

// The protocol `send` asked for, if it is a datagram one over the transport given; else nullptr after
// printing why.
// The datagram protocol `send` asked for (--protocol, else the default), checked against --transport.
Status dgram_send_protocol(const SendArgs& a, const DgramArgs& d, const dgram::Descriptor** out) {
  const bool protocol_given = d.protocol_opt && d.protocol_opt->count() > 0;
  const std::string protocol = protocol_given ? a.protocol : dgram::kDefaultProtocol;
  const dgram::Descriptor* proto = dgram::find_protocol(protocol);
  if (!proto) {
    return {Code::kInvalidArgument,
            "--protocol " + protocol + " runs over UCX (--transport shm|tcp); over udp:" + protocol_list()};
  }
  const std::string want = proto->over_tcp ? "tcp" : "udp";
  if (a.transport != want) {
    return {Code::kInvalidArgument,
            "--protocol " + std::string(proto->name) + " runs over " + want + ": give --transport " + want};
  }
  *out = proto;
  return Status::ok();
}

// The sender's options and what it sends, from the command line; an error says what is wrong.
Status dgram_send_options(const SendArgs& a, const DgramArgs& d, const dgram::Descriptor& proto,
                          dgram::DatagramSenderOptions* o, Plan* plan) {
  if (a.to.find(',') != std::string::npos) {
    return {Code::kInvalidArgument, "--to: the datagram transport sends to one receiver"};
  }
  if (Status st = parse_address(a.to, &o->host, &o->port); !st.is_ok()) {
    return {Code::kInvalidArgument, "--to: " + st.message()};
  }
  for (Status st :
       {plan_send(a, plan, &o->name), parse_inject(d, &o->inject), read_token_if_given(a.token_file, &o->token)}) {
    if (!st.is_ok()) return {Code::kInvalidArgument, st.message()};
  }
  o->protocol = proto.name;
  o->devices = plan->devices();
  o->ring = a.blocks;
  o->segment_size = d.segment_size;
  o->ttl = d.ttl;
  o->interface = d.interface;
  o->max_message = largest_message(*plan);
  return Status::ok();
}

// What the receiver's FIN_ACK says of every message: a line on stderr when not all arrived complete,
// and `--json`'s receiver object.
nlohmann::json receiver_accounting(const dgram::FinAck& report, const dgram::DatagramSenderStats& s,
                                   const dgram::Descriptor& proto) {
  dgram::DeliveryCounts total;
  nlohmann::json per = nlohmann::json::object();
  for (const auto& dev : report.devices) {
    const auto& c = dev.counts;
    total.complete += c.complete;
    total.partial += c.partial;
    total.dropped += c.dropped;
    total.lost += c.lost;
    total.valid_bytes += c.valid_bytes;
    per[std::to_string(dev.device)] = {{"sent", s.per_device.contains(dev.device) ? s.per_device.at(dev.device) : 0},
                                       {"complete", c.complete},
                                       {"partial", c.partial},
                                       {"dropped", c.dropped},
                                       {"lost", c.lost},
                                       {"valid_bytes", c.valid_bytes}};
  }
  if (total.complete != s.messages) {
    std::fprintf(stderr,
                 "slotstream send: the receiver stored %llu of %llu messages complete (%llu partial, %llu dropped, "
                 "%llu lost)%s\n",
                 (unsigned long long)total.complete, (unsigned long long)s.messages, (unsigned long long)total.partial,
                 (unsigned long long)total.dropped, (unsigned long long)total.lost,
                 total.dropped > 0 && !proto.over_tcp && proto.service == dgram::Service::kUD
                     ? "; a message not complete within the receiver's --message-timeout of its first segment is "
                       "given up (UD has no retransmission: raise the timeout, or use dgram_rd)"
                     : "");
  }
  return {{"complete", total.complete}, {"partial", total.partial},         {"dropped", total.dropped},
          {"lost", total.lost},         {"valid_bytes", total.valid_bytes}, {"devices", per}};
}

// What the datagram transport adds to `send --json` (docs/cli-contract.md).
nlohmann::json send_extras(const dgram::DatagramSenderOptions& o, const dgram::DatagramSenderStats& s,
                           bool tx_multicast) {
  nlohmann::json j;
  j["segment_size"] = o.segment_size;
  j["datagrams"] = s.datagrams;
  j["retransmits"] = s.retransmits;
  j["retransmit_timeouts"] = s.timeouts;
  j["credit_waits"] = s.credit_waits;
  j["authenticated"] = !o.token.empty();
  j["multicast"] = tx_multicast;
  j["forged"] = s.forged;  // datagrams from the receiver's address without a right MAC, dropped
  j["injected"] = {{"loss", s.injected_loss},
                   {"corrupt", s.injected_corrupt},
                   {"duplicate", s.injected_duplicate},
                   {"reorder", s.injected_reorder}};
  return j;
}

}  // namespace

int run_dgram_send(const SendArgs& a, const DgramArgs& d) {
  Interrupt interrupt("send");  // before any thread: they all inherit its blocked signals
  const dgram::Descriptor* proto = nullptr;
  dgram::DatagramSenderOptions o;
  Plan plan;
  Status st = dgram_send_protocol(a, d, &proto);
  if (st.is_ok()) st = dgram_send_options(a, d, *proto, &o, &plan);
  if (!st.is_ok()) return send_failed(a, st, exit_code_of(st));
  std::unique_ptr<dgram::DatagramSender> tx;
  if (st = dgram::DatagramSender::connect(o, &tx); !st.is_ok()) return send_failed(a, st, exit_code_of(st));
  interrupt.arm();
  const auto t0 = Clock::now();
  const double cpu0 = cpu_seconds();
  // One filler thread per device, as `send` does over UCX.
  Fillers fillers(
      plan, a, [&](uint16_t d) -> std::unique_ptr<MessageOut> { return std::make_unique<DgramOut>(*tx, d); },
      &interrupt.stop());
  dgram::FinAck report;
  st = fillers.join();
  Status fin = tx->finish(&report);
  if (st.is_ok()) st = fin;
  const dgram::DatagramSenderStats s = tx->stats();
  SendSummary summary;
  fill_summary(fillers, t0, cpu0, &summary);
  summary.transport = proto->over_tcp ? "tcp" : "udp";
  summary.protocol = proto->name;
  summary.blocks = o.ring;
  summary.interrupted = interrupt.signal();
  summary.extra = send_extras(o, s, tx->multicast());
  // A multicast group answers no FIN: each of its receivers reports its own accounting.
  if (st.is_ok())
    summary.extra["receiver"] = tx->multicast() ? nlohmann::json() : receiver_accounting(report, s, *proto);
  return report_send(a, plan, summary, st);
}

}  // namespace slotstream::tools
