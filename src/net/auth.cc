#include "net/auth.h"

#include <openssl/crypto.h>
#include <openssl/hmac.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "random.h"

namespace slotstream::net {

Status make_nonce(Nonce* out) {
  if (!random_bytes(*out).is_ok()) return {Code::kAuthFailed, "cannot generate a random nonce"};
  return Status::ok();
}

Mac proof(const std::string& token, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts) {
  return mac({reinterpret_cast<const uint8_t*>(token.data()), token.size()}, label, parts);
}

Key session_key(const std::string& token, const Nonce& receiver_nonce, const Nonce& sender_nonce) {
  return proof(token, "session-key", {receiver_nonce, sender_nonce});
}

Mac mac(std::span<const uint8_t> key, std::string_view label, std::initializer_list<std::span<const uint8_t>> parts) {
  static constexpr std::string_view kDomain = "slotstream-auth-v2";
  std::vector<uint8_t> msg(kDomain.begin(), kDomain.end());
  msg.push_back(static_cast<uint8_t>(label.size()));
  msg.insert(msg.end(), label.begin(), label.end());
  for (auto part : parts) {
    // Length-prefixed, so that moving bytes from one part to the next changes the MAC.
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<uint8_t>(part.size() >> (8 * i)));
    msg.insert(msg.end(), part.begin(), part.end());
  }
  Mac out{};
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), msg.data(), msg.size(), out.data(), &len);
  return out;
}

bool mac_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

Status read_token_file(const std::string& path, std::string* token) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    return {Code::kInvalidArgument, "token file '" + path + "' is a directory: give the file that holds the secret"};
  std::ifstream in(path, std::ios::binary);
  if (!in) return {Code::kInvalidArgument, "cannot read token file '" + path + "': " + std::strerror(errno)};
  std::stringstream ss;
  ss << in.rdbuf();
  std::string t = ss.str();
  while (!t.empty() && std::isspace(static_cast<unsigned char>(t.back()))) t.pop_back();
  if (t.empty())
    return {Code::kInvalidArgument,
            "token file '" + path + "' is empty: write the shared secret into it (both ends the same)"};
  *token = std::move(t);
  return Status::ok();
}

}  // namespace slotstream::net
