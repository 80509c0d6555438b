// dgram_send and dgram_rd: Send/Recv over UD and over RD (engine/dgram/protocol/protocol.h).
//
// Source: message `msn` of a device is sent on queue number QN = the device, its segments at message
// offset MO = their byte offset, each carrying the MSN. Target: ReceiveQueues matches each message to
// one of the `ring` receives posted per device, in arrival order (engine/dgram/placement/recv_queue.h); a message
// completes with its last byte, and one whose timer fires first is dropped — Send/Recv delivers whole
// messages or nothing. Over RD every segment comes (engine/dgram/llp/rd.h), so there the timer measures silence.
#pragma once

#include <vector>

#include "engine/dgram/placement/recv_queue.h"
#include "engine/dgram/protocol/protocol.h"

namespace slotstream::dgram {

extern const Descriptor kDgramSend;
extern const Descriptor kDgramRd;

// The devices of a session, as queue numbers (QN = device): sorted, for lookups.
class DeviceQueues {
 public:
  explicit DeviceQueues(std::span<const uint16_t> devices);
  // The device a queue number names, if it is one of the session's.
  std::optional<uint16_t> device_of(uint32_t queue) const;

 private:
  std::vector<uint16_t> sorted_;
};

class SendRecvPlacement final : public TimedPlacement<ReceiveQueues> {
 public:
  explicit SendRecvPlacement(const PlacementSpec& s);
  std::optional<Located> locate(const SegmentHeader& h, Reject* why) const override;
  Placed place(const Segment& seg, const Located& at, int64_t now_ns, std::vector<Completion>* done) override;
  std::optional<uint16_t> device_of(const Completion& c) const override { return queues_.device_of(c.key); }

 private:
  DeviceQueues queues_;
};

// The untagged header of message `m`'s segments (QN = device): Send/Recv's, and RC's notification's.
SegmentHeader send_header(const MessageSlot& m);

}  // namespace slotstream::dgram
