#include "engine/dgram/protocol/send_recv.h"

#include <algorithm>

namespace slotstream::dgram {

DeviceQueues::DeviceQueues(std::span<const uint16_t> devices) : sorted_(devices.begin(), devices.end()) {
  std::sort(sorted_.begin(), sorted_.end());
}

std::optional<uint16_t> DeviceQueues::device_of(uint32_t queue) const {
  if (queue > 0xFFFF || !std::binary_search(sorted_.begin(), sorted_.end(), uint16_t(queue))) return std::nullopt;
  return uint16_t(queue);
}

SendRecvPlacement::SendRecvPlacement(const PlacementSpec& s) : TimedPlacement(s), queues_(s.devices) {
  target_.post_all(s.ring, s.max_message);
}

std::optional<Located> SendRecvPlacement::locate(const SegmentHeader& h, Reject* why) const {
  if (h.opcode != Opcode::kSend) {
    *why = Reject::kMalformed;
    return std::nullopt;
  }
  const auto device = queues_.device_of(h.queue);
  if (!device) {
    *why = Reject::kUnknown;
    return std::nullopt;
  }
  return Located{*device, h.msn, true};
}

Placed SendRecvPlacement::place(const Segment& seg, const Located&, int64_t now_ns, std::vector<Completion>* done) {
  const SegmentHeader& h = seg.header;
  return target_.place(h.queue, h.msn, h.offset, seg.payload, h.last, now_ns, done);
}

SegmentHeader send_header(const MessageSlot& m) {
  SegmentHeader h;
  h.opcode = Opcode::kSend;
  h.queue = m.device;
  h.msn = m.msn;
  return h;
}

namespace {

std::unique_ptr<Placement> make_send_recv(const PlacementSpec& s) { return std::make_unique<SendRecvPlacement>(s); }

}  // namespace

const Descriptor kDgramSend{
    .name = "dgram_send",
    .summary = "UD Send/Recv: two-sided, whole messages or nothing",
    .service = Service::kUD,
    .data_op = Opcode::kSend,
    .make_placement = make_send_recv,
    .data_header = send_header,
};

const Descriptor kDgramRd{
    .name = "dgram_rd",
    .summary = "RD Send/Recv: reliable and in order per source over UDP",
    .service = Service::kRD,
    .data_op = Opcode::kSend,
    .reliable = true,
    .sequenced = true,
    .make_placement = make_send_recv,
    .data_header = send_header,
};

}  // namespace slotstream::dgram
