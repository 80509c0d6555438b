// The control socket's framing (net/control_socket.h: u32 length | u8 type | body) on an
// arbitrary byte stream from the peer, through a real socket pair: every frame it yields goes to
// the decoder the receiver or sender would use for its type. The first input byte picks the type
// expect() waits for (low 7 bits) and whether the connection is signed (top bit: the receiver's
// end of an authenticated connection with a fixed session key, wire/control.h "Signed frames").
// Invariants beyond "no crash, no UB, no leak":
//   - the frames read re-encode to exactly the bytes consumed, in order (signed: with the sequence
//     number and MAC the sender computes for the n-th frame);
//   - reading ends with kPeerGone (the stream ended, also mid-frame) or kProtocolError (a length
//     of 0 or above kMaxFrame) — or, signed, kAuthFailed (a frame without its MAC and sequence) —
//     never a timeout or anything else;
//   - expect() succeeds only on a frame of the expected type: a REFUSE (whatever its code) or any
//     other type is an error with a message.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "check.h"
#include "net/auth.h"
#include "net/control_socket.h"
#include "wire/control.h"

namespace wire = slotstream::wire;
using slotstream::Code;
using slotstream::Status;
using slotstream::net::ControlSocket;
using slotstream::net::Millis;

namespace {

void decode_as_its_type(const wire::Frame& f) {
  switch (f.type) {
    case wire::MsgType::kHello: {
      wire::Hello m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kAccept: {
      wire::Accept m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kSetup: {
      wire::Setup m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kRefuse: {
      wire::Refuse m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kFin: {
      wire::Fin m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kPause: {
      wire::Pause m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kStored: {
      wire::Stored m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kFinAck: {
      wire::FinAck m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kNumber: {
      wire::Number m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kNumbered: {
      wire::Numbered m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kCapacity: {
      wire::CapacityInfo m;
      (void)wire::decode(f.body, &m);
      break;
    }
    case wire::MsgType::kCapacityRequest:
      (void)wire::decode_capacity_request(f.body);
      break;
    case wire::MsgType::kKeepalive:
      (void)wire::decode_keepalive(f.body);
      break;
    default:
      break;  // CHALLENGE, AUTH, READY and unknown types carry no structure to decode
  }
}

slotstream::net::Key fuzz_key() {
  slotstream::net::Key k;
  k.fill(0x5a);  // fuzz/seeds.py signs its seeds with it
  return k;
}

// The bytes the sending end puts on the wire for its `sequence`-th frame (wire/control.h).
std::vector<uint8_t> sent_bytes(const wire::Frame& f, bool is_signed, uint64_t sequence) {
  if (!is_signed) return wire::encode_frame(f.type, f.body);
  const uint8_t t = static_cast<uint8_t>(f.type);
  std::vector<uint8_t> body = f.body;
  std::vector<uint8_t> seq(8);
  for (int i = 0; i < 8; ++i) seq[i] = uint8_t(sequence >> (8 * i));
  const auto mac = slotstream::net::mac(fuzz_key(), "frame s>r", {{&t, 1}, seq, f.body});
  body.insert(body.end(), seq.begin(), seq.end());
  body.insert(body.end(), mac.begin(), mac.end());
  return wire::encode_frame(f.type, body);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 * 1024) return -1;  // stays within one socket buffer: no writer thread
  int fds[2];
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  // First byte: read with expect(that type) instead of receive(), as a sender or receiver does.
  const auto expected = static_cast<wire::MsgType>(data[0] & 0x7f);
  const bool is_signed = (data[0] & 0x80) != 0;
  FUZZ_CHECK(write(fds[1], data + 1, size - 1) == ssize_t(size - 1));
  shutdown(fds[1], SHUT_WR);
  ControlSocket sock(fds[0]);
  if (is_signed) sock.sign_frames(fuzz_key(), /*sender=*/false);

  std::vector<uint8_t> consumed;
  Status st;
  for (uint64_t n = 0;; ++n) {
    wire::Frame f;
    st = sock.receive(Millis(1000), &f);
    if (!st.is_ok()) break;
    decode_as_its_type(f);
    auto again = sent_bytes(f, is_signed, n);
    consumed.insert(consumed.end(), again.begin(), again.end());
  }
  FUZZ_CHECK(st.code() == Code::kPeerGone || st.code() == Code::kProtocolError ||
             (is_signed && st.code() == Code::kAuthFailed));
  FUZZ_CHECK(consumed.size() <= size - 1 && std::equal(consumed.begin(), consumed.end(), data + 1));
  close(fds[1]);

  // The same stream through expect(): success only if the first frame is of the expected type
  // (a REFUSE, whatever code the peer wrote in it, is never success).
  FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  FUZZ_CHECK(write(fds[1], data + 1, size - 1) == ssize_t(size - 1));
  shutdown(fds[1], SHUT_WR);
  ControlSocket sock2(fds[0]);
  if (is_signed) sock2.sign_frames(fuzz_key(), /*sender=*/false);
  std::vector<uint8_t> body;
  Status e = sock2.expect(expected, Millis(1000), &body);
  if (e.is_ok()) {
    FUZZ_CHECK(size >= 6 && data[5] == uint8_t(expected));
  } else {
    FUZZ_CHECK(!e.message().empty());
  }
  close(fds[1]);
  return 0;
}
