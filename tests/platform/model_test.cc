#include "platform/model.h"

#include <gtest/gtest.h>

#include "platform/etcd.h"

namespace slotstream::platform {
namespace {

TEST(Model, KeysArePinned) {
  EXPECT_EQ(receiver_key("r1"), "/slotstream/v1/receivers/r1");
  EXPECT_EQ(reservation_key("r1", "edge-a"), "/slotstream/v1/reservations/r1/edge-a");
  // One receiver's reservations are a prefix that no other receiver's name shares.
  EXPECT_EQ(reservations_prefix("r1"), "/slotstream/v1/reservations/r1/");
  EXPECT_FALSE(reservation_key("r10", "s").starts_with(reservations_prefix("r1")));
}

TEST(Model, ReceiverRecordRoundTripsAndUnsetCapacityStaysUnlimited) {
  ReceiverRecord r;
  r.name = "r1";
  r.address = "10.0.0.1:7000";
  r.transports = {"shm", "tcp"};
  r.host_id = "boot@host";
  r.capacity.cpu = 2;
  r.capacity.memory = 1 << 30;
  r.free_cpu = 1.25;
  r.free_memory = 123;
  r.free_receive_memory = 456;
  r.senders = 3;
  r.backlog_bytes = 789;
  ReceiverRecord out;
  ASSERT_TRUE(decode(encode(r), &out).is_ok());
  EXPECT_EQ(out.name, "r1");
  EXPECT_EQ(out.address, "10.0.0.1:7000");
  EXPECT_EQ(out.transports, r.transports);
  EXPECT_EQ(out.capacity.cpu, 2);
  EXPECT_FALSE(out.capacity.bandwidth.has_value());
  EXPECT_FALSE(out.capacity.fps.has_value());
  EXPECT_EQ(out.free_receive_memory, 456u);
  EXPECT_EQ(out.senders, 3u);
  EXPECT_FALSE(decode("{\"address\": \"x:1\"}", &out).is_ok());  // no name
  EXPECT_FALSE(decode("not json", &out).is_ok());
}

TEST(Model, ReservationRoundTrips) {
  Reservation r{"s", "r", {1.5, 2e6, 25, 33554464}, {0, 3}};
  Reservation out;
  ASSERT_TRUE(decode(encode(r), &out).is_ok());
  EXPECT_EQ(out.sender, "s");
  EXPECT_DOUBLE_EQ(out.amount.cpu, 1.5);
  EXPECT_DOUBLE_EQ(out.amount.memory, 33554464);
  EXPECT_EQ(out.devices, (std::vector<uint16_t>{0, 3}));
}

TEST(Model, NamesThatCannotBeKeysAreRefused) {
  EXPECT_FALSE(invalid_platform_name("edge-a"));
  EXPECT_FALSE(invalid_platform_name("10.0.0.1:7000"));
  EXPECT_TRUE(invalid_platform_name(""));
  EXPECT_TRUE(invalid_platform_name("a/b"));
  EXPECT_TRUE(invalid_platform_name("-x"));
  EXPECT_TRUE(invalid_platform_name(std::string(65, 'a')));
}

TEST(EtcdUrl, UrlsNameEveryMember) {
  std::vector<std::string> e;
  ASSERT_TRUE(parse_etcd_url("etcd://127.0.0.1:2379,10.0.0.2:2379", &e).is_ok());
  EXPECT_EQ(e, (std::vector<std::string>{"127.0.0.1:2379", "10.0.0.2:2379"}));
  for (const char* bad :
       {"http://h:1", "etcd://", "etcd://h", "etcd://h:", "etcd://h:x", "etcd://h:1,", "etcd://h:1/p"}) {
    Status st = parse_etcd_url(bad, &e);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("etcd://HOST:PORT"), std::string::npos);
  }
}

TEST(EtcdUrl, PrefixEndIsThePrefixPlusOne) {
  EXPECT_EQ(prefix_end("/a/"), "/a0");
  EXPECT_EQ(prefix_end(std::string("a\xff", 2)), "b");
}

}  // namespace
}  // namespace slotstream::platform
