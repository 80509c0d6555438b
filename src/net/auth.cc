#include "net/auth.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fstream>
#include <sstream>

namespace slotstream::net {

Status make_nonce(Nonce* out) {
  if (RAND_bytes(out->data(), static_cast<int>(out->size())) != 1) {
    return {Code::kAuthFailed, "cannot generate a random nonce"};
  }
  return Status::ok();
}

Status make_nonce_u64(uint64_t* out) {
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out), sizeof *out) != 1) {
    return {Code::kAuthFailed, "cannot generate a random identifier"};
  }
  return Status::ok();
}

Mac auth_mac(const std::string& token, std::span<const uint8_t> nonce, const std::string& sender_name) {
  static constexpr char kLabel[] = "slotstream-auth-v1";
  std::string msg(kLabel);
  msg.append(reinterpret_cast<const char*>(nonce.data()), nonce.size());
  msg.append(sender_name);
  Mac mac{};
  unsigned len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), mac.data(), &len);
  return mac;
}

bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Status read_token_file(const std::string& path, std::string* token) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {Code::kInvalidArgument, "cannot read token file '" + path + "'"};
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty()) return {Code::kInvalidArgument, "token file '" + path + "' is empty"};
  *token = std::move(t);
  return Status::ok();
}

}  // namespace slotstream::net
