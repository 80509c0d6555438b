// `slotstream bench-peer` and `slotstream bench` (see docs/bench-peer.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slotstream::tools {

struct BenchRecvArgs {
  std::string listen;
  std::string transport = "auto";
  std::string rdma_transport;
  std::string rdma_device;
  bool busy_poll = false;
  std::vector<std::string> holds;
  uint64_t sessions = 1;
  bool tcp_socket = false;
  bool round_robin = false;  // one consumer thread for every sender (ReceiverOptions::round_robin)
  // Receiver "processing": read every byte, then this many ns per byte of compute (0: read only;
  // negative: no processing).
  double process_ns_per_byte = -1;
  uint64_t trace = 0;  // record per-stage timestamps of up to this many events (engine/ucx/stream/trace.h)
  bool rate = false;   // count messages; first and last arrival only (`bench message_rate`)
};
int run_bench_recv(const BenchRecvArgs& args);

struct BenchSendArgs {
  std::string to;
  std::string name = "bench";  // distinct names let several senders share one receiver (fan-in)
  std::string transport = "auto";
  std::string rdma_transport;
  std::string rdma_device;
  std::string protocol = "status_byte";
  uint32_t blocks = 3;
  uint64_t size = 0;
  uint64_t count = 1000;
  uint32_t devices = 1;
  double fps = 0;
  uint64_t gap_us = 0;
  double seconds = 0;              // stop sending after this long (0: after --count)
  uint32_t skip_packet_every = 0;  // testing aid: SenderOptions::skip_packet_every
  uint32_t block_size = 0;         // 0: size + the block header (one message per block)
  uint64_t burst = 0;              // with compute_us: messages per burst (SDP Fig. 5)
  uint64_t compute_us = 0;         // busy computation after each burst
  bool tcp_socket = false;
  uint64_t trace = 0;  // as BenchRecvArgs::trace
  bool rate = false;   // one prepared payload, DeviceStream::send, no stamps (`bench message_rate`)
};
int run_bench_send(const BenchSendArgs& args);

// `slotstream bench ARGS...`: runs the orchestrator bench/slotstream_bench.py with this binary.
int run_bench(const std::vector<std::string>& args, const std::string& self_exe);

void print_json_line(const std::string& line);

}  // namespace slotstream::tools
