#include "sink/dir_sink.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

namespace slotstream::sink {
namespace {
namespace fs = std::filesystem;

std::span<const std::byte> bytes(const std::string& s) { return std::as_bytes(std::span(s)); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class DirSinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("dir_sink_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(DirSink& s, uint16_t d, const std::string& msg) {
    ASSERT_TRUE(s.begin(d).is_ok());
    ASSERT_TRUE(s.append(d, bytes(msg)).is_ok());
    ASSERT_TRUE(s.commit(d).is_ok());
  }
  fs::path root_;
};

TEST_F(DirSinkTest, WritesNumberedFilesPerDevice) {
  DirSink s(root_ / "cam");
  write(s, 3, "zero");
  write(s, 3, "one");
  write(s, 4, "");
  EXPECT_EQ(slurp(root_ / "cam/device-3/0000000000.bin"), "zero");
  EXPECT_EQ(slurp(root_ / "cam/device-3/0000000001.bin"), "one");
  EXPECT_TRUE(fs::exists(root_ / "cam/device-4/0000000000.bin"));
  EXPECT_EQ(fs::file_size(root_ / "cam/device-4/0000000000.bin"), 0u);
}

TEST_F(DirSinkTest, IncompleteMessageIsInvisibleAndAbortLeavesNothing) {
  DirSink s(root_ / "cam");
  ASSERT_TRUE(s.begin(0).is_ok());
  ASSERT_TRUE(s.append(0, bytes("half")).is_ok());
  for (const auto& e : fs::directory_iterator(root_ / "cam/device-0")) {
    EXPECT_EQ(e.path().filename().string()[0], '.') << "visible before commit: " << e.path();
  }
  s.abort(0);
  EXPECT_TRUE(fs::is_empty(root_ / "cam/device-0"));
}

TEST_F(DirSinkTest, ReconnectContinuesAfterTheLastCompleteFileAndCleansTempFiles) {
  {
    DirSink s(root_ / "cam");
    write(s, 0, "a");
    write(s, 0, "b");
    ASSERT_TRUE(s.begin(0).is_ok());  // dies mid-message: its temp file stays behind
    ASSERT_TRUE(s.append(0, bytes("partial")).is_ok());
  }
  std::ofstream(root_ / "cam/device-0/.0000000002.bin.part") << "crash leftover";
  DirSink again(root_ / "cam");
  write(again, 0, "c");
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000000.bin"), "a");
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000001.bin"), "b");
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000002.bin"), "c");
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(root_ / "cam/device-0")) n += e.path().filename().string()[0] == '.';
  EXPECT_EQ(n, 0u);
}

TEST_F(DirSinkTest, NeverOverwritesAnExistingFile) {
  DirSink s(root_ / "cam");
  write(s, 0, "mine");
  fs::create_directories(root_ / "cam/device-0");
  std::ofstream(root_ / "cam/device-0/0000000001.bin") << "someone else's";
  ASSERT_TRUE(s.begin(0).is_ok());
  ASSERT_TRUE(s.append(0, bytes("new")).is_ok());
  Status st = s.commit(0);
  EXPECT_EQ(st.code(), Code::kIoError);
  EXPECT_NE(st.message().find("refusing to overwrite"), std::string::npos);
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000001.bin"), "someone else's");
}

// A stream that moved between receivers numbers its messages itself (SenderInfo::first_message):
// what a dead receiver stored without confirming comes again under the same number.
TEST_F(DirSinkTest, ANumberedMessageAlreadyStoredIsADuplicateNotAnError) {
  {
    DirSink first(root_ / "cam", {{0, 5}});
    write(first, 0, "m5");
    write(first, 0, "m6");
  }
  DirSink again(root_ / "cam", {{0, 6}, {1, 0}});
  EXPECT_EQ(again.numbering(0)->next, 6u);  // before anything is opened or written
  EXPECT_FALSE(fs::exists(root_ / "cam/device-1"));
  write(again, 0, "m6");  // sent again: the same length, already there
  write(again, 0, "m7");
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000006.bin"), "m6");
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000007.bin"), "m7");
  EXPECT_EQ(again.numbering(0)->already_stored, 1u);
  EXPECT_EQ(again.numbering(0)->next, 8u);
  for (const auto& e : fs::directory_iterator(root_ / "cam/device-0")) {
    EXPECT_NE(e.path().filename().string()[0], '.') << "temp file left: " << e.path();
  }
  // A different message under a stored number is no duplicate: it is refused as before.
  DirSink other(root_ / "cam", {{0, 7}});
  ASSERT_TRUE(other.begin(0).is_ok());
  ASSERT_TRUE(other.append(0, bytes("longer than m7")).is_ok());
  EXPECT_EQ(other.commit(0).code(), Code::kIoError);
  EXPECT_EQ(slurp(root_ / "cam/device-0/0000000007.bin"), "m7");
}

TEST_F(DirSinkTest, UnnumberedDevicesSayWhereTheyContinue) {
  DirSink s(root_ / "cam");
  EXPECT_EQ(s.numbering(3)->next, 0u);
  write(s, 3, "a");
  DirSink again(root_ / "cam");
  EXPECT_EQ(again.numbering(3)->next, 1u);
  EXPECT_EQ(again.numbering(3)->already_stored, 0u);
}

TEST(DirSinkNames, FileNamesArePaddedToTenDigits) {
  EXPECT_EQ(DirSink::file_name(0), "0000000000.bin");
  EXPECT_EQ(DirSink::file_name(1234567890), "1234567890.bin");
}

TEST_F(DirSinkTest, SkipLeavesANumberUnusedAndNeverGoesBack) {
  DirSink s(root_ / "cam");
  write(s, 0, "m0");
  ASSERT_TRUE(s.skip_to(0, 3).is_ok());  // messages 1 and 2 were lost
  write(s, 0, "m3");
  EXPECT_TRUE(fs::exists(root_ / "cam/device-0/0000000003.bin"));
  EXPECT_FALSE(fs::exists(root_ / "cam/device-0/0000000001.bin"));
  EXPECT_FALSE(s.skip_to(0, 2).is_ok());
  uint64_t next = 0;
  ASSERT_TRUE(s.next_seq(0, &next).is_ok());
  EXPECT_EQ(next, 4u);
}

TEST_F(DirSinkTest, PartialMessagesLandBesideTheirValidRanges) {
  DirSink s(root_ / "cam");
  std::string data("ab\0\0ef", 6);
  ASSERT_TRUE(s.store_partial(2, bytes(data), "[[0,2],[4,2]]").is_ok());
  EXPECT_EQ(slurp(root_ / "cam/device-2/0000000000.partial"), data);
  EXPECT_EQ(slurp(root_ / "cam/device-2/0000000000.valid"), "[[0,2],[4,2]]");
  write(s, 2, "next");
  EXPECT_EQ(slurp(root_ / "cam/device-2/0000000001.bin"), "next");
  // A reconnecting sender continues after partial messages too.
  DirSink again(root_ / "cam");
  ASSERT_TRUE(again.store_partial(2, bytes("x"), "[[0,1]]").is_ok());
  EXPECT_TRUE(fs::exists(root_ / "cam/device-2/0000000002.partial"));
  for (const auto& e : fs::directory_iterator(root_ / "cam/device-2")) {
    EXPECT_NE(e.path().filename().string()[0], '.') << "temp file left: " << e.path();
  }
}

TEST_F(DirSinkTest, AnOutputDirectoryRemovedBetweenMessagesIsMadeAgain) {
  DirSink s(root_ / "cam");
  write(s, 0, "before");
  fs::remove_all(root_);  // an operator cleans up while the receiver runs
  write(s, 0, "after");
  EXPECT_EQ(slurp(root_ / "cam" / "device-0" / "0000000001.bin"), "after");  // numbering goes on
  EXPECT_EQ(s.recreated(), 1u);
}

TEST_F(DirSinkTest, AMessageWhoseDirectoryIsRemovedMidWayIsKept) {
  DirSink s(root_ / "cam");
  ASSERT_TRUE(s.begin(2).is_ok());
  ASSERT_TRUE(s.append(2, bytes("first half, ")).is_ok());
  fs::remove_all(root_ / "cam");
  ASSERT_TRUE(s.append(2, bytes("second half")).is_ok());
  ASSERT_TRUE(s.commit(2).is_ok());
  EXPECT_EQ(slurp(root_ / "cam" / "device-2" / "0000000000.bin"), "first half, second half");
  EXPECT_FALSE(fs::exists(root_ / "cam" / "device-2" / ".0000000000.bin.part"));
  write(s, 2, "next");
  EXPECT_EQ(slurp(root_ / "cam" / "device-2" / "0000000001.bin"), "next");
}

}  // namespace
}  // namespace slotstream::sink
