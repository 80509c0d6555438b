#include "engine/dgram/wire/mac.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/params.h>

#include <new>

namespace slotstream::dgram {

SegmentMac::SegmentMac(const MacKey& key) {
  EVP_MAC* hmac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (hmac) ctx_ = EVP_MAC_CTX_new(hmac);
  EVP_MAC_free(hmac);
  char digest[] = "SHA256";
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (!ctx_ || EVP_MAC_init(ctx_, key.data(), key.size(), params) != 1) {
    EVP_MAC_CTX_free(ctx_);
    throw std::bad_alloc();  // OpenSSL without HMAC-SHA256 cannot run slotstream at all
  }
}

SegmentMac::~SegmentMac() { EVP_MAC_CTX_free(ctx_); }

void SegmentMac::sign(std::initializer_list<std::span<const std::byte>> parts, std::span<std::byte, kMacTagSize> out) {
  start();
  for (auto p : parts) add(p);
  finish(out);
}

// A null key re-starts HMAC with the key set in the constructor (OpenSSL 3's HMAC provider), so a
// datagram costs the hash of its bytes and no key schedule.
void SegmentMac::start() { EVP_MAC_init(ctx_, nullptr, 0, nullptr); }

void SegmentMac::add(std::span<const std::byte> part) {
  EVP_MAC_update(ctx_, reinterpret_cast<const unsigned char*>(part.data()), part.size());
}

void SegmentMac::finish(std::span<std::byte, kMacTagSize> out) {
  unsigned char full[EVP_MAX_MD_SIZE];
  size_t len = 0;
  EVP_MAC_final(ctx_, full, &len, sizeof full);
  for (size_t i = 0; i < kMacTagSize; ++i) out[i] = std::byte{full[i]};
}

bool SegmentMac::verify(std::span<const std::byte> data, std::span<const std::byte> tag) {
  if (tag.size() != kMacTagSize) return false;
  std::array<std::byte, kMacTagSize> want;
  sign({data}, want);
  return CRYPTO_memcmp(want.data(), tag.data(), kMacTagSize) == 0;
}

MacKey shim_key(std::string_view token) {
  static constexpr std::string_view kLabel = "slotstream-udp-shim-key-v1";
  MacKey key{};
  unsigned len = 0;
  HMAC(EVP_sha256(), token.data(), int(token.size()), reinterpret_cast<const unsigned char*>(kLabel.data()),
       kLabel.size(), key.data(), &len);
  return key;
}

}  // namespace slotstream::dgram
