// dgram_rc: RC + RDMA Write, then a Send that says the data is there — the same RDMAP over a TCP
// stream (iWARP as standardised), the patent's comparison point (engine/dgram/protocol/protocol.h).
//
// Source: message `msn` of a device is written to STag ring[device][msn % ring] (no MSN on the Writes;
// the stream orders them), then a Send on QN = the device with the MSN and a 12-byte payload, the
// written notice: u32 STag | u64 length (little-endian) — "completing a send/recv operation after the
// successful RDMA Write" (patent, "RDMA Write Over Datagrams"). Target: the Writes are placed and
// recorded for no one; the notice hands the region's first `length` bytes over as message MSN.
#pragma once

#include "engine/dgram/placement/tagged.h"
#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/protocol/send_recv.h"

namespace slotstream::dgram {

extern const Descriptor kDgramRc;

struct WrittenNotice {
  uint32_t stag = 0;
  uint64_t length = 0;
};
inline constexpr size_t kWrittenNoticeSize = 12;
std::vector<std::byte> encode_notice(const WrittenNotice& n);
std::optional<WrittenNotice> decode_notice(std::span<const std::byte> payload);

class RcWritePlacement final : public TimedPlacement<TaggedTarget> {
 public:
  explicit RcWritePlacement(const PlacementSpec& s);
  // A Write: its device by STag, not ordered; the notice: its device by QN, ordered.
  std::optional<Located> locate(const SegmentHeader& h, Reject* why) const override;
  Placed place(const Segment& seg, const Located& at, int64_t now_ns, std::vector<Completion>* done) override;
  // A message is the notice's; what expires was written but never notified, and names none.
  std::optional<uint16_t> device_of(const Completion& c) const override;

 private:
  Placed take_notified(const Segment& seg, const Located& at, int64_t now_ns, std::vector<Completion>* done);

  StagRings rings_;
  DeviceQueues queues_;
};

}  // namespace slotstream::dgram
