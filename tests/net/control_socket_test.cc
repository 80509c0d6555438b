// The control connection over real loopback TCP (no UCX): HOST:PORT parsing, framing both ways,
// deadlines, the liveness check, a closing or babbling peer, and REFUSE turned into its status.
#include "net/control_socket.h"

#include <sys/socket.h>

#include <gtest/gtest.h>

#include <thread>

namespace slotstream::net {
namespace {

TEST(ParseHostPort, NamesAddressesAndBracketedIpv6) {
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(parse_host_port("edge-b:7000", &host, &port).is_ok());
  EXPECT_EQ(host, "edge-b");
  EXPECT_EQ(port, 7000);
  ASSERT_TRUE(parse_host_port("10.0.0.2:0", &host, &port).is_ok());  // 0: pick a free port
  EXPECT_EQ(host, "10.0.0.2");
  EXPECT_EQ(port, 0);
  ASSERT_TRUE(parse_host_port("[fe80::1]:65535", &host, &port).is_ok());
  EXPECT_EQ(host, "fe80::1");
  EXPECT_EQ(port, 65535);
}

TEST(ParseHostPort, RefusesWhatIsNotHostColonPortAndLeavesTheOutputsAlone) {
  for (const char* bad : {"", "edge-b", ":7000", "edge-b:", "edge-b:65536", "edge-b:-1", "edge-b:70x", "[::1]",
                          "[::1]7000", "[::1]:", "[]:7000"}) {
    std::string host = "unchanged";
    uint16_t port = 42;
    Status st = parse_host_port(bad, &host, &port);
    EXPECT_EQ(st.code(), Code::kInvalidArgument) << "'" << bad << "'";
    EXPECT_NE(st.message().find(bad), std::string::npos) << "the message quotes the input: " << st.message();
    EXPECT_EQ(host, "unchanged") << bad;
    EXPECT_EQ(port, 42) << bad;
  }
}

// Both ends of one loopback control connection.
struct Pair {
  Pair() {
    std::unique_ptr<Listener> listener;
    EXPECT_TRUE(Listener::open("127.0.0.1", 0, &listener).is_ok());
    std::string host;
    uint16_t port = 0;
    EXPECT_TRUE(parse_host_port(listener->address(), &host, &port).is_ok());
    EXPECT_NE(port, 0) << "address() names the port bound";
    EXPECT_TRUE(ControlSocket::connect(host, port, Millis(2000), &a).is_ok());
    EXPECT_TRUE(listener->accept(Millis(2000), &b).is_ok());
  }
  std::unique_ptr<ControlSocket> a, b;  // connecting side, accepted side
};

void send_raw(ControlSocket& s, const std::vector<uint8_t>& bytes) {
  ASSERT_EQ(::send(s.fd(), bytes.data(), bytes.size(), MSG_NOSIGNAL), ssize_t(bytes.size()));
}

TEST(ControlSocket, FramesArriveWholeAndInOrderBothWays) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  const std::vector<uint8_t> big(wire::kMaxFrame - 1, 0x5A);  // type byte + body: the largest frame
  std::thread sender([&] {  // the largest frame may not fit the socket buffers before it is read
    EXPECT_TRUE(p.a->send(wire::MsgType::kHello, std::vector<uint8_t>{1, 2, 3}).is_ok());
    EXPECT_TRUE(p.a->send(wire::MsgType::kFin, {}).is_ok());
    EXPECT_TRUE(p.a->send(wire::MsgType::kSetup, big).is_ok());
  });
  wire::Frame f;
  EXPECT_TRUE(p.b->receive(Millis(2000), &f).is_ok());
  EXPECT_EQ(f.type, wire::MsgType::kHello);
  EXPECT_EQ(f.body, (std::vector<uint8_t>{1, 2, 3}));
  EXPECT_TRUE(p.b->receive(Millis(2000), &f).is_ok());
  EXPECT_EQ(f.type, wire::MsgType::kFin);
  EXPECT_TRUE(f.body.empty());
  EXPECT_TRUE(p.b->receive(Millis(2000), &f).is_ok());
  EXPECT_EQ(f.type, wire::MsgType::kSetup);
  EXPECT_EQ(f.body, big);
  sender.join();
  ASSERT_TRUE(p.b->send(wire::MsgType::kFinAck, std::vector<uint8_t>{9}).is_ok());
  ASSERT_TRUE(p.a->receive(Millis(2000), &f).is_ok());
  EXPECT_EQ(f.type, wire::MsgType::kFinAck);
  EXPECT_EQ(f.body, (std::vector<uint8_t>{9}));
}

TEST(ControlSocket, NothingWithinTheDeadlineIsATimeoutAndHalfAFrameToo) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  wire::Frame f;
  EXPECT_EQ(p.b->receive(Millis(20), &f).code(), Code::kTimeout);
  send_raw(*p.a, {5, 0, 0, 0, uint8_t(wire::MsgType::kHello), 1});  // 2 of the 5 bytes it announces
  EXPECT_EQ(p.b->receive(Millis(50), &f).code(), Code::kTimeout);
}

TEST(ControlSocket, ALengthPrefixOutsideOneToMaxFrameIsGarbage) {
  for (uint32_t len : {0u, uint32_t(wire::kMaxFrame) + 1, 0xFFFFFFFFu}) {
    Pair p;
    ASSERT_TRUE(p.a && p.b);
    send_raw(*p.a, {uint8_t(len), uint8_t(len >> 8), uint8_t(len >> 16), uint8_t(len >> 24)});
    wire::Frame f;
    Status st = p.b->receive(Millis(2000), &f);
    EXPECT_EQ(st.code(), Code::kProtocolError) << len;
    EXPECT_NE(st.message().find(std::to_string(len)), std::string::npos) << st.message();
  }
}

// What a sender's stall timeout and a receiver's KEEPALIVE go by: the time of the last whole frame
// each way. Half a frame, or none, is silence.
TEST(ControlSocket, RemembersWhenAWholeFrameLastCameAndWent) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  const auto start_sent = p.a->last_sent(), start_heard = p.b->last_received();
  std::this_thread::sleep_for(Millis(20));
  ASSERT_TRUE(p.a->send(wire::MsgType::kKeepalive, {}).is_ok());
  EXPECT_GE(p.a->last_sent() - start_sent, Millis(20));
  EXPECT_EQ(p.b->last_received(), start_heard) << "nothing read yet";
  wire::Frame f;
  ASSERT_TRUE(p.b->receive(Millis(2000), &f).is_ok());
  EXPECT_EQ(f.type, wire::MsgType::kKeepalive);
  const auto heard = p.b->last_received();
  EXPECT_GE(heard - start_heard, Millis(20));
  std::this_thread::sleep_for(Millis(20));
  send_raw(*p.a, {5, 0, 0, 0, uint8_t(wire::MsgType::kHello), 1});  // half a frame
  EXPECT_EQ(p.b->receive(Millis(50), &f).code(), Code::kTimeout);
  EXPECT_EQ(p.b->last_received(), heard);
}

// Another service's answer where a frame should start ("HTTP" read as a length of 1347703880): the
// error quotes its first line, and foreign_text() has it for the sender to name the service.
TEST(ControlSocket, TextWhereAFrameShouldStartIsQuotedNotReadAsALength) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  const std::string reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n";
  send_raw(*p.a, std::vector<uint8_t>(reply.begin(), reply.end()));
  std::this_thread::sleep_for(Millis(50));  // the whole answer is there, as a server sends it in one go
  wire::Frame f;
  Status st = p.b->receive(Millis(2000), &f);
  EXPECT_EQ(st.code(), Code::kProtocolError);
  EXPECT_EQ(p.b->foreign_text(), "HTTP/1.1 400 Bad Request");
  EXPECT_NE(st.message().find("the peer sent 'HTTP/1.1 400 Bad Request'"), std::string::npos) << st.message();
  EXPECT_EQ(st.message().find("1347703880"), std::string::npos) << st.message();

  Pair q;  // binary garbage stays a bad length, with nothing quoted
  ASSERT_TRUE(q.a && q.b);
  send_raw(*q.a, {0xff, 0xff, 0xff, 0xff, 0x01});
  EXPECT_EQ(q.b->receive(Millis(2000), &f).code(), Code::kProtocolError);
  EXPECT_EQ(q.b->foreign_text(), "");
}

TEST(ControlSocket, CheckAliveSeesAPendingFrameWithoutTakingItAndThePeerGoing) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  EXPECT_TRUE(p.b->check_alive().is_ok());
  ASSERT_TRUE(p.a->send(wire::MsgType::kPause, std::vector<uint8_t>{7}).is_ok());
  Status pending;
  for (int i = 0; i < 200 && (pending = p.b->check_alive()).is_ok(); ++i) {
    std::this_thread::sleep_for(Millis(5));  // loopback delivers at once; allow a slow machine
  }
  EXPECT_EQ(pending.code(), Code::kInProgress);
  wire::Frame f;
  ASSERT_TRUE(p.b->receive(Millis(2000), &f).is_ok());  // still there
  EXPECT_EQ(f.type, wire::MsgType::kPause);
  EXPECT_TRUE(p.b->check_alive().is_ok());
  p.a.reset();  // the peer closes
  Status gone;
  for (int i = 0; i < 200 && (gone = p.b->check_alive()).is_ok(); ++i) std::this_thread::sleep_for(Millis(5));
  EXPECT_EQ(gone.code(), Code::kPeerGone);
  EXPECT_EQ(p.b->receive(Millis(2000), &f).code(), Code::kPeerGone);
}

TEST(ControlSocket, APeerClosingMidFrameIsGone) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  send_raw(*p.a, {5, 0, 0, 0, uint8_t(wire::MsgType::kHello)});
  p.a.reset();
  wire::Frame f;
  Status st = p.b->receive(Millis(2000), &f);
  EXPECT_EQ(st.code(), Code::kPeerGone);
  EXPECT_NE(st.message().find("mid-message"), std::string::npos) << st.message();
}

TEST(ControlSocket, ExpectTakesItsTypeTurnsARefusalIntoItsStatusAndRefusesOthers) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  std::vector<uint8_t> body;
  ASSERT_TRUE(p.a->send(wire::MsgType::kAccept, std::vector<uint8_t>{4, 2}).is_ok());
  ASSERT_TRUE(p.b->expect(wire::MsgType::kAccept, Millis(2000), &body).is_ok());
  EXPECT_EQ(body, (std::vector<uint8_t>{4, 2}));

  ASSERT_TRUE(p.a->send(wire::MsgType::kRefuse, wire::encode(wire::Refuse{Code::kAuthFailed, "bad token"})).is_ok());
  body = {1};
  Status st = p.b->expect(wire::MsgType::kAccept, Millis(2000), &body);
  EXPECT_EQ(st.code(), Code::kAuthFailed);
  EXPECT_EQ(st.message(), "refused by peer: bad token");
  EXPECT_EQ(body, (std::vector<uint8_t>{1})) << "output set only on success";

  ASSERT_TRUE(p.a->send(wire::MsgType::kFin, {}).is_ok());
  EXPECT_EQ(p.b->expect(wire::MsgType::kAccept, Millis(2000), &body).code(), Code::kProtocolError);
}

// Issue 19, item 5: after an authenticated handshake every frame carries a sequence number and a
// MAC under the session key; a forged, altered, replayed or reflected frame is an authentication
// failure that names what happened.
Key key_of(uint8_t b) {
  Key k;
  k.fill(b);
  return k;
}

TEST(ControlSocket, SignedFramesArriveWithTheirBodiesAndEachDirectionCounts) {
  Pair p;
  ASSERT_TRUE(p.a && p.b);
  p.a->sign_frames(key_of(7), /*sender=*/true);
  p.b->sign_frames(key_of(7), /*sender=*/false);
  wire::Frame f;
  for (uint8_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(p.a->send(wire::MsgType::kFin, std::vector<uint8_t>{i, 1}).is_ok());
    ASSERT_TRUE(p.b->receive(Millis(2000), &f).is_ok()) << int(i);
    EXPECT_EQ(f.type, wire::MsgType::kFin);
    EXPECT_EQ(f.body, (std::vector<uint8_t>{i, 1}));
  }
  ASSERT_TRUE(p.b->send(wire::MsgType::kFinAck, {}).is_ok());
  ASSERT_TRUE(p.a->receive(Millis(2000), &f).is_ok());
  EXPECT_TRUE(f.body.empty());
}

// The bytes a signed frame of `type` and `body` with sequence number `seq` has on the wire.
std::vector<uint8_t> signed_frame(const Key& key, bool from_sender, wire::MsgType type, uint64_t seq,
                                  std::vector<uint8_t> body) {
  const uint8_t t = uint8_t(type);
  std::vector<uint8_t> s(8);
  for (int i = 0; i < 8; ++i) s[i] = uint8_t(seq >> (8 * i));
  const Mac m = mac(key, from_sender ? "frame s>r" : "frame r>s", {{&t, 1}, s, body});
  body.insert(body.end(), s.begin(), s.end());
  body.insert(body.end(), m.begin(), m.end());
  return wire::encode_frame(type, body);
}

Status receive_on_signed(const std::vector<uint8_t>& bytes, std::string* message) {
  Pair p;
  p.b->sign_frames(key_of(7), /*sender=*/false);
  send_raw(*p.a, bytes);
  wire::Frame f;
  Status st = p.b->receive(Millis(2000), &f);
  *message = st.message();
  return st;
}

TEST(ControlSocket, ASignedConnectionRefusesForgedAlteredReplayedAndReflectedFrames) {
  std::string why;
  const auto good = signed_frame(key_of(7), true, wire::MsgType::kPause, 0, {0, 0, 1});
  EXPECT_TRUE(receive_on_signed(good, &why).is_ok()) << why;

  EXPECT_EQ(receive_on_signed(wire::encode_frame(wire::MsgType::kPause, std::vector<uint8_t>{0, 0, 1}), &why).code(),
            Code::kAuthFailed);
  EXPECT_NE(why.find("unsigned"), std::string::npos) << why;

  EXPECT_EQ(receive_on_signed(signed_frame(key_of(8), true, wire::MsgType::kPause, 0, {0, 0, 1}), &why).code(),
            Code::kAuthFailed);  // another key: forged
  EXPECT_NE(why.find("without the session's MAC"), std::string::npos) << why;

  auto altered = good;
  altered[5] ^= 1;  // the device number
  EXPECT_EQ(receive_on_signed(altered, &why).code(), Code::kAuthFailed);

  auto retyped = good;
  retyped[4] = uint8_t(wire::MsgType::kFinAck);
  EXPECT_EQ(receive_on_signed(retyped, &why).code(), Code::kAuthFailed);

  EXPECT_EQ(receive_on_signed(signed_frame(key_of(7), false, wire::MsgType::kPause, 0, {0, 0, 1}), &why).code(),
            Code::kAuthFailed);  // the receiver's own frame sent back to it
  EXPECT_EQ(receive_on_signed(signed_frame(key_of(7), true, wire::MsgType::kPause, 1, {0, 0, 1}), &why).code(),
            Code::kAuthFailed);  // a later sequence number: a frame went missing
  EXPECT_NE(why.find("replayed or reordered"), std::string::npos) << why;

  // The same valid frame twice: the second is a replay.
  Pair p;
  p.b->sign_frames(key_of(7), /*sender=*/false);
  send_raw(*p.a, good);
  send_raw(*p.a, good);
  wire::Frame f;
  EXPECT_TRUE(p.b->receive(Millis(2000), &f).is_ok());
  EXPECT_EQ(p.b->receive(Millis(2000), &f).code(), Code::kAuthFailed);
}

TEST(Listener, AcceptWithoutACallerReturnsNothingInTime) {
  std::unique_ptr<Listener> listener;
  ASSERT_TRUE(Listener::open("127.0.0.1", 0, &listener).is_ok());
  std::unique_ptr<ControlSocket> conn(new ControlSocket(-1));
  ASSERT_TRUE(listener->accept(Millis(10), &conn).is_ok());
  EXPECT_EQ(conn, nullptr);
}

TEST(ControlSocket, ConnectingWhereNobodyListensSaysSo) {
  std::string host;
  uint16_t port = 0;
  {
    std::unique_ptr<Listener> listener;  // a port that was just free, and is again
    ASSERT_TRUE(Listener::open("127.0.0.1", 0, &listener).is_ok());
    ASSERT_TRUE(parse_host_port(listener->address(), &host, &port).is_ok());
  }
  std::unique_ptr<ControlSocket> conn;
  Status st = ControlSocket::connect(host, port, Millis(2000), &conn);
  EXPECT_EQ(st.code(), Code::kConnectFailed);
  EXPECT_NE(st.message().find("slotstream recv"), std::string::npos) << st.message();
  EXPECT_EQ(conn, nullptr);
}

}  // namespace
}  // namespace slotstream::net
