// The public sinks (src/sink/sinks.cc): the directory sink with retention, and its numbers moved on.
#include "slotstream/sinks.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

namespace slotstream {
namespace {
namespace fs = std::filesystem;

class SinksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("sinks_test_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  static void store(MessageSink& s, uint16_t d, const std::string& msg) {
    ASSERT_TRUE(s.begin(d).is_ok());
    ASSERT_TRUE(s.append(d, std::as_bytes(std::span(msg))).is_ok());
    ASSERT_TRUE(s.commit(d).is_ok());
  }
  size_t files(uint16_t d) const {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator(root_ / "cam" / ("device-" + std::to_string(d)))) {
      n += e.path().extension() == ".bin";
    }
    return n;
  }
  fs::path root_;
};

TEST_F(SinksTest, DirectorySinkKeepsTheNewestMessagesOfEachDevice) {
  auto sink = make_directory_sink({.dir = root_ / "cam", .keep = 2});
  for (int i = 0; i < 5; ++i) store(*sink, 0, "m" + std::to_string(i));
  store(*sink, 1, "other");
  EXPECT_EQ(files(0), 2u);
  EXPECT_TRUE(fs::exists(root_ / "cam/device-0/0000000003.bin"));
  EXPECT_TRUE(fs::exists(root_ / "cam/device-0/0000000004.bin"));
  EXPECT_EQ(files(1), 1u);
}

TEST_F(SinksTest, DirectorySinkKeepsEverythingWithoutKeepAndContinuesAtANumber) {
  auto sink = make_directory_sink({.dir = root_ / "cam"});
  for (int i = 0; i < 3; ++i) store(*sink, 0, "m");
  EXPECT_EQ(files(0), 3u);
  auto* skippable = dynamic_cast<SkippableSink*>(sink.get());
  ASSERT_NE(skippable, nullptr);
  ASSERT_TRUE(skippable->skip_to(0, 10).is_ok());
  EXPECT_EQ(skippable->skip_to(0, 5).code(), Code::kInvalidArgument);  // never backwards
  store(*sink, 0, "after");
  EXPECT_TRUE(fs::exists(root_ / "cam/device-0/0000000010.bin"));
  // With retention too: the edge moves a device's numbers on through either.
  auto kept = make_directory_sink({.dir = root_ / "kept", .keep = 1});
  EXPECT_NE(dynamic_cast<SkippableSink*>(kept.get()), nullptr);
}

TEST_F(SinksTest, NullSinkTakesEveryMessage) {
  auto sink = make_null_sink();
  store(*sink, 0, "gone");
  EXPECT_FALSE(fs::exists(root_));
}

}  // namespace
}  // namespace slotstream
