// What `slotstream recv|send --transport udp` (and `send --transport tcp --protocol dgram_rc`) add to the
// commands: the datagram transport's options, refused with the UCX transports, turned into the library's
// DatagramOptions / DatagramReceiveOptions; and what recv and send print of it (the receiver's line per
// sender, its /metrics families, send --json's datagram fields). recv and send run it through the
// library's Receiver and Sender like every transport (tools/recv.cc, tools/send.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "metrics.h"

namespace slotstream::tools {

struct DgramArgs {
  // recv
  std::string partial = "drop";
  double message_timeout_ms = 200;
  double session_timeout_s = 30;
  uint64_t max_message = 64ull << 20;
  std::string interface;  // both: where a multicast group is joined (recv) or sent out of (send)
  // send
  uint32_t segment_size = 8192;
  int ttl = 0;  // a multicast group's hop limit (0: not given, 1)
  // both ends: faults on the datagrams this end sends (send) or receives (recv)
  std::string inject_loss, inject_reorder, inject_duplicate, inject_corrupt;
  uint64_t inject_seed = 1;
};

// Adds the datagram options to `recv` and `send`, and refuses them with the UCX transports.
void add_dgram_options(CLI::App* recv, CLI::App* send, DgramArgs* args);
// The send options name the datagram transport (--transport udp, or a datagram protocol).
bool is_dgram_send(const SendArgs& a);
// --token-file's token (read_token_file), or nothing when no file was given.
Status read_token_if_given(const std::string& file, std::string* token);

// recv --transport udp: --partial, the timers, --max-message, --interface and --inject-* as the library's.
Status datagram_receive_options(const DgramArgs& d, DatagramReceiveOptions* o);
// send --transport udp: --protocol names a datagram protocol and --transport the one it runs over (said
// with the flags; the library checks the same).
Status check_datagram_protocol(const SendArgs& a);
// send --transport udp: --segment-size, --ttl, --interface and --inject-* as the library's (max_message
// is the largest message of what is sent: the caller's).
Status datagram_send_options(const DgramArgs& d, DatagramOptions* o);

// recv --transport udp's line for an ended sender: the block receiver's (docs/cli-contract.md) with the
// datagram counters after it.
std::string datagram_session_line(const SessionReport& r);
// Its /metrics: the families every receiver has, the datagram ones, and the receiver's own counters
// (Receiver::counters()).
ExtraFamilies datagram_families();
std::vector<prometheus::MetricFamily> collect_datagram_metrics(const Receiver& rx, MetricsState& state,
                                                               const DirectoryWorkers* workers);

// What the datagram transport adds to `send --json` (docs/cli-contract.md).
nlohmann::json datagram_send_extras(const SenderOptions& o, const SenderStats& s);
// send --json's receiver object once the send finished (and the stderr line when not every message was
// stored complete); null for a multicast group, whose receivers each account on their own.
nlohmann::json datagram_receiver_report(const SenderStats& s, const std::string& protocol);

// The hidden `slotstream dgram-peer recv|send`: measuring processes for `slotstream bench`
// experiments datagram/loss (tools/dgram_peer.cc; docs/bench-peer.md).
struct DgramPeerArgs {
  std::string listen, to, protocol = "write_record", transport = "udp";
  uint64_t size = 1024, count = 100;
  uint32_t segment_size = 8192, ring = 32;
  double gap_us = 0, max_seconds = 60;
  uint64_t sessions = 1;
  std::string token_file;  // both: authenticated sessions (the MAC's cost, measured)
  DgramArgs faults;        // --partial, --inject-*
};
CLI::App* add_dgram_peer(CLI::App& app, DgramPeerArgs* args);
int run_dgram_peer(const CLI::App* peer, const DgramPeerArgs& args);

}  // namespace slotstream::tools
