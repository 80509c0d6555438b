#include <array>

#include "dgram/control.h"
#include "dgram/protocol.h"
#include "dgram/rc_write.h"
#include "dgram/send_recv.h"
#include "dgram/write_record.h"

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
