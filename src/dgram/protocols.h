// The datagram transport's protocols, as the CLI and the benchmark name them: each is one
// (service, operation) pair of the patent's stack.
//
//   write_record  UD + RDMA Write-Record: one-sided, unreliable, partial placement (the patent's operation)
//   dgram_send    UD + Send/Recv: two-sided, unreliable, whole messages only
//   dgram_rd      RD + Send/Recv: reliable, in order per source (sequence, ack, credits, retransmission)
//   dgram_rc      RC + RDMA Write, then a Send that says it is there: the same RDMAP over a TCP
//                 stream (iWARP as standardised), the patent's comparison point
#pragma once

#include <span>
#include <string_view>

#include "dgram/wire.h"

namespace slotstream::dgram {

struct Protocol {
  const char* name;
  Service service;
  Opcode data_op;  // how message bytes travel (kWriteRecord, kSend or kWrite)
  const char* summary;
  bool over_tcp() const { return service == Service::kRC; }
};

std::span<const Protocol> protocols();
const Protocol* find_protocol(std::string_view name);
inline constexpr const char* kDefaultProtocol = "write_record";

}  // namespace slotstream::dgram
