#include "dgram/protocols.h"

namespace slotstream::dgram {
namespace {

constexpr Protocol kProtocols[] = {
    {"write_record", Service::kUD, Opcode::kWriteRecord,
     "UD RDMA Write-Record: one-sided, the target records which bytes arrived (partial placement)"},
    {"dgram_send", Service::kUD, Opcode::kSend, "UD Send/Recv: two-sided, whole messages or nothing"},
    {"dgram_rd", Service::kRD, Opcode::kSend, "RD Send/Recv: reliable and in order per source over UDP"},
    {"dgram_rc", Service::kRC, Opcode::kWrite, "RC RDMA Write + Send over TCP (iWARP as standardised; the baseline)"},
};

}  // namespace

std::span<const Protocol> protocols() { return kProtocols; }

const Protocol* find_protocol(std::string_view name) {
  for (const Protocol& p : kProtocols) {
    if (name == p.name) return &p;
  }
  return nullptr;
}

}  // namespace slotstream::dgram
