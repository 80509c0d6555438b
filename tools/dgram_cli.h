// `slotstream recv|send --transport udp` (and `send --transport tcp --protocol dgram_rc`): the
// datagram transport (src/dgram) behind the same commands, sources and output layout as UCX.
// main.cc adds the options and branches here; nothing else of the CLI knows about datagrams.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"

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
  CLI::Option* protocol_opt = nullptr;  // send --protocol, to tell a default from a choice
};

// Adds the datagram options to `recv` and `send`, and refuses them with the UCX transports.
void add_dgram_options(CLI::App* recv, CLI::App* send, DgramArgs* args);
// The send options name the datagram transport (--transport udp, or a datagram protocol).
bool is_dgram_send(const SendArgs& a);
// --token-file's token (read_token_file), or nothing when no file was given.
Status read_token_if_given(const std::string& file, std::string* token);
int run_dgram_recv(const RecvArgs& r, const DgramArgs& d);
int run_dgram_send(const SendArgs& s, const DgramArgs& d);

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
