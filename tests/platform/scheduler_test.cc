#include "platform/scheduler.h"

#include <gtest/gtest.h>

namespace slotstream::platform {
namespace {

ReceiverView receiver(const std::string& name, double cpu_cap, double cpu_reserved = 0, double free_cpu = 1) {
  ReceiverView v;
  v.record.name = name;
  v.record.address = name + ":7000";
  v.record.transports = {"shm", "tcp"};
  v.record.capacity.cpu = cpu_cap;
  v.record.capacity.memory = 1024.0 * 1048576;
  v.record.free_receive_memory = 1024ull << 20;
  v.record.free_cpu = free_cpu;
  v.reserved.cpu = cpu_reserved;
  return v;
}

Amount need(double cpu, double memory = 32.0 * 1048576) { return {cpu, 0, 0, memory}; }

TEST(Scheduler, ChoosesTheReceiverLeastUsedAfterTheReservation) {
  std::vector<ReceiverView> rs = {receiver("a", 4, 3), receiver("b", 2, 0), receiver("c", 8, 6)};
  Decision d = choose(rs, need(1), {});
  ASSERT_TRUE(d.ok) << d.why;
  EXPECT_EQ(d.receiver, "b");  // a: 100 %, b: 50 %, c: 87.5 %
  EXPECT_NE(d.why.find("b at b:7000: 50%"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("a 100%"), std::string::npos) << d.why;
}

TEST(Scheduler, AReservationThatExactlyFillsAReceiverFits) {
  Decision d = choose({receiver("a", 2, 1)}, need(1), {});
  EXPECT_TRUE(d.ok) << d.why;
  d = choose({receiver("a", 2, 1.5)}, need(1), {});
  EXPECT_FALSE(d.ok);
}

TEST(Scheduler, RefusesWithEveryReceiversShortfall) {
  std::vector<ReceiverView> rs = {receiver("a", 2, 1.5), receiver("b", 1, 0)};
  rs[1].record.free_receive_memory = 16ull << 20;
  Decision d = choose(rs, need(1), {});
  ASSERT_FALSE(d.ok);
  EXPECT_NE(d.why.find("no receiver has room for cpu 1.00"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("a: cpu 0.50 short"), std::string::npos) << d.why;
  EXPECT_NE(d.why.find("b: receive memory free now 16.0 MiB < 32.0 MiB"), std::string::npos) << d.why;
}

TEST(Scheduler, LimitsEveryDimensionAndLeavesUnsetOnesUnlimited) {
  ReceiverView v = receiver("a", 4);
  v.record.capacity.bandwidth = 100e6;
  v.reserved.bandwidth = 60e6;
  Amount n = need(0);
  n.bandwidth = 50e6;
  n.fps = 1e6;  // fps is not limited on this receiver
  Decision d = choose({v}, n, {});
  ASSERT_FALSE(d.ok);
  EXPECT_NE(d.why.find("bandwidth 10.0 MB/s short"), std::string::npos) << d.why;
  n.bandwidth = 40e6;
  EXPECT_TRUE(choose({v}, n, {}).ok);
  v.record.capacity.memory = 40.0 * 1048576;
  v.reserved.memory = 16.0 * 1048576;
  d = choose({v}, n, {});
  ASSERT_FALSE(d.ok);
  EXPECT_NE(d.why.find("receive memory 8.0 MiB short"), std::string::npos) << d.why;
}

TEST(Scheduler, SkipsExcludedReceiversAndThoseWithoutTheTransport) {
  std::vector<ReceiverView> rs = {receiver("a", 4), receiver("b", 4, 2)};
  EXPECT_EQ(choose(rs, need(1), {"a"}).receiver, "b");
  rs[0].record.transports = {"tcp"};
  EXPECT_EQ(choose(rs, need(1), {}, "shm").receiver, "b");
  Decision d = choose(rs, need(1), {"b"}, "shm");
  EXPECT_FALSE(d.ok);
  EXPECT_NE(d.why.find("no receiver is registered for shm besides the one just lost"), std::string::npos) << d.why;
}

TEST(Scheduler, TiesGoToMoreFreeCpuThenFewerSendersThenTheName) {
  std::vector<ReceiverView> rs = {receiver("b", 2, 0, 0.5), receiver("a", 2, 0, 0.5), receiver("c", 2, 0, 1.5)};
  EXPECT_EQ(choose(rs, need(1), {}).receiver, "c");
  rs[2].record.free_cpu = 0.5;
  rs[1].record.senders = 3;
  EXPECT_EQ(choose(rs, need(1), {}).receiver, "b");
  rs[1].record.senders = 0;
  EXPECT_EQ(choose(rs, need(1), {}).receiver, "a");
}

TEST(Scheduler, ViewsSumReservationsOfRegisteredReceiversButNotTheMoversOwn) {
  std::vector<ReceiverRecord> recs(2);
  recs[0].name = "a";
  recs[1].name = "b";
  std::vector<Reservation> res = {{"s1", "a", {1, 10, 25, 100}, {0}},
                                  {"s2", "a", {0.5, 5, 25, 100}, {1}},
                                  {"s3", "b", {2, 0, 0, 0}, {0}},
                                  {"s4", "gone", {9, 0, 0, 0}, {0}}};
  auto views = build_views(recs, res, "s3");
  ASSERT_EQ(views.size(), 2u);
  EXPECT_DOUBLE_EQ(views[0].reserved.cpu, 1.5);
  EXPECT_DOUBLE_EQ(views[0].reserved.fps, 50);
  EXPECT_EQ(views[0].reservations, 2u);
  EXPECT_DOUBLE_EQ(views[1].reserved.cpu, 0);  // s3 is the one moving
  EXPECT_EQ(views[1].reservations, 0u);
}

}  // namespace
}  // namespace slotstream::platform
