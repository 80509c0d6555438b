// `slotstream dgram-peer recv|send`: the measuring processes of the benchmark's datagram
// experiments (bench/dgram_experiments.py, docs/bench-peer.md). Like bench-peer, each prints JSON
// lines and nothing is stored: the receiver times every message at the moment the stack finished
// it (complete, or its timer fired), and the sender writes its CLOCK_MONOTONIC send time into the
// first 8 bytes of every message (both ends run on one host, so the clocks agree).
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "dgram_cli.h"
#include "send_plan.h"
#include "slotstream/datagram_probe.h"
#include "slotstream/instruments.h"

namespace slotstream::tools {
namespace {

long peak_rss_kb() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_maxrss;
}

// What both roles take alike: injected loss and the token; false (reported) when malformed.
bool peer_common_options(const DgramPeerArgs& a, DatagramFaults* inject, std::string* token) {
  if (!a.faults.inject_loss.empty()) {
    if (auto fraction = parse_percent(a.faults.inject_loss)) {
      inject->loss = *fraction;
    } else {
      print_error("dgram-peer", "--inject-loss expects a percentage");
      return false;
    }
  }
  inject->seed = a.faults.inject_seed;
  if (Status st = read_token_if_given(a.token_file, token); !st.is_ok()) {
    print_error("dgram-peer", st.message());
    return false;
  }
  return true;
}

// One line of JSON per ended session: the receiver's counts and the probe's times.
nlohmann::json peer_session_json(const SessionReport& r, const DatagramProbeTimes& x, double cpu_seconds_used) {
  nlohmann::json j;
  DeviceStats t;
  for (const auto& [_, s] : r.per_device) t.add(s);
  auto counter = [&r](const std::string& key) {
    auto it = r.protocol_counters.find(key);
    return it == r.protocol_counters.end() ? uint64_t(0) : it->second;
  };
  j["name"] = r.sender.name;
  j["protocol"] = r.sender.protocol;
  j["finished"] = r.finished;
  j["reason"] = r.reason;
  j["sent"] = counter("sent");
  j["bytes_sent"] = counter("bytes_sent");
  j["complete"] = t.messages;
  j["partial"] = t.partial;
  j["dropped"] = t.dropped;
  j["lost"] = t.lost;
  j["retired"] = counter("retired");
  j["valid_bytes"] = t.bytes;
  j["datagrams"] = counter("datagrams");
  j["crc_errors"] = counter("crc_errors");
  j["seconds"] = r.seconds;
  j["cpu_seconds"] = cpu_seconds_used;
  j["peak_rss_kb"] = peak_rss_kb();
  j["first_ns"] = x.first_ns;
  j["arrivals_ns"] = x.arrivals_ns;
  j["latencies_ns"] = x.latencies_ns;
  return j;
}

int run_peer_recv(const DgramPeerArgs& a) {
  DatagramProbeReceiverOptions o;
  if (Status st = parse_address(a.listen, &o.host, &o.port); !st.is_ok()) {
    print_error("dgram-peer", st.message());
    return kExitUsage;
  }
  o.keep_partial = a.faults.partial == "keep";
  o.message_timeout = std::chrono::nanoseconds(int64_t(a.faults.message_timeout_ms * 1e6));
  o.session_timeout = std::chrono::seconds(10);
  if (!peer_common_options(a, &o.faults, &o.token)) return kExitUsage;
  const double cpu0 = cpu_seconds();
  // Both callbacks run on the probe's callback thread, in order, never on its network thread: a report of
  // thousands of messages (their times) is more than a pipe holds, and bench/harness.py reads our stdout only
  // once the sender has exited. While this write waits for that reader, the network thread still repeats a
  // FIN_ACK lost on the way and serves the next sender; the reports after it wait their turn.
  o.on_session_end = [cpu0](const SessionReport& r, const DatagramProbeTimes& x) {
    print_line(stdout, peer_session_json(r, x, cpu_seconds() - cpu0).dump());
  };
  o.on_event = [](const std::string& text) { print_line(stderr, "dgram-peer recv: " + text); };
  const sigset_t sigs = block_stop_signals();
  std::unique_ptr<DatagramProbeReceiver> rx;
  if (Status st = DatagramProbeReceiver::start(std::move(o), &rx); !st.is_ok()) {
    print_error("dgram-peer", st.to_string());
    return kExitError;
  }
  print_line(stdout, "listening on " + rx->listen_address());
  // Linger while FINs are repeated (a lost FIN_ACK): see DatagramProbeReceiver::since_last_fin_ack.
  // sessions_ended() counts a sender once its report is written.
  wait_for_stop(
      sigs, [&] { return rx->sessions_ended() >= a.sessions && rx->since_last_fin_ack() > std::chrono::seconds(1); });
  rx->stop();  // writes the reports of the sessions it ended before it returns
  return kExitOk;
}

// --count messages of --size bytes, each starting with its send time, --gap-us apart, for at most
// --max-seconds from t0; their send times in *sends.
Status send_stamped(const DgramPeerArgs& a, DatagramProbeSender& tx, int64_t t0, std::vector<int64_t>* sends) {
  std::vector<std::byte> msg(a.size);
  for (size_t i = 8; i < msg.size(); ++i) msg[i] = std::byte(i * 131);
  sends->reserve(a.count);
  const int64_t stop = t0 + int64_t(a.max_seconds * 1e9);
  for (uint64_t i = 0; i < a.count; ++i) {
    const int64_t now = monotonic_ns();
    if (now > stop) break;
    std::memcpy(msg.data(), &now, 8);
    sends->push_back(now);
    SLOTSTREAM_RETURN_IF_ERROR(tx.send(msg));
    if (a.gap_us > 0) {
      // Sleep most of the gap, spin the rest: one message in flight at a time, no drift.
      const int64_t until = now + int64_t(a.gap_us * 1000);
      if (until - monotonic_ns() > 200'000)
        std::this_thread::sleep_for(std::chrono::nanoseconds(until - monotonic_ns() - 100'000));
      while (monotonic_ns() < until) {
      }
    }
  }
  return Status::ok();
}

int run_peer_send(const DgramPeerArgs& a) {
  DatagramProbeSenderOptions o;
  if (Status st = parse_address(a.to, &o.host, &o.port); !st.is_ok()) {
    print_error("dgram-peer", st.message());
    return kExitUsage;
  }
  if (a.size < 8) {
    print_error("dgram-peer", "--size must be at least 8 (the send time stamp)");
    return kExitUsage;
  }
  if (!peer_common_options(a, &o.faults, &o.token)) return kExitUsage;
  o.name = "peer";
  o.protocol = a.protocol;
  o.slots = a.ring;
  o.segment_size = a.segment_size;
  o.max_message = a.size;
  o.finish_timeout = std::chrono::nanoseconds(int64_t((a.max_seconds + 30) * 1e9));
  std::unique_ptr<DatagramProbeSender> tx;
  if (Status st = DatagramProbeSender::connect(o, &tx); !st.is_ok()) {
    print_error("dgram-peer", st.message());
    return kExitError;
  }
  std::vector<int64_t> sends;
  const double cpu0 = cpu_seconds();
  const int64_t t0 = monotonic_ns();
  if (Status st = send_stamped(a, *tx, t0, &sends); !st.is_ok()) {
    print_error("dgram-peer", st.message());
    return kExitError;
  }
  const int64_t t_sent = monotonic_ns();
  if (Status st = tx->finish(); !st.is_ok()) {
    print_error("dgram-peer", st.message());
    return kExitError;
  }
  const auto s = tx->stats();
  nlohmann::json j;
  j["messages"] = s.messages;
  j["bytes"] = s.bytes;
  j["seconds"] = double(monotonic_ns() - t0) / 1e9;
  j["send_seconds"] = double(t_sent - t0) / 1e9;
  j["cpu_seconds"] = cpu_seconds() - cpu0;
  j["datagrams"] = s.datagrams;
  j["retransmits"] = s.retransmits;
  j["credit_waits"] = s.credit_waits;
  j["send_times_ns"] = sends;
  j["peak_rss_kb"] = peak_rss_kb();
  std::printf("%s\n", j.dump().c_str());
  return kExitOk;
}

}  // namespace

CLI::App* add_dgram_peer(CLI::App& app, DgramPeerArgs* a) {
  auto* peer =
      app.add_subcommand("dgram-peer", "Measuring processes for the datagram experiments of `slotstream bench`.");
  peer->group("");  // hidden
  peer->require_subcommand(1);
  auto* r = peer->add_subcommand("recv", "prints `listening on`, then one JSON line per sender");
  r->add_option("--listen", a->listen, "HOST:PORT")->required();
  r->add_option("--partial", a->faults.partial)->check(CLI::IsMember({"keep", "drop"}));
  r->add_option("--message-timeout", a->faults.message_timeout_ms, "ms");
  r->add_option("--inject-loss", a->faults.inject_loss, "percent");
  r->add_option("--inject-seed", a->faults.inject_seed);
  r->add_option("--sessions", a->sessions, "exit after K senders")->check(CLI::PositiveNumber);
  r->add_option("--token-file", a->token_file, "senders must prove this secret; every datagram carries a MAC");
  auto* s = peer->add_subcommand("send", "sends COUNT messages of SIZE bytes, prints one JSON line");
  s->add_option("--to", a->to, "HOST:PORT")->required();
  s->add_option("--protocol", a->protocol);
  s->add_option("--size", a->size, "SIZE: bytes per message")->transform(size_value())->required();
  s->add_option("--count", a->count);
  s->add_option("--segment-size", a->segment_size, "SIZE: payload bytes per datagram")->transform(size_value());
  s->add_option("--blocks", a->ring, "STags / posted receives per device");
  s->add_option("--gap-us", a->gap_us, "pause after each message");
  s->add_option("--max-seconds", a->max_seconds, "stop sending after this long")->transform(duration_value("s"));
  s->add_option("--inject-loss", a->faults.inject_loss, "percent");
  s->add_option("--inject-seed", a->faults.inject_seed);
  s->add_option("--token-file", a->token_file, "authenticate: every datagram carries a MAC");
  return peer;
}

int run_dgram_peer(const CLI::App* peer, const DgramPeerArgs& a) {
  if (peer->got_subcommand("recv")) return run_peer_recv(a);
  return run_peer_send(a);
}

}  // namespace slotstream::tools
