// The GStreamer plugin's message assembler (gst/frame.h) on arbitrary messages cut into arbitrary pieces: what a
// foreign or hostile sender can put in front of a slotstreamsrc. Input: one byte that sets the piece size
// (1-256), then the message. Invariants:
//   - a message is accepted only if it re-encodes to exactly its bytes (caps, buffer header + payload, EOS);
//   - cutting it into pieces changes nothing: accepted alike, the same frame, the payload intact;
//   - a buffer's payload is asked for once, with the length its header declares.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "check.h"
#include "frame.h"

namespace gst = slotstream::gst;

namespace {

struct Result {
  bool ok = false;
  gst::Frame frame;
  std::vector<std::byte> payload;
  int allocations = 0;
};

Result assemble(std::span<const std::byte> message, size_t piece) {
  Result r;
  gst::Assembler a;
  auto allocate = [&](uint64_t n) {
    ++r.allocations;
    if (n > (1u << 20)) return std::span<std::byte>{};  // "no memory": a clean error, not an allocation
    r.payload.assign(n, std::byte{0});
    return std::span<std::byte>(r.payload);
  };
  for (size_t i = 0; i < message.size(); i += piece) {
    if (!a.feed(message.subspan(i, std::min(piece, message.size() - i)), allocate).is_ok()) return r;
  }
  r.ok = a.finish(&r.frame).is_ok();
  return r;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t piece = size_t(data[0]) + 1;
  std::span<const std::byte> message(reinterpret_cast<const std::byte*>(data + 1), size - 1);
  Result cut = assemble(message, piece);
  Result whole = assemble(message, message.size() + 1);
  FUZZ_CHECK(cut.ok == whole.ok);
  FUZZ_CHECK(cut.allocations <= 1 && whole.allocations <= 1);
  if (!cut.ok) return 0;
  FUZZ_CHECK(cut.frame.kind == whole.frame.kind && cut.payload == whole.payload);
  std::vector<std::byte> again;
  switch (cut.frame.kind) {
    case gst::FrameKind::kCaps:
      FUZZ_CHECK(cut.frame.caps == whole.frame.caps);
      again = gst::encode_caps(cut.frame.caps);
      break;
    case gst::FrameKind::kEos:
      again = gst::encode_eos();
      break;
    case gst::FrameKind::kBuffer:
      FUZZ_CHECK(cut.frame.buffer == whole.frame.buffer);
      FUZZ_CHECK(cut.frame.buffer.payload_length == message.size() - gst::kBufferHeaderSize);
      again.resize(gst::kBufferHeaderSize);
      gst::encode_buffer_header(cut.frame.buffer,
                                std::span<std::byte, gst::kBufferHeaderSize>(again.data(), again.size()));
      again.insert(again.end(), cut.payload.begin(), cut.payload.end());
      break;
  }
  FUZZ_CHECK(again.size() == message.size() && std::equal(again.begin(), again.end(), message.begin()));
  return 0;
}
