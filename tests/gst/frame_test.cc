#include "frame.h"

#include <gtest/gtest.h>

#include <vector>

namespace slotstream::gst {
namespace {

uint8_t at(std::span<const std::byte> b, size_t i) { return std::to_integer<uint8_t>(b[i]); }
uint64_t le(std::span<const std::byte> b, size_t i, int n) {
  uint64_t v = 0;
  for (int k = 0; k < n; ++k) v |= uint64_t(at(b, i + k)) << (8 * k);
  return v;
}

// Pins the layout documented in frame.h: a change here is a change of kFrameVersion.
TEST(Frame, LayoutIsPinned) {
  static_assert(kBufferHeaderSize == 80 && kCapsHeaderSize == 16 && kPreambleSize == 8);
  static_assert((16 + kBufferHeaderSize) % 32 == 0, "a block's payload stays 32-byte aligned");
  std::array<std::byte, kBufferHeaderSize> b{};
  BufferHeader h{0x0102030405060708, 11, 12, 13, 14, 15, 0x40, 16};
  encode_buffer_header(h, b);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(b.data()), 4), "SSGF");
  EXPECT_EQ(at(b, 4), kFrameVersion);
  EXPECT_EQ(at(b, 5), 2);  // buffer
  EXPECT_EQ(le(b, 6, 2), 0u);
  EXPECT_EQ(le(b, 8, 8), 0x0102030405060708u);
  EXPECT_EQ(at(b, 8), 0x08);  // little-endian
  for (int i = 0; i < 5; ++i) EXPECT_EQ(le(b, 16 + 8 * i, 8), 11u + i);
  EXPECT_EQ(le(b, 56, 4), 0x40u);
  EXPECT_EQ(le(b, 60, 4), 0u);
  EXPECT_EQ(le(b, 64, 8), 16u);
  EXPECT_EQ(le(b, 72, 8), 0u);

  std::vector<std::byte> c = encode_caps("video/x-raw");
  ASSERT_EQ(c.size(), kCapsHeaderSize + 11);
  EXPECT_EQ(at(c, 5), 1);
  EXPECT_EQ(le(c, 8, 4), 11u);
  EXPECT_EQ(at(c, 16), 'v');
  std::vector<std::byte> e = encode_eos();
  ASSERT_EQ(e.size(), kPreambleSize);
  EXPECT_EQ(at(e, 5), 3);
}

// A message fed in pieces of `piece` bytes (as a multi-block message arrives); the payload into `into`.
Status assemble(std::span<const std::byte> message, size_t piece, Frame* out, std::vector<std::byte>* into) {
  Assembler a;
  int allocations = 0;
  auto allocate = [&](uint64_t n) {
    ++allocations;
    into->assign(n, std::byte{0});
    return std::span<std::byte>(*into);
  };
  for (size_t i = 0; i < message.size(); i += piece) {
    SLOTSTREAM_RETURN_IF_ERROR(a.feed(message.subspan(i, std::min(piece, message.size() - i)), allocate));
  }
  EXPECT_LE(allocations, 1);
  return a.finish(out);
}

std::vector<std::byte> buffer_message(const BufferHeader& h, size_t payload) {
  std::vector<std::byte> m(kBufferHeaderSize + payload);
  encode_buffer_header(h, std::span<std::byte, kBufferHeaderSize>(m.data(), kBufferHeaderSize));
  for (size_t i = 0; i < payload; ++i) m[kBufferHeaderSize + i] = std::byte(i * 7 + 1);
  return m;
}

TEST(Frame, BufferRoundTripsInAnyPieces) {
  BufferHeader h{1000, 40000000, kNone, 40000000, 3, 4, 0x2000, 123456789};
  std::vector<std::byte> m = buffer_message(h, 1000);
  for (size_t piece : {size_t(1), size_t(7), size_t(8), size_t(79), size_t(80), size_t(81), size_t(4096)}) {
    Frame f;
    std::vector<std::byte> payload;
    ASSERT_TRUE(assemble(m, piece, &f, &payload).is_ok()) << piece;
    EXPECT_EQ(f.kind, FrameKind::kBuffer);
    EXPECT_EQ(f.buffer, h);
    EXPECT_TRUE(std::equal(payload.begin(), payload.end(), m.begin() + kBufferHeaderSize)) << piece;
  }
}

TEST(Frame, CapsAndEosRoundTrip) {
  Frame f;
  std::vector<std::byte> unused;
  ASSERT_TRUE(assemble(encode_caps("video/x-raw, format=(string)RGB"), 5, &f, &unused).is_ok());
  EXPECT_EQ(f.kind, FrameKind::kCaps);
  EXPECT_EQ(f.caps, "video/x-raw, format=(string)RGB");
  ASSERT_TRUE(assemble(encode_eos(), 3, &f, &unused).is_ok());
  EXPECT_EQ(f.kind, FrameKind::kEos);
}

TEST(Frame, EmptyBufferNeedsNoMemory) {
  Frame f;
  std::vector<std::byte> payload;
  ASSERT_TRUE(assemble(buffer_message({}, 0), 80, &f, &payload).is_ok());
  EXPECT_EQ(f.buffer.payload_length, 0u);
}

// Expect: each is refused with a reason, never read past or accepted.
TEST(Frame, RefusesWhatIsNotAFrame) {
  Frame f;
  std::vector<std::byte> p;
  std::vector<std::byte> good = buffer_message({100}, 100);

  std::vector<std::byte> m = good;
  m[0] = std::byte{'X'};  // another program's message
  EXPECT_EQ(assemble(m, 4096, &f, &p).code(), Code::kProtocolError);
  m = good;
  m[4] = std::byte{2};  // a newer version
  EXPECT_NE(assemble(m, 4096, &f, &p).message().find("version 2"), std::string::npos);
  m = good;
  m[5] = std::byte{9};  // unknown kind
  EXPECT_FALSE(assemble(m, 4096, &f, &p).is_ok());
  m = good;
  m[60] = std::byte{1};  // reserved bits
  EXPECT_FALSE(assemble(m, 4096, &f, &p).is_ok());
  m = good;
  m.push_back(std::byte{0});  // longer than its header says
  EXPECT_FALSE(assemble(m, 4096, &f, &p).is_ok());
  m = good;
  m.pop_back();  // cut short
  EXPECT_NE(assemble(m, 4096, &f, &p).message().find("cut short"), std::string::npos);
  m = encode_eos();
  m.push_back(std::byte{0});
  EXPECT_FALSE(assemble(m, 4096, &f, &p).is_ok());
  std::vector<std::byte> caps = encode_caps(std::string(kMaxCapsLength + 1, 'a'));
  EXPECT_FALSE(assemble(caps, 4096, &f, &p).is_ok());
}

// Expect: a message lent whole is decoded where it lies — the payload span points into the message — and what
// the assembler refuses is refused here too.
TEST(Frame, DecodesInPlace) {
  BufferHeader h{1000, 40000000, kNone, 40000000, 3, 4, 0x2000, 123456789};
  std::vector<std::byte> m = buffer_message(h, 1000);
  Assembler a;
  Frame f;
  std::span<const std::byte> payload;
  ASSERT_TRUE(a.decode_in_place(m, &f, &payload).is_ok());
  EXPECT_EQ(f.kind, FrameKind::kBuffer);
  EXPECT_EQ(f.buffer, h);
  EXPECT_EQ(payload.data(), m.data() + kBufferHeaderSize) << "in place, not copied";
  EXPECT_EQ(payload.size(), 1000u);
  ASSERT_TRUE(a.decode_in_place(encode_caps("video/x-raw"), &f, &payload).is_ok());
  EXPECT_EQ(f.caps, "video/x-raw");
  EXPECT_TRUE(payload.empty());
  ASSERT_TRUE(a.decode_in_place(encode_eos(), &f, &payload).is_ok());
  EXPECT_EQ(f.kind, FrameKind::kEos);
  m.push_back(std::byte{0});
  EXPECT_FALSE(a.decode_in_place(m, &f, &payload).is_ok()) << "longer than its header says";
  m.resize(m.size() - 2);
  EXPECT_NE(a.decode_in_place(m, &f, &payload).message().find("cut short"), std::string::npos);
  m[0] = std::byte{'X'};
  EXPECT_EQ(a.decode_in_place(m, &f, &payload).code(), Code::kProtocolError);
}

TEST(Frame, NoMemoryIsAnError) {
  Assembler a;
  std::vector<std::byte> m = buffer_message({100}, 100);
  Status st = a.feed(m, [](uint64_t) { return std::span<std::byte>{}; });
  EXPECT_EQ(st.code(), Code::kIoError);
}

}  // namespace
}  // namespace slotstream::gst
