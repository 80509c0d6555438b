#include "engine/dgram/send/sender_handshake.h"

#include <algorithm>

#include "clock.h"
#include "net/auth.h"

namespace slotstream::dgram {
namespace {
constexpr int64_t kMs = 1'000'000;
constexpr int64_t kHelloInterval = 100 * kMs;
}  // namespace

Hello hello_of(const HandshakeOptions& o, const Descriptor& proto) {
  Hello hello;
  hello.flags = o.token.empty() ? 0 : kHelloAuth;
  hello.protocol = std::string(proto.name);
  hello.name = o.name;
  hello.ring = o.ring;
  hello.max_message = o.max_message;
  hello.segment_size = o.segment_size;
  hello.devices = o.devices;
  return hello;
}

Status SenderHandshake::make_hello() {
  Hello hello = hello_of(o_, proto_);
  net::Nonce n;
  SLOTSTREAM_RETURN_IF_ERROR(net::make_nonce(&n));
  static_assert(sizeof(n) == sizeof(nonce_));
  std::copy(n.begin(), n.end(), nonce_.begin());
  hello.nonce = nonce_;
  // Padded, so that the receiver may answer it before knowing who we are (engine/dgram/wire/control.h).
  const size_t bare = encode_control(hello).size();
  hello.padding = uint16_t(bare < kHelloPaddedSize ? kHelloPaddedSize - bare : 0);
  hello_bytes_ = encode_control(hello);
  return Status::ok();
}

// HELLO, or AUTH once the receiver has challenged us.
std::vector<uint8_t> SenderHandshake::request() const {
  if (!challenge_) return hello_bytes_;
  Auth a;
  a.receiver_nonce = challenge_->nonce;
  a.hello = hello_bytes_;
  a.proof = hello_proof(o_.token, challenge_->nonce, nonce_, hello_bytes_);
  return encode_control(a);
}

Status SenderHandshake::failed(const Status& st, const std::string& where) const {
  if (st.code() == Code::kProtocolError) return st;  // the receiver's TERMINATE says it all
  if (st.code() == Code::kPeerGone && !link_.over_tcp()) {
    return {Code::kConnectFailed,
            "nothing listens at " + where + " (port unreachable): is `slotstream recv --transport udp` running there?"};
  }
  return {Code::kConnectFailed, "no receiver at " + where + ": " + st.message()};
}

Status SenderHandshake::run() {
  SLOTSTREAM_RETURN_IF_ERROR(make_hello());
  const int64_t deadline = now_ns() + o_.timeout_ns;
  const std::string where = link_.peer().str() + (link_.over_tcp() ? " (tcp)" : " (udp)");
  bool sent_auth = false;
  int64_t next_send = 0;
  while (!answered()) {
    const int64_t now = now_ns();
    if (now >= deadline) {
      return {Code::kConnectFailed, "no slotstream datagram receiver answered at " + where + " within " +
                                        std::to_string(o_.timeout_ns / 1'000'000'000) + " s"};
    }
    // Over UDP repeated (a datagram may be lost); over TCP once per step.
    const bool first_auth = challenge_ && !sent_auth;
    if (link_.over_tcp() ? (next_send == 0 || first_auth) : (now >= next_send || first_auth)) {
      if (Status st = link_.send_control(request()); !st.is_ok()) return failed(st, where);
      sent_auth = challenge_.has_value();
      next_send = now + kHelloInterval;
    }
    Status st = link_.progress(int(std::max<int64_t>(1, std::min(deadline, next_send) - now_ns()) / kMs));
    // A REFUSE (or a failed proof) comes just before the receiver closes: that is the news, not the close.
    if (!st.is_ok() && !(link_.over_tcp() && answered())) return failed(st, where);
  }
  return outcome();
}

Status SenderHandshake::outcome() const {
  if (error_) return {Code::kAuthFailed, *error_};
  if (refused_) return {Code::kRefused, "receiver refused: " + *refused_};
  if (region_length_ < o_.max_message && proto_.tagged) {
    return {Code::kProtocolError,
            "receiver's regions (" + std::to_string(region_length_) + " B) are smaller than the largest message"};
  }
  return Status::ok();
}

void SenderHandshake::on_accept(std::span<const uint8_t> p) {
  auto a = decode_accept(p);
  if (!a || accepted_) return;
  if (!o_.token.empty()) {
    const Proof want = accept_proof(o_.token, challenge_ ? challenge_->nonce : DgramNonce{}, nonce_, hello_bytes_, *a);
    if (!challenge_ || !proof_equal(a->proof, want)) {
      error_ = "the receiver at " + link_.peer().str() +
               " did not prove that it has the token: a different token, or not the receiver you meant";
      return;
    }
    const SessionKeys keys = session_keys(o_.token, challenge_->nonce, nonce_);
    tx_mac_ = std::make_unique<SegmentMac>(keys.to_receiver);
    rx_mac_ = std::make_unique<SegmentMac>(keys.to_sender);
    link_.set_mac(tx_mac_.get());
  }
  accepted_ = true;
  region_length_ = a->region_length;
  first_stag_ = a->first_stag;
  if (a->devices != o_.devices.size()) error_ = "the receiver's ACCEPT does not match this sender's devices";
}

void SenderHandshake::on_control(ControlType type, std::span<const uint8_t> p) {
  switch (type) {
    case ControlType::kChallenge:
      if (auto c = decode_challenge(p); c && !accepted_) {
        if (o_.token.empty()) {
          error_ = "the receiver at " + link_.peer().str() + " requires authentication: give its token (--token-file)";
        } else if (!challenge_) {
          challenge_ = *c;
        }
      }
      break;
    case ControlType::kAccept:
      on_accept(p);
      break;
    case ControlType::kRefuse:
      // Only an answer to our HELLO or AUTH: once accepted, an unsigned REFUSE is no one's word.
      if (auto r = decode_refuse(p); r && !accepted_) refused_ = r->reason;
      break;
    default:
      break;  // a sender is never sent anything else; ignore
  }
}

}  // namespace slotstream::dgram
