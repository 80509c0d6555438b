#include "engine/dgram/wire/auth.h"

#include "net/auth.h"

namespace slotstream::dgram {
namespace {

std::span<const uint8_t> u8(const DgramNonce& n) { return n; }

std::array<uint8_t, 8> le64(uint64_t v) {
  std::array<uint8_t, 8> b{};
  for (int i = 0; i < 8; ++i) b[i] = static_cast<uint8_t>(v >> (8 * i));
  return b;
}

template <class Out>
Out first_bytes(const net::Mac& m) {
  Out out{};
  static_assert(sizeof(Out) <= sizeof(net::Mac));
  std::copy_n(m.begin(), out.size(), out.begin());
  return out;
}

std::string key_string(const MacKey& k) { return std::string(k.begin(), k.end()); }

}  // namespace

DgramNonce cookie(const MacKey& secret, std::span<const uint8_t> peer, uint32_t qp, const DgramNonce& sender_nonce,
                  int64_t now_ns, int interval_back) {
  const auto interval = le64(uint64_t(now_ns / kCookieIntervalNs - interval_back));
  const auto qp_bytes = le64(qp);
  return first_bytes<DgramNonce>(
      net::proof(key_string(secret), "dgram-cookie", {peer, qp_bytes, u8(sender_nonce), interval}));
}

bool cookie_valid(const MacKey& secret, std::span<const uint8_t> peer, uint32_t qp, const DgramNonce& sender_nonce,
                  const DgramNonce& nr, int64_t now_ns) {
  bool ok = false;
  for (int back = 0; back < 2; ++back) {
    ok |= net::mac_equal(cookie(secret, peer, qp, sender_nonce, now_ns, back), nr);
  }
  return ok;
}

Proof hello_proof(const std::string& token, const DgramNonce& nr, const DgramNonce& ns,
                  std::span<const uint8_t> hello_bytes) {
  return first_bytes<Proof>(net::proof(token, "dgram-sender-hello", {u8(nr), u8(ns), hello_bytes}));
}

Proof accept_proof(const std::string& token, const DgramNonce& nr, const DgramNonce& ns,
                   std::span<const uint8_t> hello_bytes, const Accept& accept) {
  Accept unsigned_accept = accept;
  unsigned_accept.proof.clear();
  const auto accept_bytes = encode_control(unsigned_accept);
  return first_bytes<Proof>(
      net::proof(token, "dgram-receiver-accept", {u8(nr), u8(ns), hello_bytes, std::span(accept_bytes)}));
}

bool proof_equal(std::span<const uint8_t> a, std::span<const uint8_t> b) { return net::mac_equal(a, b); }

SessionKeys session_keys(const std::string& token, const DgramNonce& nr, const DgramNonce& ns) {
  SessionKeys k;
  k.to_receiver = first_bytes<MacKey>(net::proof(token, "dgram-key-to-receiver", {u8(nr), u8(ns)}));
  k.to_sender = first_bytes<MacKey>(net::proof(token, "dgram-key-to-sender", {u8(nr), u8(ns)}));
  return k;
}

}  // namespace slotstream::dgram
