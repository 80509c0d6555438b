#include "engine/dgram/wire/auth.h"

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstring>

#include <gtest/gtest.h>

#include "engine/dgram/wire/mac.h"

namespace slotstream::dgram {
namespace {

constexpr int64_t kSec = 1'000'000'000;

std::vector<uint8_t> peer(uint8_t last) { return {2, 0x1F, 0x40, 127, 0, 0, last}; }

DgramNonce nonce(uint8_t v) {
  DgramNonce n;
  n.fill(v);
  return n;
}

TEST(DgramAuth, ACookieNamesItsAddressQpAndNonceAndLastsTenToTwentySeconds) {
  MacKey secret;
  secret.fill(7);
  const int64_t t = 1000 * kSec;
  const DgramNonce nr = cookie(secret, peer(1), 5, nonce(1), t);
  EXPECT_TRUE(cookie_valid(secret, peer(1), 5, nonce(1), nr, t));
  EXPECT_TRUE(cookie_valid(secret, peer(1), 5, nonce(1), nr, t + 10 * kSec));
  EXPECT_FALSE(cookie_valid(secret, peer(1), 5, nonce(1), nr, t + 20 * kSec));  // stale
  EXPECT_FALSE(cookie_valid(secret, peer(2), 5, nonce(1), nr, t));              // another address
  EXPECT_FALSE(cookie_valid(secret, peer(1), 6, nonce(1), nr, t));              // another QP
  EXPECT_FALSE(cookie_valid(secret, peer(1), 5, nonce(2), nr, t));              // another HELLO
  MacKey other = secret;
  other[0] ^= 1;
  EXPECT_FALSE(cookie_valid(other, peer(1), 5, nonce(1), nr, t));  // another receiver
}

TEST(DgramAuth, ProofsCoverEveryByteAndBothNonces) {
  const std::vector<uint8_t> hello = {1, 2, 3, 4};
  const Proof p = hello_proof("token", nonce(1), nonce(2), hello);
  EXPECT_EQ(p, hello_proof("token", nonce(1), nonce(2), hello));
  EXPECT_NE(p, hello_proof("token", nonce(1), nonce(2), std::vector<uint8_t>{1, 2, 3, 5}));
  EXPECT_NE(p, hello_proof("token", nonce(3), nonce(2), hello));
  EXPECT_NE(p, hello_proof("token", nonce(1), nonce(3), hello));
  EXPECT_NE(p, hello_proof("other", nonce(1), nonce(2), hello));
  Accept a{1, 2, 3, 4, 5, {}};
  const Proof q = accept_proof("token", nonce(1), nonce(2), hello, a);
  EXPECT_NE(q, p);  // a receiver's proof is not a sender's
  a.proof.assign(q.begin(), q.end());
  EXPECT_EQ(accept_proof("token", nonce(1), nonce(2), hello, a), q);  // computed without its own field
  a.first_stag = 9;
  EXPECT_NE(accept_proof("token", nonce(1), nonce(2), hello, a), q);
}

TEST(DgramAuth, SessionKeysDifferPerDirectionAndPerSession) {
  const SessionKeys k = session_keys("token", nonce(1), nonce(2));
  EXPECT_NE(k.to_receiver, k.to_sender);
  EXPECT_EQ(k.to_receiver, session_keys("token", nonce(1), nonce(2)).to_receiver);
  EXPECT_NE(k.to_receiver, session_keys("token", nonce(1), nonce(3)).to_receiver);
  EXPECT_NE(k.to_receiver, session_keys("token", nonce(4), nonce(2)).to_receiver);
}

TEST(DgramAuth, SegmentMacIsTruncatedHmacSha256AndReusable) {
  MacKey key;
  for (size_t i = 0; i < key.size(); ++i) key[i] = uint8_t(i);
  SegmentMac mac(key);
  const std::string text = "the quick brown fox";
  const auto bytes = std::as_bytes(std::span(text));
  for (int round = 0; round < 3; ++round) {  // the key is set once; every datagram starts afresh
    std::array<std::byte, kMacTagSize> tag;
    mac.sign({bytes.first(4), bytes.subspan(4)}, tag);
    unsigned char full[32];
    unsigned len = 0;
    HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(text.data()), text.size(),
         full, &len);
    EXPECT_EQ(std::memcmp(tag.data(), full, kMacTagSize), 0);
    EXPECT_TRUE(mac.verify(bytes, tag));
    tag[0] ^= std::byte{1};
    EXPECT_FALSE(mac.verify(bytes, tag));
  }
}

TEST(DgramAuth, TheShimKeyComesFromTheToken) {
  EXPECT_EQ(shim_key("secret"), shim_key("secret"));
  EXPECT_NE(shim_key("secret"), shim_key("secret2"));
}

}  // namespace
}  // namespace slotstream::dgram
