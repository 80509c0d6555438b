// The datagram sender's half of the handshake (engine/dgram/wire/control.h, engine/dgram/wire/auth.h): HELLO — padded
// so that the receiver may answer it before knowing who we are, repeated over UDP until answered — then, with a token,
// the receiver's CHALLENGE back in an AUTH that proves the token; then ACCEPT (with a token, its proof shows the
// receiver has it too, and the session's keys sign every datagram from then on) or REFUSE. Threading: the sender's (one
// thread at a time).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/dgram/send/sender_link.h"
#include "engine/dgram/wire/auth.h"
#include "engine/dgram/wire/control.h"
#include "engine/dgram/wire/mac.h"

namespace slotstream::dgram {

struct HandshakeOptions {
  std::string name;
  std::vector<uint16_t> devices;
  uint32_t ring = 4;
  uint64_t max_message = 0;
  uint32_t segment_size = 0;
  std::string token;  // non-empty: authenticate
  int64_t timeout_ns = 5'000'000'000;
};

// The HELLO a sender of `proto` with these options asks with (its nonce and padding left zero): the
// handshake's, and a multicast sender's ANNOUNCE.
Hello hello_of(const HandshakeOptions& o, const Descriptor& proto);

class SenderHandshake {
 public:
  SenderHandshake(const HandshakeOptions& o, const Descriptor& proto, SenderLink& link)
      : o_(o),
        proto_(proto),
        link_(link) {}

  // Until ACCEPT (and its proof), REFUSE, or the timeout.
  Status run();
  // A control message from the receiver that the handshake answers (CHALLENGE, ACCEPT, REFUSE).
  void on_control(ControlType type, std::span<const uint8_t> payload);

  bool accepted() const { return accepted_; }
  uint32_t first_stag() const { return first_stag_; }
  // With a token: the key that checks the receiver's datagrams (nullptr before ACCEPT or without one).
  SegmentMac* rx_mac() const { return rx_mac_.get(); }

 private:
  Status make_hello();
  std::vector<uint8_t> request() const;
  bool answered() const { return accepted_ || refused_ || error_; }
  Status outcome() const;
  Status failed(const Status& st, const std::string& where) const;
  void on_accept(std::span<const uint8_t> p);

  const HandshakeOptions o_;
  const Descriptor& proto_;
  SenderLink& link_;
  DgramNonce nonce_{};
  std::vector<uint8_t> hello_bytes_;  // the HELLO as sent (AUTH's proof covers it)
  std::optional<Challenge> challenge_;
  std::unique_ptr<SegmentMac> tx_mac_, rx_mac_;  // with a token, from ACCEPT on
  bool accepted_ = false;
  std::optional<std::string> refused_;
  std::optional<std::string> error_;  // authentication, or an ACCEPT that does not fit
  uint64_t region_length_ = 0;
  uint32_t first_stag_ = 0;
};

}  // namespace slotstream::dgram
