#include "engine/dgram/protocol/write_record.h"

namespace slotstream::dgram {

WriteRecordPlacement::WriteRecordPlacement(const PlacementSpec& s)
    : TimedPlacement(s),
      rings_(s.devices, s.first_stag, s.ring) {
  target_.add_regions(rings_.first(), rings_.count(), s.max_message);
}

std::optional<Located> WriteRecordPlacement::locate(const SegmentHeader& h, Reject* why) const {
  if (h.opcode != Opcode::kWriteRecord || !h.has_msn) {
    *why = Reject::kMalformed;
    return std::nullopt;
  }
  const auto device = rings_.device_of(h.stag);
  if (!device) {
    *why = Reject::kUnknown;
    return std::nullopt;
  }
  return Located{*device, h.msn, true};
}

Placed WriteRecordPlacement::place(const Segment& seg, const Located&, int64_t now_ns, std::vector<Completion>* done) {
  const SegmentHeader& h = seg.header;
  return target_.write_record(h.stag, h.msn, h.offset, seg.payload, h.last, now_ns, done);
}

namespace {

SegmentHeader write_record_header(const MessageSlot& m) {
  SegmentHeader h;
  h.opcode = Opcode::kWriteRecord;
  h.stag = stag_of(m.first_stag, m.index, m.ring, m.msn);
  h.has_msn = true;
  h.msn = m.msn;
  return h;
}

std::unique_ptr<Placement> make_write_record(const PlacementSpec& s) {
  return std::make_unique<WriteRecordPlacement>(s);
}

}  // namespace

const Descriptor kWriteRecord{
    .name = "write_record",
    .summary = "UD RDMA Write-Record: one-sided, the target records which bytes arrived (partial placement)",
    .service = Service::kUD,
    .data_op = Opcode::kWriteRecord,
    .partial = true,
    .tagged = true,
    .make_placement = make_write_record,
    .data_header = write_record_header,
};

// The same operation over RD: the sequence layer below placement retransmits every lost
// segment and hands them over in order, so a message completes unless its sender falls silent for the
// session timeout — then what arrived may still be kept as a partial message, as over UD.
const Descriptor kRdWriteRecord{
    .name = "rd_write_record",
    .summary = "RD RDMA Write-Record: one-sided, reliable and in order per source (lost segments retransmitted)",
    .service = Service::kRD,
    .data_op = Opcode::kWriteRecord,
    .reliable = true,
    .sequenced = true,
    .partial = true,
    .tagged = true,
    .make_placement = make_write_record,
    .data_header = write_record_header,
};

}  // namespace slotstream::dgram
