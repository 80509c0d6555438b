// The mirrored ("magic") ring buffer: the second half is the first half.
#include "engine/ucx/protocol/mirrored_buffer.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace slotstream::protocol {
namespace {

TEST(MirroredBuffer, SizeIsRoundedUpToWholePagesAndZeroFilled) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::unique_ptr<MirroredBuffer> m;
  ASSERT_TRUE(MirroredBuffer::create(1, &m).is_ok());
  EXPECT_EQ(m->size(), page);
  ASSERT_TRUE(MirroredBuffer::create(page + 1, &m).is_ok());
  EXPECT_EQ(m->size(), 2 * page);
  for (size_t i = 0; i < 2 * m->size(); ++i) ASSERT_EQ(m->data()[i], std::byte{0});
}

TEST(MirroredBuffer, BothHalvesAreTheSameBytes) {
  std::unique_ptr<MirroredBuffer> m;
  ASSERT_TRUE(MirroredBuffer::create(3 * 4096, &m).is_ok());
  const size_t n = m->size();
  m->data()[5] = std::byte{0x11};
  EXPECT_EQ(m->data()[n + 5], std::byte{0x11});
  m->data()[n + n - 1] = std::byte{0x22};  // written through the second half
  EXPECT_EQ(m->data()[n - 1], std::byte{0x22});
}

TEST(MirroredBuffer, ASpanAcrossTheEndIsContiguous) {
  std::unique_ptr<MirroredBuffer> m;
  ASSERT_TRUE(MirroredBuffer::create(4096, &m).is_ok());
  const size_t n = m->size();
  const std::string text(1000, 'x');
  // Written as one piece 300 bytes before the end: 300 bytes land at the end, 700 at the start.
  std::memcpy(m->at(n - 300), text.data(), text.size());
  EXPECT_EQ(std::memcmp(m->data() + n - 300, text.data(), 300), 0);
  EXPECT_EQ(std::memcmp(m->data(), text.data() + 300, 700), 0);
  // And read back as one piece through either half.
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(m->at(7 * n - 300)), 1000), text);
}

TEST(MirroredBuffer, PositionsMapModuloTheSize) {
  std::unique_ptr<MirroredBuffer> m;
  ASSERT_TRUE(MirroredBuffer::create(4096, &m).is_ok());
  EXPECT_EQ(m->at(0), m->data());
  EXPECT_EQ(m->at(m->size()), m->data());
  EXPECT_EQ(m->at(5 * m->size() + 17), m->data() + 17);
}

TEST(MirroredBuffer, AZeroSizeIsAClearError) {
  std::unique_ptr<MirroredBuffer> m;
  Status st = MirroredBuffer::create(0, &m);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(m, nullptr);
}

}  // namespace
}  // namespace slotstream::protocol
