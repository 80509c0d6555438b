#include "session/sender_lane.h"

#include <algorithm>
#include <cstdio>
#include <set>

#include "common.h"
#include "net/auth.h"
#include "session/handshake.h"
#include "stream/trace.h"
#include "wire/block_header.h"

namespace slotstream::session {

using Clock = std::chrono::steady_clock;
using net::Millis;

namespace {
constexpr Millis kHandshakeTimeout{10000};
// The first answer to HELLO (CHALLENGE, ACCEPT or REFUSE): a receiver sends it once its blocks are
// set up; nothing by then means nothing that speaks slotstream listens there (docs/cli-contract.md).
constexpr Millis kFirstAnswerTimeout{5000};
constexpr Millis kConnectTimeout{5000};
constexpr auto kLivenessInterval = Millis(1);
// After FIN_ACK: how long a sender whose memory the receiver reads waits for it to let go.
constexpr auto kLetGoTimeout = Millis(2000);
// After a transport error, how long the receiver's reason (REFUSE) may lag it on the control connection.
constexpr auto kRefusalWait = Millis(200);
// How long the sending thread waits for a filled block before calling the protocol's idle_st():
// normally ~1 ms; while the protocol holds records back (SenderProtocol::holding_st) much sooner.
constexpr auto kIdlePeriod = std::chrono::microseconds(1000);
// Once nothing was transmitted for kLongIdle, every kLongIdlePeriod: the sending thread's idle
// turns are all an idle connection costs (fillers transmit themselves; finish() wakes it).
constexpr auto kLongIdle = std::chrono::milliseconds(100);
constexpr auto kLongIdlePeriod = std::chrono::milliseconds(20);
constexpr auto kHoldingIdlePeriod = std::chrono::microseconds(50);
constexpr auto kInFlightPeriod = std::chrono::microseconds(20);
// How long the sending thread spins for the next block before it sleeps: long while it moves
// data itself (a sleep would cost a futex wake per block), short once fillers transmit or the
// lane is idle — an idle sending thread then costs ~nothing.
constexpr auto kBusySpin = std::chrono::microseconds(50);
constexpr auto kIdleSpin = std::chrono::microseconds(2);
// The sending thread found the token taken (a filler transmits, maybe waiting for a free block):
// it naps, twice as long each time it finds it taken again, up to kMaxTokenTakenNap — a filler
// that waits for a stalled receiver keeps the token for as long as the stall lasts, and a 20 µs
// poll of it cost a sixth of a core. The holder wakes the nap when it leaves work behind.
constexpr auto kTokenTakenNap = std::chrono::microseconds(20);
constexpr auto kMaxTokenTakenNap = std::chrono::microseconds(1000);
}  // namespace

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
  // with our worker's help; tcp: through our listener, fabric/cm.h).
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

// Rate-limited: one poll() of the control socket per millisecond at most.
Status SenderLane::alive_st() {
  // A sender failed or cancelled (Sender::abort) elsewhere: waits inside the protocol end here.
  if (owner_.failed()) return owner_.first_error();
  auto now = Clock::now();
  if (now < next_liveness_) return Status::ok();
  next_liveness_ = now + kLivenessInterval;
  // The sender failed elsewhere (another lane, Sender::abort): a wait for receiver space ends here too.
  if (owner_.failed()) return owner_.first_error();
  if (endpoint_->failed()) return receiver_lost("transport error: " + endpoint_->failure().message());
  Status st = control_->check_alive();
  if (st.code() == Code::kPeerGone) return receiver_lost("it closed the connection");
  if (st.code() == Code::kInProgress) {  // a frame is waiting
    wire::Frame frame;
    SLOTSTREAM_RETURN_IF_ERROR(control_->receive(Millis(1000), &frame));
    return control_frame(frame);
  }
  return check_silence(now);
}

// A receiver process that is stopped (SIGSTOP), hung or cut off keeps its connection open and its
// blocks full: only its silence shows it (control version 8: a live one sends KEEPALIVE every
// second, whatever else it does). Checked only when no frame waits to be read.
Status SenderLane::check_silence(Clock::time_point now) const {
  const auto limit = owner_.sender_options().stall_timeout;
  if (limit.count() == 0 || now - control_->last_received() <= limit) return Status::ok();
  const auto silent = std::chrono::duration_cast<Millis>(now - control_->last_received());
  char what[200];
  std::snprintf(what, sizeof what,
                "it has said nothing for %.1f s, not even the keepalive a live receiver sends every second: it is "
                "stopped, hung or cut off (stall timeout %.1f s)",
                silent.count() / 1000.0, limit.count() / 1000.0);
  return receiver_lost(what);
}

Status SenderLane::control_frame(const wire::Frame& frame) {
  if (frame.type == wire::MsgType::kPause) {
    wire::Pause pause;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &pause));
    owner_.set_paused(pause.device, pause.paused);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kStored) {
    wire::Stored stored;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &stored));
    owner_.on_stored(stored);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kKeepalive) return wire::decode_keepalive(frame.body);
  if (frame.type == wire::MsgType::kNumbered) {
    wire::Numbered answer;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &answer));
    owner_.on_numbered(answer);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &refuse));
    // A stopping receiver says "the receiver stopped[: why]" (ReceiverSession::tell_stopped).
    if (refuse.code == Code::kPeerGone) return receiver_lost(refuse.message);
    return {refuse.code, "receiver ended the connection: " + refuse.message};
  }
  return {Code::kProtocolError, "unexpected control message " + std::to_string(int(frame.type)) + " while sending"};
}

// A receiver that stops says so (REFUSE) before it frees the memory this lane writes; what fails
// here next (over tcp: "the peer refused the read (outside its registered memory)", a status read
// into memory no longer registered) is only the consequence. Its REFUSE may arrive a little after
// the data path's error (two connections): waited for up to kRefusalWait. A sender cancelled here
// (Sender::abort) has nothing to hear.
Status SenderLane::receiver_said_st(Status st) {
  if (st.is_ok() || st.code() == Code::kCancelled || !control_) return st;
  const auto until = Clock::now() + kRefusalWait;
  for (;;) {
    const auto left = std::chrono::duration_cast<Millis>(until - Clock::now());
    wire::Frame frame;
    if (!control_->receive(std::max(left, Millis(1)), &frame).is_ok()) return st;  // nothing said: closed, or quiet
    Status said = control_frame(frame);                                            // PAUSE and STORED apply as ever
    if (frame.type == wire::MsgType::kRefuse) return said;
    if (Clock::now() >= until) return st;
  }
}

// With the token: transmits units from the cursor on, in ticket order (at most a ring's worth, so
// that a filler holding the token goes back to filling), then reaps finished transfers.
Status SenderLane::drain_st(bool filler, bool wait_whole, size_t budget, size_t* sent, bool* handed) {
  *sent = 0;
  *handed = false;
  for (size_t n = 0; ring_->has_work(); ++n) {
    if (n == budget) {
      if (filler) {  // its share done: the sending thread goes on, the filler goes back to filling
        ring_->hand_to_sender();
        *handed = true;
      }
      break;
    }
    // No receiver room: a filler does not wait where records pack (the lane is busy: others'
    // records pack meanwhile); the sending thread waits before it seals the open block, so that
    // they leave with it. A block claimed whole (a large record, pack=off) has nothing to gain from
    // the hand-off: its filler waits itself, as the paper's sender does. Handing it over would make the
    // sending thread a third busy thread beside the filler and the receiver — on two cores 64 KiB
    // at 3 blocks falls from ~29 to ~3.5 GB/s in most runs (docs/benchmarks.md). Not a filler with a deadline
    // (`wait_whole` false): the protocol's wait cannot give up in time, so it hands over as before.
    if (filler) {
      bool ready = true;
      SLOTSTREAM_RETURN_IF_ERROR(proto_->space_st(&ready));
      if (!ready && !(wait_whole && ring_->whole_at_cursor())) {
        ring_->hand_to_sender();
        *handed = true;
        break;
      }
      if (!ready) SLOTSTREAM_RETURN_IF_ERROR(proto_->wait_space_st());
    } else {
      SLOTSTREAM_RETURN_IF_ERROR(proto_->wait_space_st());
    }
    stream::SendRing::Unit unit;
    if (!ring_->next_unit(&unit, /*seal_open=*/true)) break;
    SLOTSTREAM_RETURN_IF_ERROR(send_unit_st(unit));
    ++*sent;
  }
  // A filler that handed the lane to the sending thread holds nothing any more: from the hand-off on
  // the worker and the transfers in flight are that thread's (two threads in ucp_worker_progress
  // abort UCX: "Assertion `worker->inprogress++ == 0' failed", seen over tcp with 12 cameras).
  if (*handed) return Status::ok();
  // Transfers that complete only through this worker's progress (a rendezvous tagged send, a tcp
  // put) advance now, by whoever transmitted them: a filler holding the token would otherwise
  // leave them to the sending thread's next turn.
  if (!inflight_.empty()) worker_->progress();
  return reap_st();
}

Status SenderLane::send_unit_st(const stream::SendRing::Unit& unit) {
  ring_->advance();
  if (unit.length == 0) {  // nothing in it (a fill gave up): free the block unsent
    ring_->release(unit.ticket);
    return Status::ok();
  }
  fabric::Request req;
  SLOTSTREAM_RETURN_IF_ERROR(proto_->transmit_st(unit.data, unit.length, &req));
  records_ += unit.records;
  ++units_;
  packed_ |= unit.packed;
  if (stream::tracing()) {
    wire::UnitReader reader({unit.data, unit.length});
    for (wire::UnitReader::Item item; reader.next(&item);) {
      if (!item.header.is_void()) stream::trace(stream::TraceStage::kPosted, item.header.device, item.header.packet);
    }
  }
  if (req.pending()) {
    inflight_.emplace_back(unit.ticket, std::move(req));
  } else {
    ring_->release(unit.ticket);
  }
  if ((++transmitted_ & 63) == 0) {
    SLOTSTREAM_RETURN_IF_ERROR(alive_st());
    held_skips_live_.store(proto_->held_skips_st(), std::memory_order_relaxed);
  }
  return Status::ok();
}

// Frees the blocks of finished transfers, oldest first (their completions come in order).
Status SenderLane::reap_st() {
  while (!inflight_.empty()) {
    Status st = inflight_.front().second.check();
    if (st.code() == Code::kInProgress) break;
    SLOTSTREAM_RETURN_IF_ERROR(st);
    ring_->release(inflight_.front().first);
    inflight_.pop_front();
  }
  in_flight_.store(!inflight_.empty(), std::memory_order_relaxed);
  return Status::ok();
}

// A filler may have to transmit. If no one holds the token, transmit from this thread: a lone
// message leaves without waking the sending thread (the latency path, stream/send_ring.h).
// Otherwise the holder sees the work before it can give the token back.
Status SenderLane::help(bool wait_whole) {
  // A filler transmits at most a ring's worth of units in one call, then goes back to filling.
  size_t budget = ring_->blocks();
  for (;;) {
    bool holder_sleeps = false;
    if (!ring_->try_take_token(&holder_sleeps)) {
      if (holder_sleeps) ring_->wake_sender();  // the sending thread waits in its worker with it
      return Status::ok();
    }
    size_t sent = 0;
    bool handed = false;
    Status st = drain_st(/*filler=*/true, wait_whole, budget, &sent, &handed);
    if (handed && st.is_ok()) return st;  // the token went to the sending thread
    if (!st.is_ok() || !ring_->give_token()) return leave_token(st);
    // Work arrived that relied on us while we held the token: take it again (the sending thread
    // gets it once our share is done: drain_st hands it over on an empty budget).
    budget -= std::min(budget, sent);
  }
}

// A filler's turn with the token ended (given back): transfers that need the worker progressed to
// complete (tcp, rendezvous) are the sending thread's; an error of the turn fails the sender, and
// every filler returns it.
Status SenderLane::leave_token(Status st) {
  if (needs_watcher()) ring_->wake_sender();
  if (st.is_ok()) return st;
  owner_.fail(explain_transmit_error(receiver_said_st(st)));
  return owner_.first_error();
}

bool SenderLane::linger_st() {
  const auto until = Clock::now() + kBusySpin;
  for (int i = 0;; ++i) {
    if (ring_->has_work()) return true;
    if ((i & 15) == 15 && Clock::now() >= until) return false;
    if (i >= 16) std::this_thread::yield();
  }
}

// The sending thread: transmits what fillers hand to it (the receiver had no room, or a filler
// sent a ring's worth), keeps the token for a moment after it moved data (fillers pack meanwhile),
// and otherwise does the lane's idle work with the token (progresses the worker, the protocol's
// timers, completions, the receiver's liveness), about every millisecond, until finish().
Status SenderLane::sending_thread_st() {
  bool moved = false;  // the last turn transmitted: spin for the next unit rather than sleep
  bool holding = false;
  std::chrono::microseconds period = kIdlePeriod;
  uint64_t last_cursor = 0;
  Clock::time_point last_activity = Clock::now();
  std::chrono::microseconds token_nap = kTokenTakenNap;
  for (;;) {
    if (!holding) {
      (void)ring_->wait_work(moved ? kBusySpin : kIdleSpin, period);
      if (owner_.failed()) return Status::ok();  // reported by its thread
      holding = ring_->take_handoff() || ring_->try_take_token();
      if (!holding) {  // a filler is transmitting
        ring_->nap(token_nap);
        token_nap = std::min(2 * token_nap, kMaxTokenTakenNap);
        moved = false;
        continue;
      }
    }
    token_nap = kTokenTakenNap;
    size_t sent = 0;
    bool handed = false;
    packed_ = false;
    Status st = drain_st(/*filler=*/false, /*wait_whole=*/false, ring_->blocks(), &sent, &handed);
    if (st.is_ok() && sent == 0) {  // idle
      worker_->progress();
      st = proto_->idle_st();
      if (st.is_ok()) st = reap_st();
      if (st.is_ok()) st = alive_st();
    }
    SLOTSTREAM_RETURN_IF_ERROR(st);  // keeps the token: the lane is done
    if (owner_.failed()) return Status::ok();
    if (finishing_.load(std::memory_order_acquire) && ring_->drained()) break;
    const auto now = Clock::now();
    if (ring_->cursor() != last_cursor) {  // someone transmitted since the last turn
      last_cursor = ring_->cursor();
      last_activity = now;
    }
    watching_inflight_.store(!inflight_.empty(), std::memory_order_relaxed);
    period = sending_idle_period(!inflight_.empty(), proto_->holding_st(), now - last_activity);
    moved = sent > 0;
    // After small messages it keeps the token a moment, so that the next ones pack; whole blocks
    // (large messages) gain nothing from that: their fillers transmit themselves again.
    if (moved && packed_ && linger_st()) continue;  // still holding: the next unit is already there
    holding = ring_->give_token();                  // work that relied on us: keep going (we retake it below)
    if (holding) holding = ring_->try_take_token();
  }
  for (auto& [t, req] : inflight_) SLOTSTREAM_RETURN_IF_ERROR(req.wait(*worker_, [this] { return alive_st(); }));
  inflight_.clear();
  return proto_->finish_st();
}

void SenderLane::sending_loop_st() {
  if (Status st = explain_transmit_error(receiver_said_st(sending_thread_st())); !st.is_ok()) owner_.fail(st);
}

// The socket's frames are sent by one thread at a time: this one's, while the sending thread only
// receives (fin() comes after the sending thread ended).
Status SenderLane::number(const wire::Number& number) {
  return control_->send(wire::MsgType::kNumber, wire::encode(number));
}

// Tells the receiver how many messages of each device it must have, and waits until it has
// stored them all (a full disk may make that take a while).
Status SenderLane::fin() {
  wire::Fin fin;
  for (uint16_t d : devices_) fin.messages[d] = owner_.messages_sent(d);
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kFin, wire::encode(fin)));
  fabric::test_stop_point("fin");
  // A receiver that reaches into this sender (Descriptor::receiver_endpoint) reads from us until
  // it has let go of our memory: where UCX emulates its reads (tcp) our worker must answer them,
  // so it is progressed here (the sending thread has ended) until the receiver closes the
  // connection — which it does after it freed its half of the protocol.
  const bool answer = owner_.descriptor().receiver_endpoint;
  wire::Frame frame;
  for (;;) {
    // Short waits: a sender cancelled meanwhile (Sender::abort) stops waiting within 100 ms.
    Status st = control_->receive(answer ? Millis(1) : Millis(100), &frame);
    if (st.code() == Code::kTimeout) {
      if (answer) worker_->progress();
      SLOTSTREAM_RETURN_IF_ERROR(owner_.first_error());
      SLOTSTREAM_RETURN_IF_ERROR(check_silence(Clock::now()));  // a receiver stopped before FIN_ACK
      continue;
    }
    if (st.code() == Code::kPeerGone) return {Code::kPeerGone, "receiver closed the connection before confirming"};
    SLOTSTREAM_RETURN_IF_ERROR(st);
    if (frame.type == wire::MsgType::kFinAck) break;
    SLOTSTREAM_RETURN_IF_ERROR(control_frame(frame));  // a device paused while the last messages are stored
  }
  wire::FinAck ack;
  SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &ack));
  if (answer) {
    for (const auto until = Clock::now() + kLetGoTimeout; Clock::now() < until;) {
      if (control_->receive(Millis(1), &frame).code() == Code::kPeerGone) break;
      worker_->progress();
    }
  }
  if (!ack.ok) return {Code::kIoError, "receiver reported: " + ack.message};
  return Status::ok();
}

}  // namespace slotstream::session
