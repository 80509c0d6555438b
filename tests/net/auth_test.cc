#include "net/auth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "net/control_socket.h"
#include "slotstream/slotstream.h"

namespace slotstream::net {
namespace {

std::string hex(const Mac& m) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (uint8_t c : m) {
    out += d[c >> 4];
    out += d[c & 15];
  }
  return out;
}

TEST(Auth, ProofDependsOnTokenLabelAndEveryByteOfEveryPart) {
  const std::vector<uint8_t> a = {1, 2, 3}, b = {4, 5}, b2 = {4, 6};
  Mac base = proof("secret", "sender-hello", {a, b});
  EXPECT_TRUE(mac_equal(base, proof("secret", "sender-hello", {a, b})));
  EXPECT_FALSE(mac_equal(base, proof("Secret", "sender-hello", {a, b})));
  EXPECT_FALSE(mac_equal(base, proof("secret", "receiver-accept", {a, b})));
  EXPECT_FALSE(mac_equal(base, proof("secret", "sender-hello", {a, b2})));
  EXPECT_FALSE(mac_equal(base, proof("secret", "sender-hello", {b, a})));
  // Parts are length-prefixed: the same bytes split differently give another proof.
  const std::vector<uint8_t> a_and_4 = {1, 2, 3, 4}, just5 = {5};
  EXPECT_FALSE(mac_equal(base, proof("secret", "sender-hello", {a_and_4, just5})));
}

TEST(Auth, ProofMatchesHmacSha256OfTheDocumentedMessage) {
  // HMAC-SHA256("k", "slotstream-auth-v2" | 0x01 "x" | 00000001 "y"), computed independently with
  // python3 -c 'import
  // hmac,hashlib;print(hmac.new(b"k",b"slotstream-auth-v2\x01x\x01\x00\x00\x00y",hashlib.sha256).hexdigest())'
  const std::vector<uint8_t> y = {'y'};
  EXPECT_EQ(hex(proof("k", "x", {y})), "a690ccc4e9d5348d878499020316f252d527a245667dd0a940316e6ebf38269a");
}

// The session key both ends derive (issue 19, item 5): pinned against an independent HMAC, and
// different for another token or either nonce.
TEST(Auth, TheSessionKeyIsAnHmacOfBothNoncesUnderTheToken) {
  // python3: hmac.new(b"k", b"slotstream-auth-v2\x0bsession-key" + (32).to_bytes(4, "little") + bytes(range(32))
  //          + (32).to_bytes(4, "little") + bytes(range(32, 64)), hashlib.sha256).hexdigest()
  Nonce nr, ns;
  for (int i = 0; i < 32; ++i) {
    nr[i] = uint8_t(i);
    ns[i] = uint8_t(32 + i);
  }
  const Key k = session_key("k", nr, ns);
  EXPECT_EQ(hex(k), "64149468137b7e6a50affca13a58485e4e4f0bdda96e1e9e6f67fde56af9847f");
  EXPECT_FALSE(mac_equal(k, session_key("K", nr, ns)));
  EXPECT_FALSE(mac_equal(k, session_key("k", ns, nr)));
  Nonce other = ns;
  other[31] ^= 1;
  EXPECT_FALSE(mac_equal(k, session_key("k", nr, other)));
}

TEST(Auth, NoncesDiffer) {
  Nonce a, b;
  ASSERT_TRUE(make_nonce(&a).is_ok());
  ASSERT_TRUE(make_nonce(&b).is_ok());
  EXPECT_NE(a, b);
}

TEST(Auth, TokenFileIsTrimmedAndMustNotBeEmpty) {
  auto p = std::filesystem::temp_directory_path() / ("auth_test_token_" + std::to_string(::getpid()));
  std::ofstream(p) << "s3cret\n";
  std::string token;
  ASSERT_TRUE(read_token_file(p, &token).is_ok());
  EXPECT_EQ(token, "s3cret");
  std::ofstream(p) << " \n";
  EXPECT_EQ(read_token_file(p, &token).code(), Code::kInvalidArgument);
  std::filesystem::remove(p);
  EXPECT_EQ(read_token_file(p, &token).code(), Code::kInvalidArgument);
}

TEST(Names, OnlySafePathComponentsAreSenderNames) {
  EXPECT_FALSE(invalid_sender_name("edge-01.cam_A"));
  for (const char* bad : {"", ".", "..", "../x", "a/b", ".hidden", "a b", "x\\y", "-rf", "--help"}) {
    EXPECT_TRUE(invalid_sender_name(bad)) << "accepted '" << bad << "'";
  }
  EXPECT_TRUE(invalid_sender_name(std::string(65, 'a')));
}

TEST(HostPort, Parses) {
  std::string h;
  uint16_t p;
  ASSERT_TRUE(parse_host_port("127.0.0.1:7000", &h, &p).is_ok());
  EXPECT_EQ(h, "127.0.0.1");
  EXPECT_EQ(p, 7000);
  ASSERT_TRUE(parse_host_port("[::1]:0", &h, &p).is_ok());
  EXPECT_EQ(h, "::1");
  for (const char* bad : {"nohost", ":80", "h:", "h:99999", "h:1x"}) {
    EXPECT_FALSE(parse_host_port(bad, &h, &p).is_ok()) << bad;
  }
}

}  // namespace
}  // namespace slotstream::net
