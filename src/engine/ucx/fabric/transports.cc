#include "engine/ucx/fabric/transports.h"

#include <sys/resource.h>
#include <uct/api/uct.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "common.h"

namespace slotstream::fabric {

std::string spec_name(const FabricSpec& spec) {
  if (spec.transport != Transport::kRdma) return transport_name(spec.transport);
  return std::string("rdma:") + rdma_transport_name(spec.rdma);
}

TransportTraits traits(const FabricSpec& spec) {
  TransportTraits t;
  switch (spec.transport) {
    case Transport::kTcp:
      // UCX 1.13 emulates RMA over tcp and its target aborts when the initiator dies mid-answer:
      // the fabric carries puts and gets itself (soft_rma.h), answered by the target's worker.
      t.soft_rma = true;
      t.target_progress = true;
      t.peer_errors = true;
      t.cm_connect = true;
      break;
    case Transport::kRdma:
      // rc and dc write and read in the NIC; ud has no RMA in hardware (UCX emulates it with
      // active messages) and keeps its reliability in software (acks, retransmissions): the
      // target's worker must run for either. A connection request is accepted by the target's
      // worker (cm.h), which runs while a peer connects.
      t.target_progress = spec.rdma == RdmaTransport::kUd;
      t.peer_errors = true;
      t.setup_progress = true;
      t.registers_memory = true;
      t.cm_connect = true;
      break;
    default:  // shm: the initiator's CPU copies into the target's UCX-allocated segment
      break;
  }
  return t;
}

namespace {

std::string tls_for(const FabricSpec& spec, std::span<const std::string> host_tls) {
  switch (spec.transport) {
    case Transport::kTcp:
      return "tcp,self";
    case Transport::kRdma: {
      // "self": a sender and a receiver in one process (tests, the Python package) reach each
      // other without the NIC; between processes every lane is the NIC's.
      if (spec.rdma == RdmaTransport::kDc) return "dc,self";
      if (spec.rdma == RdmaTransport::kUd) return "ud,self";
      // rc: the rc transports this host has, without the ud ":aux" lane the "rc" alias adds for
      // wire-up by worker address: connections go through rdmacm (cm.h), and a ud lane of UCX 1.13
      // is what aborted. Where none is known, the alias (nothing to connect with anyway).
      std::string tls;
      for (const char* tl : {"rc_mlx5", "rc_verbs"}) {
        if (std::find(host_tls.begin(), host_tls.end(), tl) != host_tls.end()) tls += std::string(tl) + ",";
      }
      return tls.empty() ? "rc,self" : tls + "self";
    }
    default:
      return "posix,sysv,self";
  }
}

// UCX's tcp transport settings the fabric chooses. Over tcp every put is one active message
// carrying the block (soft_rma.h). With UCX's default 8 KiB send segments a 1 MiB block leaves in
// 129 fragments, each its own sendmsg(2), and the target reassembles them into a fresh buffer
// before the fabric copies the block into place; one segment a block (the default 1 MiB block with
// its headers) is one system call a block and one copy fewer, which is what took status_byte over
// tcp toward a plain socket (docs/benchmarks.md, "TCP at socket speed"). The receive segment is
// the target's read buffer: it must hold a whole send segment. Larger blocks still go, in several.
// Endpoints connect through the connection manager (cm.h); with one device per connection the
// manager's own exchange is the whole wire-up: no wire-up message that could be left queued.
const UcxSetting kTcpSettings[] = {
    {"UCX_TCP_TX_SEG_SIZE", "TX_SEG_SIZE", "1028K"},  // 1 MiB + 4 KiB: a block, its header, the AM's
    {"UCX_TCP_RX_SEG_SIZE", "RX_SEG_SIZE", "2056K"},  // two of them
    {"UCX_CM_USE_ALL_DEVICES", "CM_USE_ALL_DEVICES", "n"},
    // Connections through tcp's own manager: where rdmacm is there too (a host with an RDMA NIC),
    // UCX 1.13 tries it first, and it cannot take the loopback address a local peer is reached at.
    {"UCX_SOCKADDR_TLS_PRIORITY", "SOCKADDR_TLS_PRIORITY", "tcp"},
};

// rdma (docs/rdma.md; each checked on Soft-RoCE by tests/rdma):
const UcxSetting kRdmaSettings[] = {
    // Endpoints connect through rdmacm (cm.h), data lanes on the device the connection came over.
    {"UCX_SOCKADDR_TLS_PRIORITY", "SOCKADDR_TLS_PRIORITY", "rdmacm"},
    {"UCX_CM_USE_ALL_DEVICES", "CM_USE_ALL_DEVICES", "n"},
    // Strict PCIe ordering of the NIC's writes into registered memory: a status byte written after
    // its block (put, fence, put) must not land before the block's data. UCX's "auto" turns
    // relaxed ordering on where the CPU and NIC allow it (and then registers regions twice).
    {"UCX_IB_PCI_RELAXED_ORDERING", "PCI_RELAXED_ORDERING", "off"},
};

// Where a ud transport may be used (rdma over ud; dc's and the "rc" alias's ud ":aux"; a user's
// UCX_TLS): UCX 1.13's ud_verbs reads whether a packet came over IPv4 or IPv6 from a field only
// ConnectX fills (the completion's sl), so on any other NIC (Soft-RoCE, irdma, bnxt) every packet to
// an IPv4 RoCE address fails its destination check and is dropped: ud, and the wire-up over its
// ":aux" lane, never connected. Fixed upstream in UCX 1.19 (commit 7de57ad9). The check only drops
// packets addressed to another GID of the port. (Not set where no ud lane exists: UCX warns about
// a setting nothing uses.)
const UcxSetting kUdDgidCheck = {
    "UCX_UD_ETH_DGID_CHECK", "UD_ETH_DGID_CHECK", "n", {"UCX_UD_VERBS_ETH_DGID_CHECK", "UCX_UD_MLX5_ETH_DGID_CHECK"}};

// Regions UCX allocates (MemoryRegion::allocate) come from its allocators in this order, each of
// which hands out zero-filled pages that cost memory only once touched (SysV or POSIX shared
// memory, huge pages or plain mmap): UCX 1.13's default list without "heap" and "thp", which do
// neither — both are posix_memalign, the process's heap, whose memory freed before comes back with
// its old bytes ("thp" merely advises huge pages on it). A region is then zero without being cleared,
// and 1 GiB of blocks costs what is written, not 1 GiB at once (Context::zero_filled_). "thp" is
// left out: it reuses memory unzeroed, so a tcp receiver (no shared-memory allocator there) would give a
// new session a region whose status bytes the last one left "full", and deliver that data as the new
// sender's.
const UcxSetting kZeroFilledAllocators = {"UCX_ALLOC_PRIO", "ALLOC_PRIO", "md:sysv,md:posix,huge,md:*,mmap"};

}  // namespace

UcxChoice ucx_settings(const FabricSpec& spec, const Getenv& env, std::span<const std::string> host_tls) {
  const std::string tls = tls_for(spec, host_tls);
  std::vector<UcxSetting> wanted = {{"UCX_TLS", "TLS", tls}, kZeroFilledAllocators};
  if (spec.transport == Transport::kTcp) wanted.insert(wanted.end(), std::begin(kTcpSettings), std::end(kTcpSettings));
  if (spec.transport == Transport::kRdma) {
    wanted.insert(wanted.end(), std::begin(kRdmaSettings), std::end(kRdmaSettings));
    const bool user_tls = env("UCX_TLS") != nullptr;
    if (user_tls || spec.rdma != RdmaTransport::kRc || tls == "rc,self") wanted.push_back(kUdDgidCheck);
    if (!spec.device.empty()) wanted.push_back({"UCX_NET_DEVICES", "NET_DEVICES", spec.device});
  }
  UcxChoice out;
  for (UcxSetting& s : wanted) {
    const char* user = env(s.env.c_str());
    for (const std::string& other : s.also) {
      if (user == nullptr) user = env(other.c_str());
    }
    if (user == nullptr) {
      out.apply.push_back(std::move(s));
    } else if (s.value != user) {
      out.overridden.push_back(s.env + "=" + user + " from the environment (slotstream would use " + s.value + ")");
    }
  }
  return out;
}

std::span<const char* const> rdma_tls(RdmaTransport kind) {
  static constexpr std::array<const char*, 2> kRc = {"rc_mlx5", "rc_verbs"};
  static constexpr std::array<const char*, 1> kDc = {"dc_mlx5"};
  static constexpr std::array<const char*, 2> kUd = {"ud_mlx5", "ud_verbs"};
  switch (kind) {
    case RdmaTransport::kDc:
      return kDc;
    case RdmaTransport::kUd:
      return kUd;
    default:
      return kRc;
  }
}

namespace {

// UCX's IB transports: rc_verbs, rc_mlx5, dc_mlx5, ud_verbs, ud_mlx5.
bool is_rdma_tl(const std::string& tl) {
  return tl.starts_with("rc_") || tl.starts_with("dc_") || tl.starts_with("ud_");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos <= text.size();) {
    size_t comma = std::min(text.find(',', pos), text.size());
    if (comma > pos) out.push_back(text.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return out;
}

// Every RDMA port UCX or sysfs knows, sorted by name, with what each offers.
std::vector<RdmaPort> merge_ports(std::span<const UcxResource> ucx, std::span<const SysfsPort> sysfs) {
  std::map<std::string, RdmaPort> ports;
  for (const UcxResource& r : ucx) {
    if (!is_rdma_tl(r.tl)) continue;
    RdmaPort& p = ports[r.device];
    p.name = r.device;
    if (std::find(p.ucx_transports.begin(), p.ucx_transports.end(), r.tl) == p.ucx_transports.end()) {
      p.ucx_transports.push_back(r.tl);
    }
  }
  for (const SysfsPort& s : sysfs) {
    RdmaPort& p = ports[s.device];
    p.name = s.device;
    p.state = s.state;
    p.link_layer = s.link_layer;
  }
  std::vector<RdmaPort> out;
  for (auto& [name, p] : ports) {
    std::sort(p.ucx_transports.begin(), p.ucx_transports.end());
    out.push_back(std::move(p));
  }
  return out;
}

std::string describe(const RdmaPort& p) {
  std::string d = p.name;
  if (!p.state.empty() || !p.link_layer.empty()) d += " (" + join({p.state, p.link_layer}, " ") + ")";
  return d;
}

// Why no port serves `kind`: the ports looked at, and what they lack.
std::string why_not(const std::vector<const RdmaPort*>& candidates, RdmaTransport kind) {
  const std::string kind_name = rdma_transport_name(kind);
  std::vector<std::string> seen;
  bool any_ucx = false;
  for (const RdmaPort* p : candidates) {
    seen.push_back(describe(*p) +
                   (p->ucx_transports.empty() ? ": UCX offers nothing" : ": UCX offers " + join(p->ucx_transports)));
    any_ucx = any_ucx || !p->ucx_transports.empty();
  }
  std::string why = "no RDMA device offers " + kind_name + " (" + join(seen, "; ") + ")";
  if (!any_ucx) why += ": a port must be ACTIVE, and UCX must find it (libibverbs, the NIC's rdma-core provider)";
  if (any_ucx && kind == RdmaTransport::kDc) why += ": dc needs a ConnectX (mlx5) NIC; use --rdma-transport rc";
  return why;
}

}  // namespace

bool rdma_cm_available() { return access("/dev/infiniband/rdma_cm", R_OK | W_OK) == 0; }

RdmaReport rdma_report(std::span<const UcxResource> ucx, std::span<const SysfsPort> sysfs, const FabricSpec& spec,
                       bool rdma_cm) {
  RdmaReport r;
  r.ports = merge_ports(ucx, sysfs);
  if (r.ports.empty()) {
    r.why = "no RDMA device (UCX reports none and /sys/class/infiniband is empty)";
    return r;
  }
  const std::vector<std::string> wanted = split_list(spec.device);
  const bool any = wanted.empty() || (wanted.size() == 1 && wanted[0] == "all");
  std::vector<const RdmaPort*> candidates;
  for (const RdmaPort& p : r.ports) {
    if (any || std::find(wanted.begin(), wanted.end(), p.name) != wanted.end()) candidates.push_back(&p);
  }
  if (candidates.empty()) {
    std::vector<std::string> names;
    for (const RdmaPort& p : r.ports) names.push_back(p.name);
    r.why = "RDMA device " + spec.device + " not found (this host has " + join(names) + ")";
    return r;
  }
  const auto tls = rdma_tls(spec.rdma);
  std::vector<std::string> usable;
  for (const RdmaPort* p : candidates) {
    for (const std::string& tl : p->ucx_transports) {
      if (std::find(tls.begin(), tls.end(), tl) != tls.end()) {
        usable.push_back(p->name + " " + tl);
        break;
      }
    }
  }
  if (usable.empty()) {
    r.why = why_not(candidates, spec.rdma);
    return r;
  }
  if (!rdma_cm) {
    r.why =
        "no RDMA connection manager (/dev/infiniband/rdma_cm: load the rdma_ucm module), which rdma connects "
        "through (" +
        join(usable) + " are there)";
    return r;
  }
  r.usable = true;
  r.why = std::string(rdma_transport_name(spec.rdma)) + " on " + join(usable);
  return r;
}

std::vector<UcxResource> ucx_resources() {
  std::vector<UcxResource> out;
  uct_component_h* components = nullptr;
  unsigned count = 0;
  if (uct_query_components(&components, &count) != UCS_OK) return out;
  for (unsigned c = 0; c < count; ++c) {
    uct_component_attr_t attr{};
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCE_COUNT;
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    std::vector<uct_md_resource_desc_t> mds(attr.md_resource_count);
    attr.field_mask = UCT_COMPONENT_ATTR_FIELD_MD_RESOURCES;
    attr.md_resources = mds.data();
    if (uct_component_query(components[c], &attr) != UCS_OK) continue;
    for (const uct_md_resource_desc_t& md_desc : mds) {
      uct_md_config_t* config = nullptr;
      if (uct_md_config_read(components[c], nullptr, nullptr, &config) != UCS_OK) continue;
      uct_md_h md = nullptr;
      const ucs_status_t st = uct_md_open(components[c], md_desc.md_name, config, &md);
      uct_config_release(config);
      if (st != UCS_OK) continue;
      uct_tl_resource_desc_t* resources = nullptr;
      unsigned n = 0;
      if (uct_md_query_tl_resources(md, &resources, &n) == UCS_OK) {
        for (unsigned i = 0; i < n; ++i) out.push_back({resources[i].tl_name, resources[i].dev_name});
        uct_release_tl_resource_list(resources);
      }
      uct_md_close(md);
    }
  }
  uct_release_component_list(components);
  return out;
}

namespace {
std::string read_line(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}
}  // namespace

std::vector<SysfsPort> sysfs_ports() {
  namespace fs = std::filesystem;
  std::vector<SysfsPort> out;
  std::error_code ec;
  for (const auto& dev : fs::directory_iterator("/sys/class/infiniband", ec)) {
    std::error_code ec2;
    for (const auto& port : fs::directory_iterator(dev.path() / "ports", ec2)) {
      // state reads "4: ACTIVE"; link_layer "InfiniBand" or "Ethernet" (RoCE).
      std::string state = read_line(port.path() / "state");
      if (auto colon = state.find(": "); colon != std::string::npos) state = state.substr(colon + 2);
      out.push_back({dev.path().filename().string() + ":" + port.path().filename().string(), state,
                     read_line(port.path() / "link_layer")});
    }
  }
  return out;
}

const std::vector<std::string>& host_ucx_transports() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const UcxResource& r : ucx_resources()) {
      if (std::find(out.begin(), out.end(), r.tl) == out.end()) out.push_back(r.tl);
    }
    return out;
  }();
  return names;
}

const RdmaReport& host_rdma(const FabricSpec& spec) {
  static std::mutex mutex;
  static std::map<std::string, RdmaReport> cache;
  // A user's UCX_NET_DEVICES decides which devices UCX uses: judge those.
  FabricSpec effective = spec;
  if (const char* env = getenv("UCX_NET_DEVICES")) effective.device = env;
  const std::string key = spec_name(effective) + "/" + effective.device;
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) {
    const auto ucx = ucx_resources();
    const auto sysfs = sysfs_ports();
    it = cache.emplace(key, rdma_report(ucx, sysfs, effective, rdma_cm_available())).first;
  }
  return it->second;
}

uint64_t worker_pinned_bytes(const FabricSpec& spec) { return traits(spec).registers_memory ? uint64_t(64) << 20 : 0; }

std::optional<std::string> memlock_shortfall(uint64_t limit, bool ipc_lock, uint64_t needed, const std::string& what) {
  if (ipc_lock || limit >= needed) return std::nullopt;
  return "the locked-memory limit (ulimit -l) is " + format_bytes(limit) + ", but the NIC must pin " +
         format_bytes(needed) + " for " + what +
         " (UCX's own receive queues and buffers included: about 64 MiB per worker): raise it (ulimit -l unlimited; "
         "systemd LimitMEMLOCK=infinity; a container needs --ulimit memlock=-1 and the IPC_LOCK capability) or use "
         "fewer or smaller blocks";
}

namespace {
// CAP_IPC_LOCK (bit 14) in the effective set: the process may lock any amount.
bool has_ipc_lock() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with("CapEff:")) continue;
    const uint64_t caps = std::stoull(line.substr(7), nullptr, 16);
    return (caps >> 14) & 1;
  }
  return false;
}
}  // namespace

Status check_memlock(const FabricSpec& spec, uint64_t needed, const std::string& what) {
  if (!traits(spec).registers_memory) return Status::ok();
  rlimit rl{};
  if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return Status::ok();  // cannot tell: UCX will say
  const uint64_t limit = rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX : uint64_t(rl.rlim_cur);
  if (auto why = memlock_shortfall(limit, has_ipc_lock(), needed, what)) return {Code::kInvalidArgument, *why};
  return Status::ok();
}

}  // namespace slotstream::fabric
