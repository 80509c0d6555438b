#include "engine/dgram/protocol/rc_write.h"

#include "wire/codec.h"

namespace slotstream::dgram {

std::vector<std::byte> encode_notice(const WrittenNotice& n) {
  std::vector<std::byte> p(kWrittenNoticeSize);
  wire::put_le(p.data(), n.stag, 4);
  wire::put_le(p.data() + 4, n.length, 8);
  return p;
}

std::optional<WrittenNotice> decode_notice(std::span<const std::byte> payload) {
  if (payload.size() != kWrittenNoticeSize) return std::nullopt;
  return WrittenNotice{uint32_t(wire::get_le(payload.data(), 4)), wire::get_le(payload.data() + 4, 8)};
}

RcWritePlacement::RcWritePlacement(const PlacementSpec& s)
    : TimedPlacement(s),
      rings_(s.devices, s.first_stag, s.ring),
      queues_(s.devices) {
  target_.add_regions(rings_.first(), rings_.count(), s.max_message);
}

std::optional<Located> RcWritePlacement::locate(const SegmentHeader& h, Reject* why) const {
  std::optional<uint16_t> device;
  if (h.opcode == Opcode::kWrite) {
    device = rings_.device_of(h.stag);
  } else if (h.opcode == Opcode::kSend) {
    device = queues_.device_of(h.queue);
  } else {
    *why = Reject::kMalformed;
    return std::nullopt;
  }
  if (!device) {
    *why = Reject::kUnknown;
    return std::nullopt;
  }
  return Located{*device, h.msn, h.opcode == Opcode::kSend};
}

Placed RcWritePlacement::place(const Segment& seg, const Located& at, int64_t now_ns, std::vector<Completion>* done) {
  if (!at.ordered) return target_.write(seg.header.stag, seg.header.offset, seg.payload, now_ns);
  return take_notified(seg, at, now_ns, done);
}

// The notice: the region's first `length` bytes are message MSN of the device that owns the STag.
Placed RcWritePlacement::take_notified(const Segment& seg, const Located& at, int64_t now_ns,
                                       std::vector<Completion>* done) {
  const auto notice = decode_notice(seg.payload);
  if (!notice) return Placed::kMalformed;
  if (rings_.device_of(notice->stag) != at.device) return Placed::kUnknownKey;
  auto c = target_.take_written(notice->stag, at.msn, notice->length, now_ns);
  if (!c) return Placed::kOutOfBounds;
  done->push_back(std::move(*c));
  return Placed::kCompleted;
}

std::optional<uint16_t> RcWritePlacement::device_of(const Completion& c) const {
  if (c.outcome != Outcome::kComplete) return std::nullopt;
  return rings_.device_of(c.key);
}

namespace {

SegmentHeader rc_write_header(const MessageSlot& m) {
  SegmentHeader h;
  h.opcode = Opcode::kWrite;
  h.stag = stag_of(m.first_stag, m.index, m.ring, m.msn);
  return h;
}

std::optional<Notice> rc_notice(const MessageSlot& m) {
  Notice n{send_header(m), encode_notice({stag_of(m.first_stag, m.index, m.ring, m.msn), m.length})};
  n.header.service = Service::kRC;
  return n;
}

std::unique_ptr<Placement> make_rc_write(const PlacementSpec& s) { return std::make_unique<RcWritePlacement>(s); }

}  // namespace

const Descriptor kDgramRc{
    .name = "dgram_rc",
    .summary = "RC RDMA Write + Send over TCP (iWARP as standardised; the baseline)",
    .service = Service::kRC,
    .data_op = Opcode::kWrite,
    .reliable = true,
    .tagged = true,
    .over_tcp = true,
    .make_placement = make_rc_write,
    .data_header = rc_write_header,
    .notice = rc_notice,
};

}  // namespace slotstream::dgram
