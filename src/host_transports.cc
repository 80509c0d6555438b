// `slotstream transports`: what this host offers, asked of UCX (engine/ucx/fabric/transports.h) and sysfs.
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <set>

#include "common.h"
#include "engine/ucx/fabric/transports.h"
#include "slotstream/slotstream.h"

namespace slotstream {
namespace {

// The devices UCX offers `tls` on, or empty.
std::vector<std::string> devices_of(const std::vector<fabric::UcxResource>& ucx,
                                    std::initializer_list<const char*> tls) {
  std::set<std::string> out;
  for (const auto& r : ucx) {
    for (const char* tl : tls) {
      if (r.tl == tl) out.insert(r.device);
    }
  }
  return {out.begin(), out.end()};
}

TransportInfo shm_info(const std::vector<fabric::UcxResource>& ucx) {
  TransportInfo t{"shm", false, "", {}};
  if (devices_of(ucx, {"posix", "sysv"}).empty()) {
    t.why = "UCX offers neither posix nor sysv shared memory";
    return t;
  }
  struct statvfs vfs {};
  const std::string free_shm =
      statvfs("/dev/shm", &vfs) == 0 ? format_bytes(uint64_t(vfs.f_bavail) * vfs.f_frsize) + " free in /dev/shm" : "";
  t.available = true;
  t.why = "UCX posix/sysv shared memory between processes of this host (one IPC namespace, one user)" +
          (free_shm.empty() ? std::string() : "; " + free_shm) + "; one-sided, the receiver takes no part";
  return t;
}

TransportInfo tcp_info(const std::vector<fabric::UcxResource>& ucx) {
  const auto devices = devices_of(ucx, {"tcp"});
  if (devices.empty()) return {"tcp", false, "UCX offers no tcp interface", {}};
  return {"tcp",
          true,
          "UCX tcp on " + join(devices) +
              "; no one-sided operation exists there: slotstream carries puts and gets, the receiver's CPU places "
              "every block",
          {}};
}

TransportInfo rdma_info(const std::vector<fabric::UcxResource>& ucx, const RdmaOptions& o) {
  fabric::FabricSpec spec{Transport::kRdma, o.transport.value_or(RdmaTransport::kRc), o.device};
  if (const char* env = getenv("UCX_NET_DEVICES")) spec.device = env;  // what UCX would use
  const auto sysfs = fabric::sysfs_ports();
  fabric::RdmaReport r = fabric::rdma_report(ucx, sysfs, spec);
  TransportInfo t{"rdma", r.usable, std::move(r.why), std::move(r.ports)};
  if (t.available) {
    t.why += spec.rdma == RdmaTransport::kUd ? "; ud: UCX emulates RMA, the receiver's CPU takes part"
                                             : "; one-sided in the NIC, the receiver takes no part";
  }
  return t;
}

// What udp carries is the datagram registry's (slotstream::protocols(), engine "dgram"), not a list here.
TransportInfo udp_info() {
  const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  if (fd < 0) return {"udp", false, "cannot open a UDP socket", {}};
  ::close(fd);
  std::vector<std::string> over_udp, over_tcp;
  for (const ProtocolInfo& p : protocols()) {
    if (p.engine != "dgram") continue;
    (p.transports == std::vector<std::string>{"udp"} ? over_udp : over_tcp).push_back(p.name);
  }
  std::string why = "kernel UDP sockets: RDMA over UDP datagrams (" + join(over_udp);
  if (!over_tcp.empty()) why += "; " + join(over_tcp) + " on TCP";
  return {"udp", true, why + ")", {}};
}

}  // namespace

std::vector<TransportInfo> host_transports(const RdmaOptions& rdma) {
  const auto ucx = fabric::ucx_resources();
  return {shm_info(ucx), tcp_info(ucx), rdma_info(ucx, rdma), udp_info()};
}

}  // namespace slotstream
