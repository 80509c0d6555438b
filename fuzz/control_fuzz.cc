// Every control-message decoder (wire/control.h) on the same arbitrary body: what a hostile or
// broken peer can put in a frame. Invariants beyond "no crash, no UB, no leak":
//   - a failure is a kProtocolError or kVersionMismatch with a message, and leaves *out untouched;
//   - a decoded HELLO, ACCEPT, SETUP, PAUSE, NUMBER, NUMBERED, CAPACITY or capacity request
//     re-encodes to exactly the body (nothing in the body was skipped or invented); a KEEPALIVE
//     decodes only when empty; REFUSE, FIN and FIN_ACK, whose decoders normalise (unknown codes,
//     repeated devices, any non-1 "ok"), survive a second round trip;
//   - a decoded HELLO has lane < lanes, only known offer bits and the one version this build speaks;
//   - a decoded ACCEPT names a concrete transport, an rdma transport exactly when it is rdma, and
//     only known offer bits.
#include <cstdint>
#include <span>
#include <vector>

#include "check.h"
#include "wire/control.h"

namespace wire = slotstream::wire;
using slotstream::Code;
using slotstream::Status;

namespace {

using Bytes = std::span<const uint8_t>;

bool same(const std::vector<uint8_t>& encoded, Bytes body) {
  return encoded.size() == body.size() && std::equal(encoded.begin(), encoded.end(), body.begin());
}

void check_failure(const Status& st) {
  FUZZ_CHECK(st.code() == Code::kProtocolError || st.code() == Code::kVersionMismatch);
  FUZZ_CHECK(!st.message().empty());
}

void hello(Bytes body) {
  wire::Hello h;
  h.name = "untouched";
  Status st = wire::decode(body, &h);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(h.name == "untouched");
    return;
  }
  FUZZ_CHECK(h.version == wire::kProtocolVersion);
  FUZZ_CHECK(h.lanes > 0 && h.lane < h.lanes);
  FUZZ_CHECK((h.offers & ~wire::kOfferMask) == 0);
  FUZZ_CHECK(same(wire::encode(h), body));
}

void accept(Bytes body) {
  wire::Accept a;
  a.setup = {42};
  Status st = wire::decode(body, &a);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(a.setup == std::vector<uint8_t>{42});
    return;
  }
  FUZZ_CHECK(a.transport == slotstream::Transport::kShm || a.transport == slotstream::Transport::kTcp ||
             a.transport == slotstream::Transport::kRdma);
  FUZZ_CHECK(a.rdma_transport.has_value() == (a.transport == slotstream::Transport::kRdma));
  FUZZ_CHECK((a.offers & ~wire::kOfferMask) == 0);
  FUZZ_CHECK(a.proof.empty() || a.proof.size() == wire::kMacSize);
  FUZZ_CHECK(same(wire::encode(a), body));
}

void setup(Bytes body) {
  wire::Setup m;
  m.setup = {42};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.setup == std::vector<uint8_t>{42});
    return;
  }
  FUZZ_CHECK(m.proof.empty() || m.proof.size() == wire::kMacSize);
  FUZZ_CHECK(same(wire::encode(m), body));
}

void refuse(Bytes body) {
  wire::Refuse m{Code::kBusy, "untouched"};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.message == "untouched");
    return;
  }
  wire::Refuse again;
  FUZZ_CHECK(wire::decode(wire::encode(m), &again).is_ok());
  FUZZ_CHECK(again.code == m.code && again.message == m.message);
}

void fin(Bytes body) {
  wire::Fin m;
  m.messages[7] = 7;
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.messages.size() == 1 && m.messages[7] == 7);
    return;
  }
  wire::Fin again;
  FUZZ_CHECK(wire::decode(wire::encode(m), &again).is_ok());
  FUZZ_CHECK(again.messages == m.messages);
}

void pause(Bytes body) {
  wire::Pause m{7, true};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.device == 7 && m.paused);
    return;
  }
  FUZZ_CHECK(same(wire::encode(m), body));
}

void stored(Bytes body) {
  wire::Stored m;
  m.devices[7] = {7, 7};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.devices.size() == 1 && m.devices[7].first == 7 && m.devices[7].stored == 7);
    return;
  }
  FUZZ_CHECK(same(wire::encode(m), body));
}

void number(Bytes body) {
  wire::Number m{7, 7};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.device == 7 && m.number == 7);
    return;
  }
  FUZZ_CHECK(same(wire::encode(m), body));
}

void numbered(Bytes body) {
  wire::Numbered m{7, 7, true, "untouched"};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.device == 7 && m.number == 7 && m.ok && m.message == "untouched");
    return;
  }
  FUZZ_CHECK(same(wire::encode(m), body));
}

void fin_ack(Bytes body) {
  wire::FinAck m{true, 7, "untouched"};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.ok && m.stored == 7 && m.message == "untouched");
    return;
  }
  wire::FinAck again;
  FUZZ_CHECK(wire::decode(wire::encode(m), &again).is_ok());
  FUZZ_CHECK(again.ok == m.ok && again.stored == m.stored && again.message == m.message);
}

void capacity(Bytes body) {
  wire::CapacityInfo m{7, 7, 7, 7};
  Status st = wire::decode(body, &m);
  if (!st.is_ok()) {
    check_failure(st);
    FUZZ_CHECK(m.senders == 7 && m.backlog_bytes == 7 && m.load_milli == 7 && m.shm_free_bytes == 7);
    return;
  }
  FUZZ_CHECK(same(wire::encode(m), body));
}

void keepalive(Bytes body) {
  Status st = wire::decode_keepalive(body);
  if (!st.is_ok()) {
    check_failure(st);
    return;
  }
  FUZZ_CHECK(body.empty());
}

void capacity_request(Bytes body) {
  Status st = wire::decode_capacity_request(body);
  if (!st.is_ok()) {
    check_failure(st);
    return;
  }
  FUZZ_CHECK(same(wire::encode_capacity_request(), body));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > wire::kMaxFrame) return -1;  // the control socket never hands over a larger body
  Bytes body(data, size);
  hello(body);
  accept(body);
  setup(body);
  refuse(body);
  fin(body);
  pause(body);
  stored(body);
  number(body);
  numbered(body);
  fin_ack(body);
  capacity(body);
  capacity_request(body);
  keepalive(body);
  return 0;
}
