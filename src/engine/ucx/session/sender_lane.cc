// SenderLane (sender_lane.h): connecting, the handshake and the fabric's set-up of one lane; its data path
// (draining the send ring, the sending thread, liveness, FIN) is in sender_lane_send.cc.
#include "engine/ucx/session/sender_lane.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common.h"
#include "engine/ucx/session/handshake.h"
#include "engine/ucx/session/sender_lane_timing.h"
#include "engine/ucx/stream/trace.h"
#include "net/auth.h"
#include "wire/block_header.h"

namespace slotstream::session {

constexpr std::string_view kLostPrefix = "lost the receiver (";

Status receiver_lost(std::string_view how) {
  return {Code::kPeerGone, std::string(kLostPrefix) + std::string(how) +
                               "): it stopped or died, and nothing more can be sent on this connection. Start "
                               "the receiver again, then this sender"};
}

Status explain_transmit_error(Status st) {
  if (st.code() != Code::kPeerGone || st.message().starts_with(kLostPrefix)) return st;
  return receiver_lost(st.message());
}

std::chrono::microseconds sending_idle_period(bool in_flight, bool holding, Clock::duration since_activity) {
  if (in_flight) return kInFlightPeriod;
  if (holding) return kHoldingIdlePeriod;
  return since_activity > kLongIdle ? kLongIdlePeriod : kIdlePeriod;
}

SenderLane::SenderLane(LaneOwner& owner, uint16_t index, std::vector<uint16_t> devices)
    : owner_(owner),
      index_(index),
      devices_(std::move(devices)) {}

Status SenderLane::connect(const std::string& host, uint16_t port, wire::Hello hello) {
  hello.lane = index_;
  hello.devices = devices_;
  const SenderOptions& options = owner_.sender_options();
  if (!options.first_message.empty()) {
    hello.flags |= wire::kHelloNumbered;
    for (uint16_t d : devices_) hello.first.push_back(options.first_message.at(d));
  }
  if (options.confirm_stored) hello.flags |= wire::kHelloConfirm;
  for (;;) {
    hello.offers = owner_.offers();
    SLOTSTREAM_RETURN_IF_ERROR(net::make_nonce(&hello.nonce));
    std::optional<Transport> failed;
    Status st = net::ControlSocket::connect(host, port, kConnectTimeout, &control_);
    if (st.is_ok()) st = handshake(hello, &failed);
    if (st.is_ok() || !failed) return st;
    // Our half of the chosen transport could not be set up: an auto sender tries again without
    // it (the receiver picks the next), saying why; otherwise that is the error.
    reset();
    if (!owner_.set_up_failed(*failed, st)) return st;
  }
}

void SenderLane::reset() {
  proto_.reset();
  proto_fabric_.reset();
  ring_.reset();
  local_.reset();
  endpoint_.reset();
  worker_.reset();
  control_.reset();
}

void SenderLane::start() {
  sending_thread_ = std::thread([this] { sending_loop_st(); });
}

void SenderLane::stop() {
  finishing_.store(true, std::memory_order_release);
  if (ring_) ring_->wake_sender();  // it may be in a long idle sleep
  if (sending_thread_.joinable()) sending_thread_.join();
}

void SenderLane::abort() {
  if (ring_) ring_->abort();
}

namespace {

// The first answer to our HELLO, which also tells whether a slotstream receiver listens there at
// all: another service answers text ("HTTP/1.1 400 ..."), or nothing.
Status first_answer(net::ControlSocket& control, wire::Frame* frame) {
  Status st = control.receive(kFirstAnswerTimeout, frame);
  if (st.is_ok()) return st;
  const std::string not_ours = control.peer() + " is not a slotstream receiver";
  if (st.code() == Code::kTimeout) {
    return {Code::kConnectFailed,
            not_ours + " (no answer within " + std::to_string(kFirstAnswerTimeout.count() / 1000) + " s)"};
  }
  if (st.code() == Code::kProtocolError) {
    return {Code::kConnectFailed,
            not_ours + " (" +
                (control.foreign_text().empty() ? st.message() : "it answered '" + control.foreign_text() + "'") + ")"};
  }
  if (st.code() == Code::kPeerGone) {
    return {Code::kConnectFailed, control.peer() + " closed the connection without answering (" + st.message() +
                                      "): not a slotstream receiver, or one that is stopping"};
  }
  return st;
}

// The receiver's first answer to our HELLO: with a CHALLENGE, we prove the token (AUTH) and
// `*receiver_nonce` is its nonce; `*frame` is then its next answer.
Status answer_challenge(net::ControlSocket& control, const std::string& token, const wire::Hello& hello,
                        const std::vector<uint8_t>& hello_bytes, wire::Frame* frame,
                        std::optional<net::Nonce>* receiver_nonce) {
  SLOTSTREAM_RETURN_IF_ERROR(first_answer(control, frame));
  if (frame->type != wire::MsgType::kChallenge) return Status::ok();
  if (frame->body.size() != wire::kNonceSize) return {Code::kProtocolError, "malformed challenge"};
  if (token.empty()) return {Code::kAuthFailed, "authentication failed: the receiver requires a token (--token-file)"};
  receiver_nonce->emplace();
  std::copy(frame->body.begin(), frame->body.end(), (*receiver_nonce)->begin());
  auto mac = hello_proof(token, **receiver_nonce, hello.nonce, hello_bytes);
  SLOTSTREAM_RETURN_IF_ERROR(control.send(wire::MsgType::kAuth, mac));
  return control.receive(kHandshakeTimeout, frame);
}

// ACCEPT (or the receiver's REFUSE), checked against the token when we have one: our data goes
// only to a receiver that proves it has the token too.
Status read_accept(const wire::Frame& frame, const std::string& token, const wire::Hello& hello,
                   const std::vector<uint8_t>& hello_bytes, const std::optional<net::Nonce>& receiver_nonce,
                   wire::Accept* accept) {
  if (frame.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &refuse));
    return {refuse.code, "receiver refused: " + refuse.message};
  }
  if (frame.type != wire::MsgType::kAccept) {
    return {Code::kProtocolError, "unexpected control message " + std::to_string(int(frame.type))};
  }
  SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, accept));
  if (token.empty()) return Status::ok();
  if (!receiver_nonce) {
    return {Code::kAuthFailed,
            "authentication failed: the receiver did not ask for the token, so it cannot prove "
            "it is the receiver you share it with (start it with --token-file)"};
  }
  if (!net::mac_equal(accept->proof, accept_proof(token, *receiver_nonce, hello.nonce, hello_bytes, *accept))) {
    return {Code::kAuthFailed, "authentication failed: the receiver's answer is not signed with the token"};
  }
  return Status::ok();
}

}  // namespace

// HELLO, then CHALLENGE/AUTH when the receiver asks, ACCEPT (verified when we have a token),
// our SETUP, READY (wire/control.h, net/auth.h).
Status SenderLane::handshake(const wire::Hello& hello, std::optional<Transport>* failed) {
  const SenderOptions& options = owner_.sender_options();
  const std::vector<uint8_t> hello_bytes = wire::encode(hello);
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kHello, hello_bytes));
  fabric::test_stop_point("hello");
  wire::Frame frame;
  std::optional<net::Nonce> receiver_nonce;
  if (Status st = answer_challenge(*control_, options.token, hello, hello_bytes, &frame, &receiver_nonce);
      !st.is_ok()) {
    // The receiver went away (or never answered) before it accepted us: say who.
    if (st.code() == Code::kPeerGone || st.code() == Code::kTimeout) {
      return {st.code(), "the receiver did not answer the hello: " + st.message()};
    }
    return st;
  }
  wire::Accept accept;
  SLOTSTREAM_RETURN_IF_ERROR(read_accept(frame, options.token, hello, hello_bytes, receiver_nonce, &accept));
  owner_.accepted(accept);
  if (Status st = setup_fabric(accept); !st.is_ok()) {
    *failed = accept.transport;
    refuse_transport(accept.transport, st);
    return st;
  }

  wire::Setup setup;
  setup.worker_address = worker_->address();
  setup.setup = proto_->setup();
  if (receiver_nonce) {
    auto mac = setup_proof(options.token, *receiver_nonce, hello.nonce, setup);
    setup.proof.assign(mac.begin(), mac.end());
  }
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kSetup, wire::encode(setup)));
  // Authenticated both ways: the receiver's answer and every frame after it are signed.
  if (receiver_nonce)
    control_->sign_frames(net::session_key(options.token, *receiver_nonce, hello.nonce), /*sender=*/true);
  std::vector<uint8_t> body;
  // A receiver that reaches into our memory may connect back to our worker now (rdma: wired up
  // with our worker's help; tcp: through our listener, engine/ucx/fabric/cm.h).
  const fabric::TransportTraits t = worker_->context().traits();
  fabric::Worker* helper = t.setup_progress || t.cm_connect ? worker_.get() : nullptr;
  Status st = expect_progressing(*control_, wire::MsgType::kReady, kHandshakeTimeout, helper, &body);
  if (!st.is_ok()) return {st.code(), "receiver did not complete the set-up: " + st.message()};
  return options.confirm_stored ? read_first_stored() : Status::ok();
}

// The STORED a receiver sends right after READY (wire/control.h) says where this connection's
// numbers start. Read here, not by the sending thread later: a receiver that dies before that
// thread looked would leave the messages it stored meanwhile unnumbered, and a platform sender
// (src/platform) would then send them again under new numbers (stored twice).
Status SenderLane::read_first_stored() {
  std::set<uint16_t> missing(devices_.begin(), devices_.end());
  wire::Frame frame;
  while (!missing.empty()) {
    Status st = control_->receive(kHandshakeTimeout, &frame);
    if (!st.is_ok()) return {st.code(), "receiver did not say where its numbers start (STORED): " + st.message()};
    if (frame.type == wire::MsgType::kKeepalive) continue;
    if (frame.type != wire::MsgType::kStored) {
      return {Code::kProtocolError,
              "expected STORED after READY, got control message " + std::to_string(int(frame.type))};
    }
    wire::Stored stored;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &stored));
    owner_.on_stored(stored);
    for (const auto& [d, c] : stored.devices) missing.erase(d);
  }
  return Status::ok();
}

// Our half of the receiver's transport failed: REFUSE instead of SETUP tells the receiver why (it
// frees what it set up for us), and it closes once it has released this connection's name and
// lane — after that a new connection of ours is not mistaken for a second one.
void SenderLane::refuse_transport(Transport transport, const Status& st) {
  const std::string what = std::string("the sender could not set up transport ") + transport_name(transport);
  (void)control_->send(wire::MsgType::kRefuse, wire::encode(wire::Refuse{st.code(), what + ": " + st.message()}));
  wire::Frame ignored;
  for (const auto until = Clock::now() + kHandshakeTimeout; Clock::now() < until;) {
    if (control_->receive(Millis(100), &ignored).code() == Code::kPeerGone) break;
  }
}

Status SenderLane::setup_fabric(const wire::Accept& accept) {
  const SenderOptions& options = owner_.sender_options();
  const protocol::Descriptor& desc = owner_.descriptor();
  fabric::Context* context = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(owner_.shared_context(accept, &context));
  const size_t local_size = size_t(options.blocks) * stream::SendRing::block_stride(options.block_size);
  // Before anything is pinned: the NIC needs the locked-memory limit to cover the send blocks, and
  // UCX its own buffers of the lane's worker.
  SLOTSTREAM_RETURN_IF_ERROR(fabric::check_memlock(
      context->spec(), fabric::pinned_estimate() + local_size + fabric::worker_pinned_bytes(context->spec()),
      "the send blocks (--blocks x --block-size) and UCX's buffers of this connection's worker"));
  // Always with a wake-up fd: a thread that waits for an operation's answer (a status read over
  // tcp is a round trip to the receiver's progress thread) sleeps until it comes (Request::wait).
  SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(*context, /*shared=*/false, /*wakeup=*/true, &worker_));
  // While it connects (and over rdma reads a word of ours), a receiver that closes the connection
  // ends the wait.
  const fabric::Liveness receiver_there = [this]() -> Status {
    return control_->check_alive().code() == Code::kPeerGone
               ? Status{Code::kPeerGone, "the receiver closed the connection during set-up"}
               : Status::ok();
  };
  if (Status st =
          fabric::Endpoint::create(*worker_, accept.worker_address, control_->peer_host(), &endpoint_, receiver_there);
      !st.is_ok()) {
    if (control_->check_alive().code() == Code::kPeerGone) {
      return {Code::kPeerGone,
              "the receiver closed the connection while the transport was set up (" + st.message() + ")"};
    }
    return unreachable(st);
  }
  // From here a read nothing answers while the receiver keeps talking (a response the NIC lost) ends
  // the lane after the stall timeout, as a receiver that says nothing does, instead of a wait for ever
  // (Request::wait).
  worker_->set_read_timeout(options.stall_timeout);
  if (!endpoint_->lanes().empty()) owner_.connected_over(endpoint_->lanes());
  SLOTSTREAM_RETURN_IF_ERROR(check_lanes());
  if (Status st = fabric::MemoryRegion::allocate(*context, local_size, &local_); !st.is_ok()) {
    return {st.code(), "the send blocks (--blocks x --block-size): " + st.message()};
  }
  bool pack = false;
  SLOTSTREAM_RETURN_IF_ERROR(protocol::packs(desc, owner_.protocol_options(), &pack));
  ring_ = std::make_unique<stream::SendRing>(local_->data(), options.blocks, options.block_size, pack);
  if (desc.sender_wakeup) {
    // Idle, the sending thread sleeps where the peer's operations wake it (Descriptor).
    // Waiting for an event progresses the worker: only with the transmit token; a filler that
    // reserves or commits meanwhile wakes it (SendRing::begin_sleep).
    fabric::Worker* w = worker_.get();
    stream::SendRing* r = ring_.get();
    ring_->set_sleeper({[w, r](std::chrono::microseconds t) {
                          if (!r->try_take_token()) return std::this_thread::sleep_for(std::min(t, kTokenTakenNap));
                          if (r->begin_sleep()) {
                            (void)w->wait_for_event(t);
                            r->end_sleep();
                          }
                          (void)r->give_token();  // work left is seen by wait_work at once
                        },
                        [w] { w->signal(); }});
  }
  // A filler that may have to transmit, or that waits for a block, takes the token if it is free.
  ring_->set_helper([this] { (void)help(); });
  proto_fabric_.reset(new protocol::SenderFabric{*context,
                                                 *worker_,
                                                 *endpoint_,
                                                 {options.blocks, options.block_size},
                                                 [this] { return alive_st(); },
                                                 accept.worker_address,
                                                 control_->peer_host()});
  return desc.make_sender(*proto_fabric_, accept.setup, protocol::protocol_options(owner_.protocol_options()), &proto_);
}

// Over rdma, the lanes UCX chose (fabric::Endpoint::lanes): a protocol whose receiver takes no part
// (status_byte) needs puts and gets in hardware. Emulated ones (a user's UCX_TLS without rc or dc,
// e.g. ud_verbs) are answered by the receiver's worker, which no one progresses there: every put
// would wait forever. Refused with the reason instead.
Status SenderLane::check_lanes() const {
  const fabric::Context& context = worker_->context();
  if (context.transport() != Transport::kRdma || endpoint_->rma_one_sided()) return Status::ok();
  const protocol::Descriptor& desc = owner_.descriptor();
  if (desc.receiver_progress || context.traits().target_progress) return Status::ok();
  std::string overrides;
  for (const std::string& line : context.ucx_overrides()) overrides += "; " + line;
  return {Code::kInvalidArgument,
          "UCX chose no lane that puts in hardware (lanes: " + endpoint_->lanes() + overrides +
              "): " + std::string(desc.name) + "'s receiver takes no part over " + fabric::spec_name(context.spec()) +
              ", so puts emulated with messages would never complete. Let UCX use rc or dc (unset UCX_TLS, or "
              "include rc_verbs/rc_mlx5), or use --rdma-transport ud, whose receiver takes part"};
}

// A receiver UCX cannot connect to: on rdma, what to look at.
Status SenderLane::unreachable(const Status& st) const {
  const fabric::FabricSpec& spec = worker_->context().spec();
  if (spec.transport != Transport::kRdma) return st;
  return {st.code(), "UCX cannot reach the receiver over " + fabric::spec_name(spec) + " (" + st.message() +
                         "): are both NICs on one fabric (one InfiniBand subnet, or RoCE with a routable GID on both "
                         "ends: UCX_IB_GID_INDEX)? docs/rdma.md"};
}

}  // namespace slotstream::session
