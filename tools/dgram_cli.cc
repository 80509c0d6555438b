// What `slotstream recv|send --transport udp` (and `send --transport tcp --protocol dgram_rc`) add to the
// commands: options, the receiver's line and /metrics, send --json's fields. The transfer itself is the
// library's Sender and Receiver (tools/send.cc, tools/recv.cc).
#include "dgram_cli.h"
#include "cli_util.h"

#include <cstdio>
#include <sstream>

#include "slotstream/datagram.h"
#include "slotstream/options.h"

namespace slotstream::tools {

namespace {

constexpr const char* kGroup = "Datagram transport (--transport udp, docs/design.md)";
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

Status parse_faults(const DgramArgs& a, DatagramFaults* o) {
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
    if (auto fraction = parse_percent(it.text)) {
      *it.out = *fraction;
    } else {
      return {Code::kInvalidArgument, std::string(it.name) + " expects a percentage 0..100, got '" + it.text + "'"};
    }
  }
  o->seed = a.inject_seed;
  return Status::ok();
}

}  // namespace

// The block receiver's line (docs/cli-contract.md) with the datagram counters after it: messages =
// complete ones, gaps = messages of which nothing arrived.
std::string datagram_session_line(const SessionReport& r) {
  DeviceStats t;
  for (const auto& [_, s] : r.per_device) t.add(s);
  auto counter = [&r](const std::string& key) {
    auto it = r.protocol_counters.find(key);
    return it == r.protocol_counters.end() ? uint64_t(0) : it->second;
  };
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
// partial, dropped and lost messages, and the session counters (slotstream/datagram.h).
ExtraFamilies datagram_families() {
  ExtraFamilies x;
  x.per_device = {{"slotstream_dgram_partial_total", "Incomplete RDMA Write-Record messages kept (--partial keep).",
                   &DeviceStats::partial},
                  {"slotstream_dgram_dropped_total", "Incomplete messages discarded.", &DeviceStats::dropped},
                  {"slotstream_dgram_lost_total", "Messages of which no segment arrived.", &DeviceStats::lost}};
  for (const DatagramCounterDoc& d : datagram_counter_docs()) {
    if (d.metric) x.per_sender.push_back({d.key, d.metric, std::string(d.help) + " (sender=\"\": no session's)"});
  }
  return x;
}

namespace {

uint64_t counter_value(const std::map<std::string, uint64_t>& counters, const std::string& key) {
  auto it = counters.find(key);
  return it == counters.end() ? 0 : it->second;
}

// The datagrams that belonged to no session, as the sender="" sample of each session counter family.
void unattributed_samples(const std::map<std::string, uint64_t>& counters, std::vector<prometheus::MetricFamily>* out) {
  for (const DatagramCounterDoc& d : datagram_counter_docs()) {
    if (!d.metric) continue;
    for (auto& f : *out) {
      if (f.name == d.metric) {
        f.metric.push_back(sample({{"sender", ""}}, prometheus::MetricType::Counter,
                                  double(counter_value(counters, std::string("unattributed:") + d.key))));
      }
    }
  }
}

// What the receiver turned away, and what it has promised: no labels, one sample each.
void receiver_metrics(const std::map<std::string, uint64_t>& counters, std::vector<prometheus::MetricFamily>* out) {
  using prometheus::MetricType;
  struct Counter {
    const char* name;
    const char* help;
    const char* key;
  };
  for (Counter c :
       {Counter{"slotstream_dgram_hellos_refused_total",
                "HELLOs and AUTHs refused, and multicast senders (once per sender and reason).", "hellos_refused"},
        Counter{"slotstream_dgram_challenges_total", "CHALLENGEs sent (recv --token-file).", "challenges"},
        Counter{"slotstream_dgram_auth_failures_total", "AUTHs with a wrong proof or a stale or foreign cookie.",
                "auth_failures"},
        Counter{"slotstream_dgram_replies_withheld_total",
                "Answers not sent because they were larger than an unauthenticated request.", "replies_withheld"},
        Counter{"slotstream_dgram_sessions_evicted_total",
                "Unauthenticated sessions ended to make room for a new sender.", "sessions_evicted"},
        Counter{"slotstream_dgram_memory_refusals_total", "Senders refused for recv --max-memory.", "memory_refusals"},
        Counter{"slotstream_dgram_connections_refused_total", "TCP connections closed at once (cap reached).",
                "connections_refused"},
        Counter{"slotstream_dgram_connections_evicted_total",
                "TCP connections without a session closed for a newer one.", "connections_evicted"},
        Counter{"slotstream_dgram_connections_timed_out_total",
                "TCP connections without a session after the hello deadline.", "connections_timed_out"},
        Counter{"slotstream_dgram_accept_errors_total", "Failed accept() calls (e.g. the descriptor limit).",
                "accept_errors"},
        Counter{"slotstream_dgram_log_suppressed_total", "Log lines left out by the rate limit.", "log_suppressed"},
        Counter{"slotstream_dgram_sessions_terminated_total",
                "Sessions ended by a TERMINATE (a protocol error), sent or received.", "sessions_terminated"}}) {
    out->push_back({c.name,
                    c.help,
                    MetricType::Counter,
                    {sample({}, MetricType::Counter, double(counter_value(counters, c.key)))}});
  }
  prometheus::MetricFamily refused{"slotstream_dgram_announces_refused_total",
                                   "Multicast senders refused, by reason (each once per reason; the sender is not "
                                   "told: a group's sender hears nothing back).",
                                   MetricType::Counter,
                                   {}};
  for (const char* label : announce_refusal_reasons()) {
    refused.metric.push_back(sample({{"reason", label}}, MetricType::Counter,
                                    double(counter_value(counters, std::string("announces_refused:") + label))));
  }
  out->push_back(std::move(refused));
  for (auto [name, help, key] :
       {std::tuple{"slotstream_dgram_memory_promised_bytes", "Memory promised to the live sessions.",
                   "memory_promised"},
        std::tuple{"slotstream_dgram_memory_budget_bytes", "recv --max-memory.", "memory_budget"},
        std::tuple{"slotstream_dgram_connections", "TCP connections open.", "connections"}}) {
    out->push_back(
        {name, help, MetricType::Gauge, {sample({}, MetricType::Gauge, double(counter_value(counters, key)))}});
  }
}

}  // namespace

std::vector<prometheus::MetricFamily> collect_datagram_metrics(const Receiver& rx, MetricsState& state,
                                                               const DirectoryWorkers* workers) {
  std::vector<prometheus::MetricFamily> out = state.collect(rx.live_sessions(), workers);
  const std::map<std::string, uint64_t> counters = rx.counters();
  unattributed_samples(counters, &out);
  receiver_metrics(counters, &out);
  return out;
}

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
      ->check(schema_value("message_timeout"))
      ->default_str("200")
      ->group(kGroup);
  recv->add_option("--session-timeout", a->session_timeout_s,
                   "S of silence after which a sender is lost, and a dgram_rd/dgram_rc message without a new byte "
                   "is given up (not while the receiver holds the sender back; also 90s, 5m, 1h), 0.1..86400")
      ->transform(duration_value("s"))
      ->check(schema_value("session_timeout"))
      ->default_str("30")
      ->group(kGroup);
  recv->add_option("--max-message", a->max_message, "SIZE: largest message (region) a sender may announce")
      ->transform(schema_value("max_message"))
      ->default_str(std::to_string(64 << 20))
      ->group(kGroup);
  recv->add_option("--interface", a->interface,
                   "NAME: the network interface on which to join the multicast group of --listen GROUP:PORT "
                   "(default: the one the kernel routes the group to)")
      ->group(kGroup);
  add_inject_options(recv, a, "receives");
  send->add_option("--segment-size", a->segment_size,
                   "SIZE: payload bytes per datagram segment (udp: 64.." +
                       std::to_string(uint64_t(find_option("segment_size")->max)) +
                       "; 1408 fits a 1500-byte Ethernet MTU, 1392 with --token-file)")
      ->transform(schema_value("segment_size"))
      ->default_str("8192")
      ->group(kGroup);
  send->add_option("--ttl", a->ttl,
                   "N: hop limit (IP TTL) of the datagrams to a multicast group (--to 239.x.y.z:PORT; default 1: "
                   "this network only)")
      ->check(schema_value("ttl"))
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

  recv->parse_complete_callback([recv] {
    if (value_of(recv, "--transport") != "udp") {
      refuse_given(recv, kDgramOnlyRecv, "applies to --transport udp only");
      refuse_given(recv, kInjectOptions, "applies to --transport udp only");
    }
  });
  send->parse_complete_callback([send] {
    SendArgs a;
    a.transport = value_of(send, "--transport");
    a.protocol = value_of(send, "--protocol");
    if (is_dgram_send(a)) {
      refuse_given(send, kUcxOnlySend, "does not apply to the datagram transport");
    } else {
      refuse_given(send, kDgramOnlySend, "applies to the datagram transport only (--transport udp)");
      refuse_given(send, kInjectOptions, "applies to the datagram transport only (--transport udp)");
    }
  });
}

bool is_dgram_send(const SendArgs& a) {
  if (a.transport == "udp") return true;
  for (const ProtocolInfo& p : protocols()) {
    if (p.name == a.protocol) return p.engine == "dgram";
  }
  return false;
}

Status read_token_if_given(const std::string& file, std::string* token) {
  return file.empty() ? Status::ok() : read_token(file, token);
}

Status datagram_receive_options(const DgramArgs& d, DatagramReceiveOptions* o) {
  SLOTSTREAM_RETURN_IF_ERROR(parse_faults(d, &o->faults));
  o->keep_partial = d.partial == "keep";
  o->interface = d.interface;
  o->message_timeout = std::chrono::nanoseconds(int64_t(d.message_timeout_ms * 1e6));
  o->session_timeout = std::chrono::nanoseconds(int64_t(d.session_timeout_s * 1e9));
  o->max_message = d.max_message;
  return Status::ok();
}

Status check_datagram_protocol(const SendArgs& a) {
  if (!a.protocol_given) return Status::ok();  // the library's default for udp
  std::string udp;
  const std::vector<ProtocolInfo> all = protocols();
  const ProtocolInfo* chosen = nullptr;
  for (const ProtocolInfo& p : all) {
    if (p.engine == "dgram" && p.transports == std::vector<std::string>{"udp"})
      udp += "\n  " + p.name + ": " + p.summary;
    if (p.name == a.protocol) chosen = &p;
  }
  if (!chosen || chosen->engine != "dgram") {
    return {Code::kInvalidArgument,
            "--protocol " + a.protocol + " runs over UCX (--transport shm|tcp|rdma|auto); over udp:" + udp};
  }
  const std::string& want = chosen->transports.front();
  if (a.transport != want) {
    return {Code::kInvalidArgument, "--protocol " + a.protocol + " runs over " + want + ": give --transport " + want};
  }
  return Status::ok();
}

Status datagram_send_options(const DgramArgs& d, DatagramOptions* o) {
  SLOTSTREAM_RETURN_IF_ERROR(parse_faults(d, &o->faults));
  o->segment_size = d.segment_size;
  o->ttl = d.ttl;
  o->interface = d.interface;
  return Status::ok();
}

namespace {

// What the receiver's FIN_ACK said of every message: a line on stderr when not all arrived complete,
// and `--json`'s receiver object.
nlohmann::json receiver_accounting(const SenderStats& s, const std::string& protocol) {
  DeviceStats total;
  nlohmann::json per = nlohmann::json::object();
  for (const auto& [device, c] : s.delivered) {
    total.add(c);
    per[std::to_string(device)] = {{"sent", s.per_device.contains(device) ? s.per_device.at(device) : 0},
                                   {"complete", c.messages},
                                   {"partial", c.partial},
                                   {"dropped", c.dropped},
                                   {"lost", c.lost},
                                   {"valid_bytes", c.bytes}};
  }
  if (total.messages != s.messages) {
    bool unreliable_udp = false;  // UD: no retransmission below the placement
    for (const ProtocolInfo& p : protocols()) {
      if (p.name == protocol) unreliable_udp = !p.reliable && p.transports == std::vector<std::string>{"udp"};
    }
    std::fprintf(stderr,
                 "slotstream send: the receiver stored %llu of %llu messages complete (%llu partial, %llu dropped, "
                 "%llu lost)%s\n",
                 (unsigned long long)total.messages, (unsigned long long)s.messages, (unsigned long long)total.partial,
                 (unsigned long long)total.dropped, (unsigned long long)total.lost,
                 total.dropped > 0 && unreliable_udp
                     ? "; a message not complete within the receiver's --message-timeout of its first segment is "
                       "given up (UD has no retransmission: raise the timeout, or use dgram_rd)"
                     : "");
  }
  return {{"complete", total.messages}, {"partial", total.partial},   {"dropped", total.dropped},
          {"lost", total.lost},         {"valid_bytes", total.bytes}, {"devices", per}};
}

uint64_t counter_of(const SenderStats& s, const char* key) {
  auto it = s.protocol_counters.find(key);
  return it == s.protocol_counters.end() ? 0 : it->second;
}

}  // namespace

nlohmann::json datagram_send_extras(const SenderOptions& o, const SenderStats& s) {
  nlohmann::json j;
  j["segment_size"] = o.datagram.segment_size;
  j["datagrams"] = counter_of(s, "datagrams");
  j["retransmits"] = counter_of(s, "retransmits");
  j["retransmit_timeouts"] = counter_of(s, "retransmit_timeouts");
  j["credit_waits"] = counter_of(s, "credit_waits");
  j["authenticated"] = !o.token.empty();
  j["multicast"] = s.multicast;
  j["forged"] = counter_of(s, "forged");  // datagrams from the receiver's address without a right MAC, dropped
  j["injected"] = {{"loss", counter_of(s, "injected_loss")},
                   {"corrupt", counter_of(s, "injected_corrupt")},
                   {"duplicate", counter_of(s, "injected_duplicate")},
                   {"reorder", counter_of(s, "injected_reorder")}};
  return j;
}

// The receiver object of send --json (and the stderr line), once the send finished: none from a
// multicast group (each of its receivers reports its own accounting).
nlohmann::json datagram_receiver_report(const SenderStats& s, const std::string& protocol) {
  return s.multicast ? nlohmann::json() : receiver_accounting(s, protocol);
}

}  // namespace slotstream::tools
