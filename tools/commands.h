// The slotstream CLI's subcommands. Each parses nothing itself: main.cc fills the options with
// CLI11 and calls run_*; they return the process exit code (0 ok, 1 runtime error, 2 usage).
#pragma once

#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"
#include "slotstream/workers.h"

namespace slotstream::tools {

inline constexpr int kExitOk = 0;
inline constexpr int kExitError = 1;
inline constexpr int kExitUsage = 2;

// --rdma-transport / --rdma-device as the library's RdmaOptions (the values are checked by CLI11).
RdmaOptions rdma_options(const std::string& transport, const std::string& device);
// Why --rdma-* given with a --transport they do not apply to (shm, tcp) is a usage error; nullopt if fine.
std::optional<std::string> misplaced_rdma_options(const std::string& transport, const std::string& rdma_transport,
                                                  const std::string& rdma_device);
// --platform and its options (tools/platform_cli.cc, docs/platform.md), for recv, send and edge.
// How to reach a protected etcd (PlatformSecurity): every command that talks to the platform.
struct PlatformAccessArgs {
  std::string cacert, cert, key;  // PEM files: TLS
  std::string user, password_file;
};

struct PlatformArgs {
  std::string url;  // etcd://HOST:PORT[,HOST:PORT...]; empty: not on the platform
  PlatformAccessArgs access;
  int64_t ttl = 5;  // seconds a dead process's record or reservation outlives it
  // recv
  std::string name;       // the receiver's name on the platform (default HOST:PORT advertised)
  std::string advertise;  // HOST:PORT senders use (default: --listen, its port as bound)
  std::optional<double> capacity_cpu;
  std::optional<std::string> capacity_bandwidth;
  std::optional<double> capacity_fps;
  // send, edge
  double need_cpu = 0;
  std::optional<std::string> need_bandwidth;
  std::optional<double> need_fps;
  double patience = 30;  // seconds to look for a new receiver after losing one
};

struct RecvArgs {
  std::string listen;
  std::string out;
  std::string transport = "auto";
  std::string rdma_transport;  // rc, dc, ud; empty: rc
  std::string rdma_device;     // NAME:PORT; empty: any
  std::string token_file;
  uint64_t exit_after = 0;
  std::vector<std::string> holds;  // INDEX:FROM_MS:TO_MS
  bool discard = false;
  std::string worker;      // command, one per device
  std::string worker_dir;  // where workers record progress (default: --out)
  std::string worker_runtime = "process";
  std::string worker_cpus;
  std::string worker_memory;
  std::string worker_image = "localhost/slotstream:latest";
  uint64_t backlog_messages = 0;
  uint64_t backlog_bytes = 0;
  bool keep_processed = false;
  uint64_t keep = 0;                      // --keep N newest messages per device (0: all)
  std::string metrics;                    // HOST:PORT
  unsigned metrics_prune_after = 300;     // seconds an ended sender's series stay
  std::optional<std::string> max_memory;  // SIZE (default: default_max_memory())
  std::string log_format = "text";        // text or json (log.h)
  PlatformArgs platform;
};
struct DgramArgs;  // tools/dgram_cli.h: the datagram transport's options
// recv over UCX, or the datagram transport (--transport udp) with `dgram`'s options.
int run_recv(const RecvArgs& args, const DgramArgs& dgram);

struct SendArgs {
  std::string to;
  std::string name;
  bool name_given = false;  // an explicit --name, even empty, is used as given
  std::string protocol = kDefaultProtocol;
  bool protocol_given = false;  // else the transport's default (udp: write_record)
  std::string transport = "auto";
  std::string rdma_transport;  // empty: the receiver's
  std::string rdma_device;
  uint32_t blocks = kDefaultBlocks;
  uint32_t block_size = kDefaultBlockSize;
  std::string token_file;
  bool json = false;
  std::vector<std::string> files;   // D=PATH
  std::vector<std::string> dirs;    // D=DIR
  std::vector<std::string> videos;  // D=SOURCE (file, or lavfi:GRAPH for an ffmpeg test pattern)
  std::string video_size;           // WxH every video is scaled to (empty: each its own size)
  bool realtime = false;            // videos at their own frame rate
  std::string synthetic;            // D0-D1:FPS:WxHxC
  double duration = 0;
  // Seconds to wait on a receiver that says nothing (stopped or hung; SenderOptions::stall_timeout).
  double stall_timeout = 30;
  std::string log_format = "text";  // text or json (log.h)
  PlatformArgs platform;
};
// send over UCX, or the datagram transport (--transport udp, a datagram protocol) with `dgram`'s options.
int run_send(const SendArgs& args, const DgramArgs& dgram);
// send --platform: the receiver comes from the platform, and a lost one is replaced.
int run_platform_send(const SendArgs& args);

int run_verify(const std::string& dir);

// `slotstream transports [--json]`: what this host offers (host_transports()).
int run_transports(bool json, const RdmaOptions& rdma);

struct DemoArgs {
  double seconds = 10;
  uint32_t cameras = 12;
  std::string transport = "shm";
  std::string out;
  bool keep = false;
};
int run_demo(const DemoArgs& args, const std::string& self_exe);

// "INDEX:FROM_MS:TO_MS" with FROM <= TO.
bool parse_hold_spec(const std::string& text, HoldSpec* out);
// recv --hold-block, every one parsed: kExitOk, or kExitUsage after printing what is wrong.
int parse_holds(const RecvArgs& args, std::vector<HoldSpec>* holds);
// recv's per-device workers (--worker, --worker-dir; docs/workers.md), for either receiver: whether
// they are asked for; whether --discard, --out and the backlog limits agree with that (kExitOk, or
// kExitUsage after printing what is wrong); the manager that runs them.
bool uses_workers(const RecvArgs& args);
int check_sink_options(const RecvArgs& args);
std::unique_ptr<DirectoryWorkers> start_workers(const RecvArgs& args);

// Prints "slotstream <cmd>: error: <message>" to stderr.
void print_error(const char* cmd, const std::string& message);
// Prints one line and flushes; lines of different threads never interleave.
void print_line(FILE* f, const std::string& line);

// recv's shared steps: the output directory exists and is writable; SIGINT/SIGTERM blocked in
// every thread started afterwards (call before starting any) and waited for, or until done().
Status prepare_out_dir(const std::string& dir);
sigset_t block_stop_signals();
void wait_for_stop(const sigset_t& sigs, const std::function<bool()>& done);

}  // namespace slotstream::tools
