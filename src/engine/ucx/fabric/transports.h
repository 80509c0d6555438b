// What the fabric asks of UCX on each of slotstream's transports, and what this host offers.
//
// The decisions are pure functions of their inputs (a transport, the options, the environment, a
// resource list), so that they are unit-tested without a NIC (tests/engine/ucx/fabric/transports_test.cc);
// the functions that ask UCX, sysfs or the kernel only gather those inputs.
//
//   transport     UCX_TLS asked for           one-sided RMA      target must progress  peer errors
//   shm           posix,sysv,self             yes (CPU copies)   no                    none (*)
//   tcp           tcp,self                    fabric's own (SoftRma, soft_rma.h): yes  peer
//   rdma rc       rc_mlx5,rc_verbs,self       yes (the NIC)      no (set-up only)      peer
//   rdma dc       dc,self                     yes (the NIC)      no (set-up only)      peer
//   rdma ud       ud,self                     UCX emulates it    yes                   peer
//
// UCX 1.13's aliases (src/ucp/core/ucp_context.c): dc = dc_mlx5, ud_mlx5:aux; ud = ud_mlx5,
// ud_verbs. (rc = rc_mlx5, ud_mlx5:aux, rc_verbs, ud_verbs:aux: the ":aux" transports carry only
// the wire-up messages of endpoints made from a worker address, which rdma no longer uses: tcp and
// rdma endpoints connect through UCX's connection manager, cm.h.) (*) peer-failure mode would make
// UCX drop shared memory for RMA; a dead peer is noticed through the control socket instead
// (fabric.h, Liveness).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"
#include "slotstream/status.h"

namespace slotstream::fabric {

// A concrete transport as the fabric configures it: never kAuto.
struct FabricSpec {
  Transport transport = Transport::kShm;
  RdmaTransport rdma = RdmaTransport::kRc;  // rdma only
  std::string device;                       // rdma only: NAME:PORT, or empty for any
};
// "shm", "tcp", "rdma:rc", ...: the keys of ProtocolInfo::receiver_progress_on and of logs.
std::string spec_name(const FabricSpec& spec);

// How a transport behaves, for the parts of the fabric and the receiver that differ by transport
// (never the protocols).
struct TransportTraits {
  bool soft_rma = false;         // the fabric carries puts and gets itself (tcp; soft_rma.h)
  bool target_progress = false;  // RMA completes only while the target's worker is progressed
  bool peer_errors = false;      // endpoints use UCP_ERR_HANDLING_MODE_PEER
  // The target's worker must be progressed while a peer connects (rc's wire-up answers the
  // initiator from the target's worker; after that, rc's and dc's puts and gets need no target).
  bool setup_progress = false;
  bool registers_memory = false;  // memory is pinned for the NIC: the locked-memory limit applies
  // Endpoints connect through UCX's connection manager, a worker's address is its listener's ports
  // (tcp, rdma; cm.h: UCX 1.13's wire-up by worker address aborts when the peer dies during it).
  bool cm_connect = false;
};
TransportTraits traits(const FabricSpec& spec);

// One UCX setting: the environment variable a user would set, the name ucp_config_modify takes,
// the value the fabric picks.
struct UcxSetting {
  std::string env;    // "UCX_TLS"
  std::string key;    // "TLS" (a transport's own settings drop its prefix: UCX_TCP_TX_SEG_SIZE -> TX_SEG_SIZE)
  std::string value;  // "rc,self"
  // Other variables that set the same thing for some transports (UCX_UD_VERBS_ETH_DGID_CHECK for
  // UCX_UD_ETH_DGID_CHECK): one of them in the environment is the user's choice too.
  std::vector<std::string> also = {};
};
struct UcxChoice {
  std::vector<UcxSetting> apply;  // what the fabric sets
  // What the environment decides instead (a user's UCX_* wins): "UCX_TLS=rc_verbs (slotstream
  // would use rc,self)", one line each; empty when the environment changes nothing the fabric sets.
  std::vector<std::string> overridden;
};
using Getenv = std::function<const char*(const char*)>;
// The UCX configuration for `spec` under the environment `env` (::getenv in the fabric). `host_tls`:
// the UCX transports this host has (host_ucx_transports), so that rc asks only for those that
// exist (UCX warns about each one named that does not); empty: not known. Pure.
UcxChoice ucx_settings(const FabricSpec& spec, const Getenv& env, std::span<const std::string> host_tls = {});

// One UCX transport resource (uct_md_query_tl_resources) and one port from sysfs.
struct UcxResource {
  std::string tl;      // rc_mlx5, ud_verbs, tcp, posix, ...
  std::string device;  // mlx5_0:1, eth0, memory, ...
};
struct SysfsPort {
  std::string device;  // mlx5_0:1
  std::string state;   // ACTIVE, DOWN, INIT, ...
  std::string link_layer;
};
// The UCX transports that carry `kind` (its main transports, not the ":aux" ones).
std::span<const char* const> rdma_tls(RdmaTransport kind);

// What rdma needs besides a port: the RDMA connection manager (rdmacm: /dev/infiniband/rdma_cm, the
// rdma_ucm kernel module), through which its endpoints connect (cm.h). Any thread.
bool rdma_cm_available();

struct RdmaReport {
  bool usable = false;
  std::string why;              // usable: what will be used; else what is missing and what to do
  std::vector<RdmaPort> ports;  // every RDMA port UCX or sysfs knows
};
// Whether rdma of `spec.rdma` on `spec.device` (any, when empty) can run, from what UCX offers,
// what sysfs shows and whether the RDMA connection manager is there. Pure.
RdmaReport rdma_report(std::span<const UcxResource> ucx, std::span<const SysfsPort> sysfs, const FabricSpec& spec,
                       bool rdma_cm = true);

// What this host has: UCX's resources (every component, memory domain and transport resource) and
// the ports in /sys/class/infiniband. Any thread.
std::vector<UcxResource> ucx_resources();
std::vector<SysfsPort> sysfs_ports();
// The names of ucx_resources(), once per process. Any thread.
const std::vector<std::string>& host_ucx_transports();
// rdma_report over this host; cached per spec for the process (devices do not come and go under a
// running sender; `slotstream transports` asks afresh). Any thread.
const RdmaReport& host_rdma(const FabricSpec& spec);

// What UCX pins for one worker of `spec` besides the memory the fabric registers: its receive
// queues and send buffers, registered with the NIC once the worker's first endpoint connects.
// Measured on Soft-RoCE with UCX 1.13's defaults (tests/rdma, VmPin of /proc/PID/status): 47-59 MiB
// for a connected rc_verbs worker (4095 receive buffers of 8 KiB: 33 MiB alone); rc_mlx5 and dc
// post as many. 0 where nothing is pinned (shm, tcp). Pure.
uint64_t worker_pinned_bytes(const FabricSpec& spec);

// The locked-memory check for memory the NIC pins: nullopt when `needed` bytes fit under `limit`
// (RLIMIT_MEMLOCK; UINT64_MAX for unlimited) or the process may lock any amount (CAP_IPC_LOCK);
// else the message a person reads. Pure.
std::optional<std::string> memlock_shortfall(uint64_t limit, bool ipc_lock, uint64_t needed, const std::string& what);
// The same for this process: Ok, or kInvalidArgument naming the limit and the size needed. Only
// transports that register memory (traits) are checked. `needed` is everything the process will
// have pinned (fabric::pinned_estimate() + what is about to be).
Status check_memlock(const FabricSpec& spec, uint64_t needed, const std::string& what);

}  // namespace slotstream::fabric
