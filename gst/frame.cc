#include "frame.h"

#include <algorithm>
#include <cstring>

namespace slotstream::gst {

namespace {

void put(std::byte* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint64_t get(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t(std::to_integer<uint8_t>(p[i])) << (8 * i);
  return v;
}

void put_preamble(std::byte* p, FrameKind kind) {
  std::memcpy(p, kFrameMagic.data(), kFrameMagic.size());
  put(p + 4, kFrameVersion, 1);
  put(p + 5, uint8_t(kind), 1);
  put(p + 6, 0, 2);
}

Status bad(const std::string& what) {
  return {Code::kProtocolError, what + " (is the sender a slotstreamsink of this version?)"};
}

}  // namespace

std::vector<std::byte> encode_caps(std::string_view caps) {
  std::vector<std::byte> out(kCapsHeaderSize + caps.size());
  put_preamble(out.data(), FrameKind::kCaps);
  put(out.data() + 8, caps.size(), 4);
  put(out.data() + 12, 0, 4);
  std::memcpy(out.data() + kCapsHeaderSize, caps.data(), caps.size());
  return out;
}

std::vector<std::byte> encode_eos() {
  std::vector<std::byte> out(kPreambleSize);
  put_preamble(out.data(), FrameKind::kEos);
  return out;
}

void encode_buffer_header(const BufferHeader& h, std::span<std::byte, kBufferHeaderSize> out) {
  std::byte* p = out.data();
  put_preamble(p, FrameKind::kBuffer);
  put(p + 8, h.payload_length, 8);
  put(p + 16, h.pts, 8);
  put(p + 24, h.dts, 8);
  put(p + 32, h.duration, 8);
  put(p + 40, h.offset, 8);
  put(p + 48, h.offset_end, 8);
  put(p + 56, h.flags, 4);
  put(p + 60, 0, 4);
  put(p + 64, h.sent, 8);
  put(p + 72, 0, 8);
}

void Assembler::reset() { *this = Assembler(); }

size_t Assembler::header_size() const {
  if (header_have_ < kPreambleSize) return kPreambleSize;
  switch (frame_.kind) {
    case FrameKind::kCaps:
      return kCapsHeaderSize;
    case FrameKind::kBuffer:
      return kBufferHeaderSize;
    case FrameKind::kEos:
      break;
  }
  return kPreambleSize;
}

// Called each time header_have_ reaches header_size(): the preamble first, then the kind's header.
Status Assembler::parse_header() {
  const std::byte* p = header_.data();
  if (header_have_ == kPreambleSize) {
    if (std::memcmp(p, kFrameMagic.data(), kFrameMagic.size()) != 0) return bad("not a slotstreamsink message");
    if (get(p + 4, 1) != kFrameVersion) {
      return bad("slotstreamsink message version " + std::to_string(get(p + 4, 1)) + ", this slotstreamsrc reads " +
                 std::to_string(kFrameVersion));
    }
    const uint64_t kind = get(p + 5, 1);
    if (kind < 1 || kind > 3) return bad("unknown slotstreamsink message kind " + std::to_string(kind));
    if (get(p + 6, 2) != 0) return bad("reserved bits set in a slotstreamsink message");
    frame_.kind = FrameKind(kind);
    header_done_ = frame_.kind == FrameKind::kEos;
    return Status::ok();
  }
  header_done_ = true;
  if (frame_.kind == FrameKind::kCaps) {
    body_length_ = get(p + 8, 4);
    if (body_length_ > kMaxCapsLength || get(p + 12, 4) != 0) return bad("malformed caps message");
    frame_.caps.reserve(body_length_);
    return Status::ok();
  }
  BufferHeader& h = frame_.buffer;
  h.payload_length = get(p + 8, 8);
  h.pts = get(p + 16, 8);
  h.dts = get(p + 24, 8);
  h.duration = get(p + 32, 8);
  h.offset = get(p + 40, 8);
  h.offset_end = get(p + 48, 8);
  h.flags = uint32_t(get(p + 56, 4));
  h.sent = get(p + 64, 8);
  if (get(p + 60, 4) != 0 || get(p + 72, 8) != 0) return bad("reserved bits set in a buffer message");
  body_length_ = h.payload_length;
  return Status::ok();
}

Status Assembler::feed(std::span<const std::byte> data, const Allocate& allocate) {
  while (!data.empty() && !header_done_) {
    const size_t n = std::min(header_size() - header_have_, data.size());
    std::memcpy(header_.data() + header_have_, data.data(), n);
    header_have_ += n;
    data = data.subspan(n);
    if (header_have_ == header_size()) SLOTSTREAM_RETURN_IF_ERROR(parse_header());
    if (header_done_ && frame_.kind == FrameKind::kBuffer && body_length_ > 0 && !in_place_) {
      payload_ = allocate(body_length_);
      if (payload_.size() != body_length_) {
        return {Code::kIoError, "no memory for a buffer of " + std::to_string(body_length_) + " bytes"};
      }
    }
  }
  if (data.empty()) return Status::ok();
  if (data.size() > body_length_ - body_have_) {
    return bad("a slotstreamsink message longer than its header says");
  }
  if (frame_.kind == FrameKind::kCaps) {
    frame_.caps.append(reinterpret_cast<const char*>(data.data()), data.size());
  } else if (!in_place_) {
    std::memcpy(payload_.data() + body_have_, data.data(), data.size());  // the one copy of the copy path
  }
  body_have_ += data.size();
  return Status::ok();
}

Status Assembler::finish(Frame* out) {
  if (!header_done_ || body_have_ != body_length_) return bad("a slotstreamsink message cut short");
  *out = std::move(frame_);
  return Status::ok();
}

Status Assembler::decode_in_place(std::span<const std::byte> message, Frame* out, std::span<const std::byte>* payload) {
  reset();
  in_place_ = true;
  SLOTSTREAM_RETURN_IF_ERROR(feed(message, nullptr));
  SLOTSTREAM_RETURN_IF_ERROR(finish(out));
  *payload = out->kind == FrameKind::kBuffer ? message.last(out->buffer.payload_length) : std::span<const std::byte>{};
  return Status::ok();
}

}  // namespace slotstream::gst
