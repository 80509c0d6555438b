#include "engine/ucx/protocol/carc.h"

#include <gtest/gtest.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include <unistd.h>

namespace slotstream::protocol {
namespace {

constexpr uint64_t kNearWrap = std::numeric_limits<uint64_t>::max() - 1000;

TEST(ByteBudget, DebitsBeforeSendingUpToTheBudget) {
  ByteBudget b(1000, 8);
  EXPECT_TRUE(b.fits(1000));
  EXPECT_FALSE(b.fits(1001));
  b.debit(600);
  EXPECT_TRUE(b.fits(400));
  EXPECT_FALSE(b.fits(401));
  EXPECT_FALSE(b.bytes_fit(401));
  b.debit(400);
  EXPECT_FALSE(b.fits(1));
  EXPECT_EQ(b.outstanding_bytes(), 1000u);
}

TEST(ByteBudget, ReplenishedOnlyByWhatWasProcessed) {
  ByteBudget b(1000, 8);
  b.debit(300);
  b.debit(300);
  b.debit(300);
  EXPECT_FALSE(b.fits(200));
  EXPECT_TRUE(b.replenish(300, 1));  // one message processed
  EXPECT_TRUE(b.fits(400));
  EXPECT_FALSE(b.fits(401));
  // Expect: the same counters again, older ones and impossible ones change nothing.
  EXPECT_FALSE(b.replenish(300, 1));
  EXPECT_FALSE(b.replenish(0, 0));
  EXPECT_FALSE(b.replenish(1000, 4));  // more than was ever sent
  EXPECT_FALSE(b.replenish(950, 3));   // bytes beyond what was sent
  EXPECT_EQ(b.outstanding_bytes(), 600u);
  EXPECT_TRUE(b.replenish(900, 3));
  EXPECT_EQ(b.outstanding_bytes(), 0u);
  EXPECT_EQ(b.outstanding_records(), 0u);
}

TEST(ByteBudget, TheBuffersAreALimitToo) {
  ByteBudget b(1 << 20, 2);  // plenty of bytes, two posted receives
  b.debit(10);
  b.debit(10);
  EXPECT_TRUE(b.bytes_fit(10));
  EXPECT_FALSE(b.fits(10)) << "a third message would find no posted receive";
  EXPECT_TRUE(b.replenish(10, 1));
  EXPECT_TRUE(b.fits(10));
}

TEST(ByteBudget, CountersWrapAround) {
  ByteBudget b(4096, 4, kNearWrap, kNearWrap);
  std::mt19937 rng(7);
  uint64_t processed_bytes = kNearWrap, processed_records = kNearWrap;
  std::vector<uint64_t> in_flight;
  for (int i = 0; i < 10000; ++i) {  // ~10 MB through a 4 KiB budget: the byte counter wraps
    const uint64_t len = 16 + rng() % 2000;
    while (!b.fits(len)) {
      ASSERT_FALSE(in_flight.empty()) << "nothing in flight, yet no room";
      processed_bytes += in_flight.front();
      ++processed_records;
      in_flight.erase(in_flight.begin());
      ASSERT_TRUE(b.replenish(processed_bytes, processed_records));
      ASSERT_FALSE(b.replenish(processed_bytes - 1, processed_records - 1)) << "an older word";
    }
    b.debit(len);
    in_flight.push_back(len);
    ASSERT_LE(b.outstanding_bytes(), 4096u);
    ASSERT_LE(b.outstanding_records(), 4u);
  }
  EXPECT_LT(processed_bytes, kNearWrap) << "the test did not wrap";
}

TEST(ProcessedWord, LayoutIsPinned) {
  std::array<std::byte, kProcessedWordSize> w{};
  encode_processed(0x0102030405060708ull, 0x1112131415161718ull, w);
  EXPECT_EQ(w[0], std::byte{0x08});  // records, little-endian
  EXPECT_EQ(w[7], std::byte{0x01});
  EXPECT_EQ(w[8], std::byte{0x18});   // bytes
  EXPECT_EQ(w[16], std::byte{0x08});  // records again
  EXPECT_EQ(w[23], std::byte{0x01});
  uint64_t records = 0, bytes = 0;
  ASSERT_TRUE(decode_processed(w, &records, &bytes));
  EXPECT_EQ(records, 0x0102030405060708ull);
  EXPECT_EQ(bytes, 0x1112131415161718ull);
}

TEST(ProcessedWord, AReadThatCaughtAPutHalfWayIsRejected) {
  std::array<std::byte, kProcessedWordSize> old_word{}, new_word{};
  encode_processed(41, 41 * 1000, old_word);
  encode_processed(42, 42 * 1000 + 999, new_word);
  // The put copies from either end; a read may see any prefix or suffix of the new word.
  for (size_t cut = 0; cut <= kProcessedWordSize; ++cut) {
    for (bool from_front : {true, false}) {
      auto seen = old_word;
      for (size_t k = 0; k < kProcessedWordSize; ++k) {
        bool copied = from_front ? k < cut : k >= kProcessedWordSize - cut;
        if (copied) seen[k] = new_word[k];
      }
      uint64_t records = 0, bytes = 0;
      if (decode_processed(seen, &records, &bytes)) {
        // Accepted only as the whole old word or the whole new one, never a mixture.
        const bool is_old = records == 41 && bytes == 41000;
        const bool is_new = records == 42 && bytes == 42999;
        EXPECT_TRUE(is_old || is_new) << "cut " << cut << (from_front ? " front" : " back");
      }
    }
  }
}

class CacheDir : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("carc-cache-" + std::to_string(::getpid()) + "-" +
                                                     testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void index(int n, const std::string& level, const std::string& type, const std::string& size,
             const std::string& cpus) {
    auto d = dir_ / ("index" + std::to_string(n));
    std::filesystem::create_directories(d);
    std::ofstream(d / "level") << level << "\n";
    std::ofstream(d / "type") << type << "\n";
    std::ofstream(d / "size") << size << "\n";
    std::ofstream(d / "shared_cpu_list") << cpus << "\n";
  }
  std::filesystem::path dir_;
};

TEST_F(CacheDir, TheLastLevelCacheSharedByItsCpus) {
  index(0, "1", "Data", "48K", "0");
  index(1, "1", "Instruction", "32K", "0");
  index(2, "2", "Unified", "1024K", "0");
  index(3, "3", "Unified", "32768K", "0-1");
  std::string how;
  EXPECT_EQ(cache_share_bytes(dir_.string(), &how), 16u << 20);
  EXPECT_EQ(how, "L3 32 MiB shared by 2 CPUs");
}

TEST_F(CacheDir, CpuListsWithRangesAndSingles) {
  index(0, "2", "Unified", "2048K", "0");
  index(1, "3", "Unified", "36M", "0,2-3,8");
  EXPECT_EQ(cache_share_bytes(dir_.string()), (36u << 20) / 4);
}

TEST_F(CacheDir, WithoutAnL3ThePrivateL2) {
  index(0, "1", "Data", "32K", "0");
  index(1, "2", "Unified", "1M", "0");
  EXPECT_EQ(cache_share_bytes(dir_.string()), 1u << 20);
}

TEST_F(CacheDir, NothingUsableIsZero) {
  EXPECT_EQ(cache_share_bytes((dir_ / "missing").string()), 0u);
  index(0, "1", "Instruction", "32K", "0");
  index(1, "2", "Unified", "garbage", "0");
  EXPECT_EQ(cache_share_bytes(dir_.string()), 0u);
}

}  // namespace
}  // namespace slotstream::protocol
