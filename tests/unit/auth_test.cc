#include "net/auth.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "net/control_socket.h"
#include "slotstream/slotstream.h"

namespace slotstream::net {
namespace {

TEST(Auth, MacDependsOnTokenNonceAndName) {
  Nonce n1{}, n2{};
  n2[0] = 1;
  Mac base = auth_mac("secret", n1, "cam");
  EXPECT_TRUE(mac_equal(base, auth_mac("secret", n1, "cam")));
  EXPECT_FALSE(mac_equal(base, auth_mac("Secret", n1, "cam")));
  EXPECT_FALSE(mac_equal(base, auth_mac("secret", n2, "cam")));
  EXPECT_FALSE(mac_equal(base, auth_mac("secret", n1, "cam2")));
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
  for (const char* bad : {"", ".", "..", "../x", "a/b", ".hidden", "a b", "x\\y"}) {
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
