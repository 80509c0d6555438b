// write_record: UD + RDMA Write-Record, the patent's operation (engine/dgram/protocol/protocol.h); rd_write_record: the
// same over RD (engine/dgram/llp/rd.h retransmits lost segments below the placement).
//
// Source: message `msn` of a device goes to STag ring[device][msn % ring] (engine/dgram/placement/tagged.h StagRings),
// its segments at tagged offset TO = their byte offset, each carrying the MSN; the last one flagged L.
// Target: TaggedTarget::write_record places each segment where it belongs, in any order, and records
// the valid bytes; a message completes with its last byte, or its timer (from its first segment)
// ends it incomplete — which the receiver may keep as a partial message (Descriptor::partial).
#pragma once

#include "engine/dgram/placement/tagged.h"
#include "engine/dgram/protocol/protocol.h"

namespace slotstream::dgram {

extern const Descriptor kWriteRecord;
extern const Descriptor kRdWriteRecord;

class WriteRecordPlacement final : public TimedPlacement<TaggedTarget> {
 public:
  explicit WriteRecordPlacement(const PlacementSpec& s);
  std::optional<Located> locate(const SegmentHeader& h, Reject* why) const override;
  Placed place(const Segment& seg, const Located& at, int64_t now_ns, std::vector<Completion>* done) override;
  std::optional<uint16_t> device_of(const Completion& c) const override { return rings_.device_of(c.key); }

 private:
  StagRings rings_;
};

}  // namespace slotstream::dgram
