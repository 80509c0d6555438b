#include "engine/ucx/session/capacity.h"

#include <sys/statvfs.h>
#include <unistd.h>

#include <cstdio>
#include <memory>

#include "net/control_socket.h"
#include "slotstream/slotstream.h"

namespace slotstream {

namespace session {

wire::CapacityInfo host_capacity(uint32_t senders, uint64_t backlog_bytes) {
  wire::CapacityInfo c;
  c.senders = senders;
  c.backlog_bytes = backlog_bytes;
  double load1 = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load1) != 1) load1 = 0;
    std::fclose(f);
  }
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  c.load_milli = static_cast<uint32_t>(load1 * 1000 / (cpus > 0 ? cpus : 1));
  struct statvfs vfs {};
  if (statvfs("/dev/shm", &vfs) == 0) c.shm_free_bytes = uint64_t(vfs.f_bavail) * vfs.f_frsize;
  return c;
}

}  // namespace session

Status query_capacity(const std::string& host, uint16_t port, Capacity* out) {
  std::unique_ptr<net::ControlSocket> control;
  SLOTSTREAM_RETURN_IF_ERROR(net::ControlSocket::connect(host, port, net::Millis(2000), &control));
  SLOTSTREAM_RETURN_IF_ERROR(control->send(wire::MsgType::kCapacityRequest, wire::encode_capacity_request()));
  std::vector<uint8_t> body;
  SLOTSTREAM_RETURN_IF_ERROR(control->expect(wire::MsgType::kCapacity, net::Millis(2000), &body));
  wire::CapacityInfo c;
  SLOTSTREAM_RETURN_IF_ERROR(wire::decode(body, &c));
  *out = {c.senders, c.backlog_bytes, c.load_milli / 1000.0, c.shm_free_bytes};
  return Status::ok();
}

}  // namespace slotstream
