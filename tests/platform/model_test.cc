#include "platform/model.h"

#include <gtest/gtest.h>

#include <cmath>

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

// Issue 35: what is read from etcd is checked before the scheduler counts it.
TEST(Model, AmountsOutOfRangeAreRefusedWithTheirName) {
  EXPECT_FALSE(invalid_amount({1.5, 2e6, 25, 33554464}));
  EXPECT_FALSE(invalid_amount({0, 0, 0, 0}));
  EXPECT_FALSE(invalid_amount({kMaxCpu, kMaxBandwidth, kMaxFps, kMaxMemory}));
  EXPECT_EQ(invalid_amount({-100, 0, 0, 0}).value_or(""), "cpu -100: must be 0..1048576");
  EXPECT_NE(invalid_amount({0, 0, 1e300, 0}).value_or("").find("fps 1e+300"), std::string::npos);
  EXPECT_NE(invalid_amount({0, std::nan(""), 0, 0}).value_or("").find("bandwidth nan"), std::string::npos);
  EXPECT_NE(invalid_amount({0, 0, 0, -1}).value_or("").find("memory -1"), std::string::npos);
  Reservation out;
  Status st = decode(R"({"sender":"s","receiver":"r","amount":{"cpu":-100}})", &out);
  EXPECT_EQ(st.code(), Code::kProtocolError);
  EXPECT_NE(st.message().find("cpu -100"), std::string::npos) << st.message();
  EXPECT_FALSE(decode(R"({"sender":"s","receiver":"r","amount":{"cpu":"1"}})", &out).is_ok());
  EXPECT_FALSE(decode(R"({"sender":"s/x","receiver":"r","amount":{}})", &out).is_ok());
  EXPECT_FALSE(decode(R"({"sender":"s","receiver":"r","amount":[]})", &out).is_ok());
}

TEST(Model, ReceiverRecordsThatNoReceiverWritesAreRefused) {
  ReceiverRecord r;
  r.name = "r1";
  r.address = "edge-b:7000";
  r.transports = {"tcp"};
  EXPECT_FALSE(invalid_record(r));
  auto why = [&](auto change) {
    ReceiverRecord bad = r;
    change(bad);
    return invalid_record(bad).value_or("");
  };
  EXPECT_NE(why([](auto& b) { b.address = "edge-b"; }).find("not HOST:PORT"), std::string::npos);
  EXPECT_NE(why([](auto& b) { b.address = "edge-b:0"; }).find("not HOST:PORT"), std::string::npos);
  EXPECT_NE(why([](auto& b) { b.address = "user@edge-b:7000"; }).find("not HOST:PORT"), std::string::npos);
  EXPECT_NE(why([](auto& b) { b.transports = {}; }).find("no transport"), std::string::npos);
  EXPECT_NE(why([](auto& b) {
              b.transports = {"tcp", "carrier-pigeon"};
            }).find("unknown transport"),
            std::string::npos);
  EXPECT_NE(why([](auto& b) { b.name = "a/b"; }).find("name"), std::string::npos);
  EXPECT_NE(why([](auto& b) { b.capacity.cpu = -1; }).find("capacity cpu -1"), std::string::npos);
  EXPECT_NE(why([](auto& b) { b.capacity.bandwidth = 1e300; }).find("capacity bandwidth"), std::string::npos);
  EXPECT_NE(why([](auto& b) { b.free_cpu = -2; }).find("free cpu -2"), std::string::npos);
  EXPECT_NE(why([](auto& b) {
              b.capacity.memory = 100;
              b.free_receive_memory = 200;
            }).find("more receive memory free"),
            std::string::npos);
  ReceiverRecord out;
  EXPECT_FALSE(decode(R"({"name":"r1","address":"h:1","transports":["tcp"],"free":{"memory":-1}})", &out).is_ok());
  EXPECT_FALSE(decode(R"({"name":"r1","address":"h:1","transports":["tcp"],"senders":1.5})", &out).is_ok());
  EXPECT_FALSE(decode(R"({"name":"r1","address":"h:1","transports":["tcp"],"capacity":{"cpu":"8"}})", &out).is_ok());
  EXPECT_TRUE(decode(R"({"name":"r1","address":"h:1","transports":["tcp"]})", &out).is_ok());
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

TEST(EtcdUrl, SecurityOptionsComeInPairsAndTheirFilesMustBeReadable) {
  EtcdConfig c;
  ASSERT_TRUE(etcd_config("etcd://h:1", {}, &c).is_ok());
  EXPECT_FALSE(c.security.tls());
  PlatformSecurity s;
  s.cert = "/etc/passwd";  // readable, without its key
  Status st = etcd_config("etcd://h:1", s, &c);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("--platform-key"), std::string::npos) << st.message();
  s = {};
  s.cacert = "/nonexistent/ca.pem";
  st = etcd_config("etcd://h:1", s, &c);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("/nonexistent/ca.pem"), std::string::npos) << st.message();
  s = {};
  s.user = "rx";
  st = etcd_config("etcd://h:1", s, &c);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("password"), std::string::npos) << st.message();
  s.password = "secret";
  s.cacert = "/etc/passwd";
  ASSERT_TRUE(etcd_config("etcd://h:1,g:2", s, &c).is_ok());
  EXPECT_TRUE(c.security.tls());
  EXPECT_EQ(c.endpoints, (std::vector<std::string>{"h:1", "g:2"}));
}

TEST(EtcdUrl, PrefixEndIsThePrefixPlusOne) {
  EXPECT_EQ(prefix_end("/a/"), "/a0");
  EXPECT_EQ(prefix_end(std::string("a\xff", 2)), "b");
}

}  // namespace
}  // namespace slotstream::platform
