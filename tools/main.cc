// slotstream command-line tool: thin — parses arguments, then calls the library via commands.
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <iostream>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_peer.h"
#include "cli_util.h"
#include "commands.h"
#include "dgram_cli.h"
#include "log.h"
#include "platform_cli.h"
#include "send_plan.h"

using namespace slotstream;
using namespace slotstream::tools;

namespace {

std::string protocol_help() {
  std::string s =
      "flow-control protocol, NAME or NAME:key=value,... (`slotstream protocols`; default: status_byte, "
      "write_record over udp):";
  std::string engine;
  for (const auto& p : protocols()) {
    if (p.engine != engine) {
      engine = p.engine;
      s += engine == "ucx" ? "\nover shm, tcp, rdma:" : "\nthe datagram transport (--transport udp; dgram_rc: tcp):";
    }
    s += "\n  " + p.name + ": " + p.summary;
    if (!p.options.empty()) s += "\n    options: " + p.options;
  }
  return s;
}

// Where the receiver stays passive: "shm, rdma:rc, rdma:dc" (transports where it takes no part).
std::string passive_on(const ProtocolInfo& p) {
  std::string out;
  for (const auto& [transport, progress] : p.receiver_progress_on) {
    if (!progress) out += (out.empty() ? "" : ", ") + transport;
  }
  return out.empty() ? "none" : out;
}

// The datagram engine's capabilities, for the human listing: "reliable, partial messages, one-sided".
std::string datagram_capabilities(const ProtocolInfo& p) {
  std::vector<std::string> out;
  out.push_back(p.reliable ? "reliable (every segment arrives)" : "unreliable (a lost segment loses its message)");
  if (p.partial) out.push_back("keeps partial messages");
  if (p.one_sided) out.push_back("one-sided placement");
  if (p.multicast) out.push_back("multicast");
  std::string s;
  for (const auto& c : out) s += (s.empty() ? "" : ", ") + c;
  return s;
}

// `slotstream protocols [--json]`: every protocol of both engines (slotstream::protocols()).
int run_protocols(bool json) {
  auto list = protocols(/*with_references=*/true);
  if (json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& p : list) {
      out.push_back({{"name", p.name},
                     {"summary", p.summary},
                     {"engine", p.engine},
                     {"transports", p.transports},
                     {"options", p.options},
                     {"reference", p.reference},
                     {"holds", p.holds},
                     {"connection_per_device", p.connection_per_device},
                     {"receiver_progress", p.receiver_progress},
                     {"receiver_progress_on", p.receiver_progress_on},
                     {"receiver_endpoint", p.receiver_endpoint},
                     {"sender_wakeup", p.sender_wakeup},
                     {"packs", p.packs},
                     {"reliable", p.reliable},
                     {"partial", p.partial},
                     {"one_sided", p.one_sided},
                     {"multicast", p.multicast}});
    }
    std::printf("%s\n", out.dump(1).c_str());
    return kExitOk;
  }
  for (const auto& p : list) {
    std::string transports;
    for (const auto& t : p.transports) transports += (transports.empty() ? "" : ", ") + t;
    std::printf("%s%s\n  %s\n  engine: %s, over %s\n", p.name.c_str(), p.reference ? " (benchmark reference)" : "",
                p.summary.c_str(), p.engine.c_str(), transports.c_str());
    if (!p.options.empty()) std::printf("  options: %s\n", p.options.c_str());
    if (p.engine == "ucx") {
      std::printf("  passive receiver on: %s\n", passive_on(p).c_str());
    } else {
      std::printf("  %s\n", datagram_capabilities(p).c_str());
    }
  }
  return kExitOk;
}

// The --rdma-transport and --rdma-device options of a command.
void add_rdma_options(CLI::App* app, std::string* transport, std::string* device, const char* transport_help) {
  app->add_option("--rdma-transport", *transport, transport_help)->check(CLI::IsMember({"rc", "dc", "ud"}));
  app->add_option("--rdma-device", *device,
                  "NAME:PORT: the RDMA device port to use (UCX's name, e.g. mlx5_0:1; `slotstream transports` lists "
                  "them; default: any). A UCX_NET_DEVICES in the environment wins");
}

std::string self_exe(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  buf[n] = '\0';
  return buf;
}

// recv's processing workers (docs/workers.md) and their back-pressure.
void add_recv_pipeline(CLI::App* r, RecvArgs* recv) {
  r->add_option("--worker", recv->worker,
                "COMMAND run (by /bin/sh -c) as one processing worker per device, started when its first "
                "message arrives; contract in docs/workers.md (example: workers/checksum.sh)");
  r->add_option("--worker-dir", recv->worker_dir,
                "where workers keep worker-<D>/done per sender (default: --out). Without --worker: the workers "
                "run elsewhere (e.g. Kubernetes pods) and are only watched for backlog and clean-up");
  r->add_option("--worker-runtime", recv->worker_runtime, "process (default) or podman (a container per worker)")
      ->check(CLI::IsMember({"process", "podman"}));
  r->add_option("--worker-cpus", recv->worker_cpus, "podman: CPU share per worker, e.g. 0.5")
      ->check(CLI::Range(0.001, 4096.0));
  r->add_option("--worker-memory", recv->worker_memory, "podman: memory limit per worker, e.g. 256m");
  r->add_option("--worker-image", recv->worker_image, "podman: image (build it with `make image`)")
      ->default_str("localhost/slotstream:latest");
  r->add_option("--backlog-messages", recv->backlog_messages,
                "hold blocks (back-pressure) while a device has this many unprocessed messages (udp: pause the "
                "device: UD drops its messages, dgram_rd and dgram_rc hold the sender back)");
  r->add_option("--backlog-bytes", recv->backlog_bytes,
                "SIZE: hold blocks (back-pressure) while a device has this many unprocessed bytes")
      ->transform(size_value());
  r->add_flag("--keep-processed", recv->keep_processed, "keep message files the worker has finished");
  r->add_option("--keep", recv->keep,
                "N: keep at most the N newest messages per device on disk: storing one removes the one N before "
                "it (with workers: only once its worker has finished it; an unfinished one is never removed). "
                "Default: keep every message (12 cameras of 640x480x3 at 25 fps write 16.6 GB a minute)")
      ->check(CLI::Range(uint64_t(1), uint64_t(1) << 40));
}

// `slotstream recv` and its options.
CLI::App* add_recv(CLI::App& app, RecvArgs* recv) {
  auto* r = app.add_subcommand("recv",
                               "Run a passive receiver: store every complete message as "
                               "OUT/<SENDER>/device-<D>/<SEQ>.bin, until SIGINT/SIGTERM.");
  // Required, but checked in the callback below: CLI11 would check ->required() before reading --config.
  r->add_option("--listen", recv->listen, "(required) control address HOST:PORT (port 0 picks a free one)");
  auto* out_opt = r->add_option("--out", recv->out, "output directory (created if missing)");
  auto* discard_opt =
      r->add_flag("--discard", recv->discard, "store nothing, only count complete messages (to measure the transport)");
  out_opt->excludes(discard_opt);
  r->footer(std::string("Every option can also come from a TOML file: slotstream recv --config FILE "
                        "(docs/config.md); the command line wins. ") +
            kSizeUnits + ".");
  r->callback([recv] {  // the pointer by value: this function has returned by then
    if (recv->listen.empty()) throw CLI::RequiredError("--listen");
    if (recv->out.empty() && !recv->discard) throw CLI::RequiredError("--out (or --discard)");
  });
  r->add_option("--transport", recv->transport,
                "transports senders may use: shm, tcp, rdma (one-sided over an RDMA NIC; exit 2 without a usable "
                "device) or auto (all this host has); udp: the datagram transport (its RC baseline dgram_rc on TCP "
                "at the same port)")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "rdma", "udp"}))
      ->default_str("auto");
  add_rdma_options(r, &recv->rdma_transport, &recv->rdma_device,
                   "rdma over UCX's rc (default: one-sided, the receiver takes no part), dc (ConnectX) or ud (the "
                   "receiver's CPU serves every put)");
  r->add_option("--token-file", recv->token_file,
                "require senders to prove they know this shared secret (UCX: every control message after it is "
                "signed; udp: nothing is kept for a sender before, and every datagram then carries a MAC; without "
                "it the CRC is no authentication)");
  r->add_option("--max-memory", recv->max_memory,
                "SIZE (e.g. 4G): most memory for all senders' blocks (udp: message regions) together; a sender that "
                "would pass it is refused before anything is allocated (default: a quarter of this machine's or "
                "container's memory)")
      ->transform(schema_value("max_memory"));
  r->add_option("--exit-after-senders", recv->exit_after,
                "exit after K accepted senders have ended (default 0: run until SIGINT/SIGTERM)")
      ->check(CLI::Range(uint64_t(0), uint64_t(1) << 32));
  add_recv_pipeline(r, recv);
  r->add_option("--metrics", recv->metrics,
                "serve Prometheus /metrics, /health (liveness) and /ready (readiness: listening, output "
                "writable, workers running) on HOST:PORT");
  r->add_option("--log-format", recv->log_format, "stderr log lines: text (timestamped) or json (one object a line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->default_str("text");
  r->add_option("--metrics-prune-after", recv->metrics_prune_after,
                "DURATION (seconds, or 90s, 5m, 1h) an ended sender's series stay in /metrics when it does not "
                "come back (default 300)")
      ->transform(duration_value("s"))
      ->check(CLI::Range(0u, 86400u * 365));
  add_platform_recv(r, &recv->platform);
  r->add_option("--hold-block", recv->holds,
                "INDEX:FROM_MS:TO_MS — mark receiver block INDEX (0.." + std::to_string(kMaxBlocks - 1) +
                    ") held (status 2) in that window, counted from each "
                    "sender's first data (testing and benchmarks; udp: from its session's start, message slot INDEX of "
                    "every device, MSN mod --blocks)");
  return r;
}

// `slotstream send` and its options.
CLI::App* add_send(CLI::App& app, SendArgs* send) {
  auto* s = app.add_subcommand("send", "Send files, directories or synthetic camera streams to a receiver.");
  s->footer(std::string("Prints a summary on stdout at the end (--json: one JSON object, also on failure). Ctrl-C "
                        "(SIGINT) or SIGTERM finishes cleanly: no new message, what was sent is confirmed by the "
                        "receiver, the summary, exit 130 (143); a second one abandons the stream at once. Every "
                        "option can also come from a TOML file: slotstream send --config FILE (docs/config.md); the "
                        "command line wins. ") +
            kSizeUnits + ".");
  s->add_option("--to", send->to,
                "receiver control address HOST:PORT, or a list A,B,C: the least loaded receiver is used");
  // Checked here, not with ->required(): CLI11 would check that before reading --config.
  s->callback([send] {  // the pointer by value: this function has returned by then
    if (send->to.empty() == send->platform.url.empty()) {
      throw CLI::ValidationError("--to/--platform",
                                 "give the receiver (--to) or the platform that chooses it (--platform)");
    }
  });
  s->add_option("--name", send->name, "sender name, the receiver's directory for this sender (default: host name)");
  s->add_option("--protocol", send->protocol, protocol_help())->default_str(kDefaultProtocol);
  s->add_option("--transport", send->transport,
                "shm, tcp, rdma, or auto (shm when both ends share a host and its shared memory, else rdma when both "
                "have a usable RDMA device, else tcp; said on stderr with the reason); udp: the datagram transport")
      ->check(CLI::IsMember({"auto", "shm", "tcp", "rdma", "udp"}))
      ->default_str("auto");
  add_rdma_options(s, &send->rdma_transport, &send->rdma_device,
                   "rc, dc or ud (default: whichever the receiver serves; a receiver serving another refuses)");
  s->add_option("--blocks", send->blocks,
                "number of blocks N, 1.." + std::to_string(kMaxBlocks) +
                    " (default 32: >2 frames in flight per camera for 12 cameras)")
      ->check(schema_value("blocks"))
      ->default_str(std::to_string(kDefaultBlocks));
  s->add_option("--block-size", send->block_size,
                "SIZE per block incl. its 16-byte header, e.g. 64K or 1M, 64 B..64M (default 1M: one 640x480x3 "
                "frame per block)")
      ->transform(schema_value("block_size"))
      ->default_str("1M");
  s->add_option("--token-file", send->token_file,
                "shared secret the receiver asks for (the receiver must prove it too; UCX: control messages are then "
                "signed; udp: every datagram carries a MAC)");
  s->add_flag("--json", send->json,
              "print one JSON object on stdout instead of the human summary, also when the send fails "
              "(ok, exit_code, error, ...: docs/cli-contract.md)");
  s->add_option("--file", send->files, "D=PATH: the file is one message of device D (repeatable, in order)");
  s->add_option("--dir", send->dirs, "D=DIR: each regular file in DIR, sorted by name, is one message of device D");
  s->add_option("--video", send->videos,
                "D=SOURCE: decode a video file (or lavfi:GRAPH, an ffmpeg test pattern such as "
                "lavfi:testsrc=size=640x480:rate=25:duration=4) with ffmpeg into raw RGB frames (W x H x 3 bytes) "
                "of the source's own size (ffprobe; or --video-size), one message per frame (repeatable); "
                "stderr says the size of each");
  s->add_option("--video-size", send->video_size,
                "WxH: scale every --video to this size (e.g. 640x480; default: each keeps its own)");
  s->add_flag("--realtime", send->realtime, "send videos at their own frame rate (default: as fast as possible)");
  s->add_option("--synthetic", send->synthetic,
                "D0-D1:FPS:WxHxC — synthetic cameras D0..D1, one verifiable WxHxC-byte frame per 1/FPS s");
  s->add_option("--duration", send->duration,
                "DURATION of synthetic frames (seconds, or 90s, 5m, 1h), wall-clock: frames the sender cannot produce "
                "in time are counted as "
                "late and skipped, never queued (send --json: late_frames)")
      ->transform(duration_value("s"));
  add_stall_timeout(s, &send->stall_timeout);
  s->add_option("--log-format", send->log_format, "stderr log lines: text (timestamped) or json (one object a line)")
      ->check(CLI::IsMember({"text", "json"}))
      ->default_str("text");
  add_platform_send(s, &send->platform);
  return s;
}

// `slotstream bench-peer recv|send` (hidden): the measuring processes of `slotstream bench`.
void add_bench_peer(CLI::App& app, BenchRecvArgs* brecv, BenchSendArgs* bsend, CLI::App** recv_peer,
                    CLI::App** send_peer) {
  auto* bp = app.add_subcommand("bench-peer",
                                "A measuring process for `slotstream bench` (docs/bench-peer.md); "
                                "not meant to be run by hand.");
  bp->group("");  // hidden from the top-level help
  bp->require_subcommand(1);
  auto* bpr = bp->add_subcommand("recv", "receiver peer: discards data, prints one JSON line per sender");
  bpr->add_option("--listen", brecv->listen, "HOST:PORT")->required();
  bpr->add_option("--transport", brecv->transport)->check(CLI::IsMember({"auto", "shm", "tcp", "rdma"}));
  add_rdma_options(bpr, &brecv->rdma_transport, &brecv->rdma_device, "rc, dc or ud");
  bpr->add_flag("--busy-poll", brecv->busy_poll, "never sleep when idle");
  bpr->add_option("--hold-block", brecv->holds, "INDEX:FROM_MS:TO_MS");
  bpr->add_option("--sessions", brecv->sessions, "exit after K senders")->check(CLI::PositiveNumber);
  bpr->add_flag("--tcp-socket", brecv->tcp_socket, "plain TCP reference instead of slotstream");
  bpr->add_flag("--round-robin", brecv->round_robin, "one consumer thread serves every sender in turn");
  bpr->add_option("--process-ns-per-byte", brecv->process_ns_per_byte,
                  "processing: read every byte, then spin this many ns per byte")
      ->check(CLI::NonNegativeNumber);
  bpr->add_option("--trace", brecv->trace, "record when each packet was polled and delivered (up to N events)");
  bpr->add_flag("--rate", brecv->rate,
                "message-rate mode: count messages, keep only the first and the last arrival time (no per-message "
                "record)");
  auto* bps = bp->add_subcommand("send", "sender peer: sends COUNT messages of SIZE bytes, prints one JSON line");
  bps->add_option("--to", bsend->to, "HOST:PORT")->required();
  bps->add_option("--name", bsend->name, "sender name (default bench)");
  bps->add_option("--transport", bsend->transport)->check(CLI::IsMember({"auto", "shm", "tcp", "rdma"}));
  add_rdma_options(bps, &bsend->rdma_transport, &bsend->rdma_device, "rc, dc or ud");
  bps->add_option("--protocol", bsend->protocol);
  bps->add_option("--blocks", bsend->blocks)->check(CLI::Range(1u, kMaxBlocks));
  bps->add_option("--size", bsend->size, "payload bytes per message (block size SIZE + 16 unless --block-size)")
      ->transform(size_value())
      ->required();
  bps->add_option("--count", bsend->count, "messages per device");
  bps->add_option("--devices", bsend->devices);
  bps->add_option("--fps", bsend->fps, "messages per second per device (default: back to back)");
  bps->add_option("--gap-us", bsend->gap_us, "pause after each message");
  bps->add_option("--seconds", bsend->seconds, "stop after this long (--count is then an upper bound)")
      ->transform(duration_value("s"));
  bps->add_option("--skip-packet-every", bsend->skip_packet_every,
                  "testing aid: leave out one packet number after every N (the receiver must report gaps)");
  bps->add_option("--block-size", bsend->block_size, "block size (default SIZE + 16: one message per block)")
      ->transform(size_value(kMinBlockSize, kMaxBlockSize));
  bps->add_option("--burst", bsend->burst, "messages per burst (with --compute-us)");
  bps->add_option("--compute-us", bsend->compute_us, "busy computation after each burst (SDP Fig. 5)");
  bps->add_flag("--tcp-socket", bsend->tcp_socket, "plain TCP reference instead of slotstream");
  bps->add_option("--trace", bsend->trace, "record when each packet was committed and posted (up to N events)");
  bps->add_flag("--rate", bsend->rate,
                "message-rate mode: send one prepared payload with DeviceStream::send, no per-message time stamp");
  *recv_peer = bpr;
  *send_peer = bps;
}

// Every command's arguments and its subcommand (null until added).
struct Commands {
  RecvArgs recv;
  SendArgs send;
  DgramArgs dgram;
  bool protocols_json = false;
  bool transports_json = false;
  std::string transports_rdma, transports_device;
  std::string verify_dir;
  DemoArgs demo;
  BenchRecvArgs brecv;
  BenchSendArgs bsend;
  PlatformStatusArgs pstatus;
  EdgeArgs edge;
  DgramPeerArgs dpeer;
  CLI::App *r = nullptr, *s = nullptr, *pl = nullptr, *tl = nullptr, *v = nullptr, *d = nullptr, *bpr = nullptr,
           *bps = nullptr, *ps = nullptr, *e = nullptr, *dp = nullptr, *b = nullptr;
};

void add_listing_commands(CLI::App& app, Commands* c) {
  c->pl = app.add_subcommand("protocols",
                             "List the protocols of this build, both engines': the block protocols over UCX (shm, "
                             "tcp, rdma), their options and the benchmark references, and the datagram transport's "
                             "(udp), each with its engine, transports and capabilities.");
  c->pl->add_flag("--json", c->protocols_json, "one JSON array (what `slotstream bench` reads)");
  c->tl = app.add_subcommand("transports",
                             "What this host offers: shm, tcp, rdma (its devices, ports, state, link layer and the "
                             "UCX transports on each, asked of UCX), udp — each available or not, and why.");
  c->tl->add_flag("--json", c->transports_json, "one JSON array");
  add_rdma_options(c->tl, &c->transports_rdma, &c->transports_device, "judge rdma for rc (default), dc or ud");
  c->v = app.add_subcommand("verify", "Check every received synthetic frame under DIR (content and order).");
  c->v->add_option("DIR", c->verify_dir, "receiver output directory (or a sender's subdirectory)")->required();
}

void add_demo_and_bench_peer(CLI::App& app, Commands* c) {
  DemoArgs& demo = c->demo;
  c->d = app.add_subcommand("demo",
                            "Start a receiver, stream synthetic 640x480x3 cameras at 25 fps into it, "
                            "verify every frame and print a summary.");
  c->d->add_option("--duration,--seconds", demo.seconds, "DURATION to stream (seconds, or 90s, 2m; as send --duration)")
      ->transform(duration_value("s"))
      ->default_str("10");
  c->d->add_option("--cameras", demo.cameras, "number of cameras")->default_str("12");
  c->d->add_option("--transport", demo.transport, "shm or tcp")
      ->check(CLI::IsMember({"shm", "tcp"}))
      ->default_str("shm");
  c->d->add_option("--out", demo.out, "output directory (default: a fresh temporary directory, removed afterwards)");
  c->d->add_flag("--keep", demo.keep, "keep the received frames");
  add_bench_peer(app, &c->brecv, &c->bsend, &c->bpr, &c->bps);
}

void add_bench(CLI::App& app, Commands* c) {
  c->b = app.add_subcommand("bench",
                            "Run the paper's experiments (sync_latency, latency, throughput, cpu, "
                            "resources, held_block, cameras; the SDP paper's small_messages, progress; all) side by "
                            "side with raw UCX and TCP; "
                            "`slotstream bench --help` for the options.");
  c->b->prefix_command();  // everything after `bench` goes to the orchestrator
  c->b->set_help_flag();
  c->b->allow_extras();
}

void add_commands(CLI::App& app, Commands* c) {
  c->r = add_recv(app, &c->recv);
  c->s = add_send(app, &c->send);
  add_dgram_options(c->r, c->s, &c->dgram);
  add_config_option(app, {c->r, c->s});
  add_listing_commands(app, c);
  add_demo_and_bench_peer(app, c);
  c->ps = add_platform_status(app, &c->pstatus);
  c->e = add_edge(app, &c->edge);
  c->dp = add_dgram_peer(app, &c->dpeer);
  add_bench(app, c);
}

// recv and send, over UCX or the datagram transport (the library's Receiver and Sender), or the platform.
int run_stream_command(Commands& c) {
  if ((*c.r && c.recv.transport == "udp" && !c.recv.platform.url.empty()) ||
      (*c.s && is_dgram_send(c.send) && !c.send.platform.url.empty())) {
    print_error(*c.r ? "recv" : "send",
                "--platform serves UCX transports (shm, tcp); the datagram transport is not on it");
    return kExitUsage;
  }
  if (*c.r) {
    setup_logging("slotstream recv", c.recv.log_format);
    return run_recv(c.recv, c.dgram);
  }
  setup_logging("slotstream send", c.send.log_format);
  c.send.name_given = c.s->count("--name") > 0;
  c.send.protocol_given = c.s->count("--protocol") > 0;
  if (!c.send.platform.url.empty()) return run_platform_send(c.send);
  return run_send(c.send, c.dgram);
}

int run_command(Commands& c, const char* argv0) {
  if (*c.r || *c.s) return run_stream_command(c);
  if (*c.ps) return run_platform_status(c.pstatus);
  if (*c.e) {
    setup_logging("slotstream edge", "text");  // warnings (late synthetic frames) on stderr, as send's
    return run_edge(c.edge);
  }
  if (*c.dp) return run_dgram_peer(c.dp, c.dpeer);
  if (*c.v) return run_verify(c.verify_dir);
  if (*c.pl) return run_protocols(c.protocols_json);
  if (*c.tl) return run_transports(c.transports_json, rdma_options(c.transports_rdma, c.transports_device));
  if (*c.d) return run_demo(c.demo, self_exe(argv0));
  if (*c.bpr) return run_bench_recv(c.brecv);
  if (*c.bps) return run_bench_send(c.bsend);
  if (*c.b) return run_bench(c.b->remaining(), self_exe(argv0));
  return kExitUsage;
}

// A command line (or --config file) CLI11 refused: its message, with the closest command, flag or
// config key when one was mistyped; `send --json` also gets the error as its JSON object on stdout.
int parse_failed(CLI::App& app, const std::vector<std::string>& args, const CLI::ParseError& e) {
  const std::string hint = suggest_flags(app, args, e);
  if (e.get_name() == "RequiredError" && !hint.empty()) {  // an unknown command: CLI11 says only "required"
    std::fputs(("slotstream: error: " + hint).c_str(), stderr);
    return kExitUsage;
  }
  if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
  const auto named = std::find_if(args.begin(), args.end(), [](const std::string& a) { return !a.starts_with("-"); });
  const bool send = named != args.end() && *named == "send";
  if (std::string key = unknown_config_key(app, args, e); !key.empty()) {
    std::fprintf(stderr, "slotstream%s%s: error: %s\n", named == args.end() ? "" : " ",
                 named == args.end() ? "" : named->c_str(), key.c_str());
  } else {
    app.exit(e);
    std::fputs(hint.c_str(), stderr);
  }
  if (send && std::find(args.begin(), args.end(), "--json") != args.end()) {
    print_send_error_json({Code::kInvalidArgument, e.what()}, kExitUsage);
  }
  return kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  spdlog::set_level(spdlog::level::warn);
  CLI::App app{
      "slotstream — stream many devices' data over one one-sided RDMA connection (UCX: shared memory, "
      "InfiniBand/RoCE rc/dc/ud, tcp) with the status-byte-assisted transmission mechanism."};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("slotstream ") + version());
  Commands commands;
  add_commands(app, &commands);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return parse_failed(app, std::vector<std::string>(argv + 1, argv + argc), e);
  }
  apply_config_flags({commands.r, commands.s});
  return run_command(commands, argv[0]);
}
