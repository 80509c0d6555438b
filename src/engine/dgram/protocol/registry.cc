#include <array>

#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/protocol/rc_write.h"
#include "engine/dgram/protocol/send_recv.h"
#include "engine/dgram/protocol/write_record.h"
#include "engine/dgram/wire/control.h"

namespace slotstream::dgram {
namespace {
// Every datagram protocol of this build, in the order --help and the benchmark list them.
const std::array<const Descriptor*, 5> kAll = {&kWriteRecord, &kDgramSend, &kDgramRd, &kRdWriteRecord, &kDgramRc};
}  // namespace

std::span<const Descriptor* const> protocols() { return kAll; }

const Descriptor* find_protocol(std::string_view name) {
  for (const Descriptor* d : kAll) {
    if (d->name == name) return d;
  }
  return nullptr;
}

std::vector<ProtocolInfo> infos() {
  std::vector<ProtocolInfo> out;
  for (const Descriptor* d : kAll) {
    ProtocolInfo info;
    info.name = d->name;
    info.summary = d->summary;
    info.engine = "dgram";
    const std::string transport = d->over_tcp ? "tcp" : "udp";
    info.transports = {transport};
    // The kernel's sockets take every datagram (or the TCP stream): the receiver's CPU always takes part.
    info.receiver_progress = true;
    info.receiver_progress_on[transport] = true;
    info.reliable = d->reliable;
    info.partial = d->partial;
    info.one_sided = d->tagged;
    // A group cannot acknowledge: only the unreliable datagram protocols send to one (engine/dgram/recv/admission.h).
    info.multicast = !d->reliable && !d->over_tcp;
    out.push_back(std::move(info));
  }
  return out;
}

PlacementSpec placement_spec(const Descriptor& d, const Hello& h, uint32_t first_stag, int64_t message_timeout_ns,
                             int64_t reliable_timeout_ns) {
  PlacementSpec s;
  s.devices = h.devices;
  s.ring = h.ring;
  s.max_message = h.max_message;
  s.first_stag = first_stag;
  s.timeout_ns = d.reliable ? reliable_timeout_ns : message_timeout_ns;
  s.idle = d.reliable;
  return s;
}

}  // namespace slotstream::dgram
