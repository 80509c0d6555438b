// The receiver's side of the control handshake (wire/control.h, net/auth.h), and the proofs both
// sides compute:
//
//   HELLO  -> check_hello (no network, nothing allocated) -> CHALLENGE/AUTH (with a token)
//          -> register the lane, reserve memory, set up the protocol -> ACCEPT
//   SETUP  -> connect the protocol -> READY            (any step may answer REFUSE instead)
//
// The decisions that need no network are the pure functions below (unit-tested in
// tests/engine/ucx/session/handshake_test.cc); the steps that talk to the sender are ReceiverSession's
// (receiver_session.h), defined in handshake.cc.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/ucx/protocol/options.h"
#include "engine/ucx/protocol/protocol.h"
#include "engine/ucx/session/transport_choice.h"
#include "net/auth.h"
#include "net/control_socket.h"
#include "slotstream/slotstream.h"
#include "wire/control.h"

namespace slotstream::session {

// How long the receiver waits for each handshake message (HELLO, AUTH, SETUP).
constexpr net::Millis kHelloTimeout{5000};
constexpr uint32_t kMaxDevices = wire::kMaxDevices;

// Why a sender is refused: sent back as REFUSE (code and message), logged, and counted under
// `reason` (a short metric label; see refusal_labels for the default).
struct Refusal {
  Code code;
  std::string message;
  const char* reason = nullptr;
};

// The labels a refusal is counted under (Receiver::refusals): in `refused` always, and for an
// authentication failure in `authentication_failures` too (auth_failure non-null). Without an
// explicit reason: authentication, bad_hello (protocol or version errors), timeout, else other.
// Pure; any thread.
struct RefusalLabels {
  const char* refused;
  const char* auth_failure;  // nullptr unless Code::kAuthFailed
};
RefusalLabels refusal_labels(const Refusal& refusal);

// What an acceptable HELLO asks for.
struct HelloTerms {
  const protocol::Descriptor* protocol = nullptr;
  protocol::Options options;
  Transport transport = Transport::kShm;
  std::string reason;  // why this transport (ACCEPT carries it)
};

// What the receiver brings to the choice of transport: what it allows (`recv --transport`), the
// RDMA transport it serves, and its own facts (host, shm domain, whether it has a usable device).
struct ReceiverTerms {
  Transport allowed = Transport::kAuto;
  RdmaTransport rdma = RdmaTransport::kRc;
  EndFacts facts;
};

// The sender's facts as its HELLO states them.
EndFacts sender_facts(const wire::Hello& hello);

// Everything about a hello that can be judged without the token: its protocol and options, the
// block geometry, the sender name, the devices, and the transport (choose_transport; over rdma
// the RDMA transport the sender insists on must be the one the receiver serves). Nothing is
// allocated yet. *terms is set only when accepted. Pure; any thread.
std::optional<Refusal> check_hello(const wire::Hello& hello, const ReceiverTerms& receiver, HelloTerms* terms);

// The authentication proofs (net/auth.h) over the receiver's nonce, the sender's, and the HELLO
// as sent. Both sides compute them here (the sender in sender_lane.cc). Pure; any thread.
// AUTH: the sender proves it has the token over both nonces and every byte of its hello.
net::Mac hello_proof(const std::string& token, const net::Nonce& receiver_nonce, const net::Nonce& sender_nonce,
                     std::span<const uint8_t> hello_bytes);
// ACCEPT's proof: the receiver proves it has the token too (authentication is mutual).
net::Mac accept_proof(const std::string& token, const net::Nonce& receiver_nonce, const net::Nonce& sender_nonce,
                      std::span<const uint8_t> hello_bytes, const wire::Accept& accept);
// SETUP: signed with the token, so a proxy cannot replace the sender's half of the set-up.
net::Mac setup_proof(const std::string& token, const net::Nonce& receiver_nonce, const net::Nonce& sender_nonce,
                     const wire::Setup& setup);
// The receiver's checks of AUTH (`mac`) and of SETUP's proof: nullopt when right.
std::optional<Refusal> check_sender_proof(const std::string& token, const net::Nonce& receiver_nonce,
                                          const net::Nonce& sender_nonce, std::span<const uint8_t> hello_bytes,
                                          std::span<const uint8_t> mac);
std::optional<Refusal> check_setup_proof(const std::string& token, const net::Nonce& receiver_nonce,
                                         const net::Nonce& sender_nonce, const wire::Setup& setup);

// control.expect(type, timeout), progressing `worker` (unless null) until the frame arrives: set-up
// that needs this end's worker to answer the peer (rdma: rc's wire-up) completes meanwhile. Those
// calls are counted apart from the data path's (fabric::Counters::setup_progress_calls). The
// handshake's thread.
Status expect_progressing(net::ControlSocket& control, wire::MsgType type, net::Millis timeout, fabric::Worker* worker,
                          std::vector<uint8_t>* body);

// The receiver memory a sender's region takes against `recv --max-memory`: its blocks and a
// status byte for each.
inline uint64_t region_bytes(const protocol::Geometry& g) { return g.bytes() + g.blocks; }

}  // namespace slotstream::session
