#include "session/sender_lane.h"

#include <algorithm>

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
constexpr Millis kConnectTimeout{5000};
constexpr auto kLivenessInterval = Millis(1);
// After FIN_ACK: how long a sender whose memory the receiver reads waits for it to let go.
constexpr auto kLetGoTimeout = Millis(2000);
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

Status explain_transmit_error(Status st) {
  if (st.code() == Code::kPeerGone && st.message().find("receiver") == std::string::npos) {
    return {Code::kPeerGone, "lost the receiver (did it die?): " + st.message()};
  }
  return st;
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
  SLOTSTREAM_RETURN_IF_ERROR(net::ControlSocket::connect(host, port, kConnectTimeout, &control_));
  hello.lane = index_;
  hello.devices = devices_;
  const SenderOptions& options = owner_.sender_options();
  if (!options.first_message.empty()) {
    hello.flags |= wire::kHelloNumbered;
    for (uint16_t d : devices_) hello.first.push_back(options.first_message.at(d));
  }
  if (options.confirm_stored) hello.flags |= wire::kHelloConfirm;
  SLOTSTREAM_RETURN_IF_ERROR(net::make_nonce(&hello.nonce));
  return handshake(hello);
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

// HELLO, then CHALLENGE/AUTH when the receiver asks, ACCEPT (verified when we have a token),
// our SETUP, READY (wire/control.h, net/auth.h).
Status SenderLane::handshake(const wire::Hello& hello) {
  const SenderOptions& options = owner_.sender_options();
  const std::vector<uint8_t> hello_bytes = wire::encode(hello);
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kHello, hello_bytes));
  wire::Frame frame;
  SLOTSTREAM_RETURN_IF_ERROR(control_->receive(kHandshakeTimeout, &frame));
  std::optional<net::Nonce> receiver_nonce;
  if (frame.type == wire::MsgType::kChallenge) {
    if (frame.body.size() != wire::kNonceSize) return {Code::kProtocolError, "malformed challenge"};
    if (options.token.empty()) {
      return {Code::kAuthFailed, "authentication failed: the receiver requires a token (--token-file)"};
    }
    receiver_nonce.emplace();
    std::copy(frame.body.begin(), frame.body.end(), receiver_nonce->begin());
    auto mac = hello_proof(options.token, *receiver_nonce, hello.nonce, hello_bytes);
    SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kAuth, mac));
    SLOTSTREAM_RETURN_IF_ERROR(control_->receive(kHandshakeTimeout, &frame));
  }
  if (frame.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &refuse));
    return {refuse.code, "receiver refused: " + refuse.message};
  }
  if (frame.type != wire::MsgType::kAccept) {
    return {Code::kProtocolError, "unexpected control message " + std::to_string(int(frame.type))};
  }
  wire::Accept accept;
  SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &accept));
  if (!options.token.empty()) {
    // Our data goes only to a receiver that proves it has the token too.
    if (!receiver_nonce) {
      return {Code::kAuthFailed,
              "authentication failed: the receiver did not ask for the token, so it cannot prove "
              "it is the receiver you share it with (start it with --token-file)"};
    }
    if (!net::mac_equal(accept.proof, accept_proof(options.token, *receiver_nonce, hello.nonce, hello_bytes, accept))) {
      return {Code::kAuthFailed, "authentication failed: the receiver's answer is not signed with the token"};
    }
  }
  SLOTSTREAM_RETURN_IF_ERROR(setup_fabric(accept));

  wire::Setup setup;
  setup.worker_address = worker_->address();
  setup.setup = proto_->setup();
  if (receiver_nonce) {
    auto mac = setup_proof(options.token, *receiver_nonce, hello.nonce, setup);
    setup.proof.assign(mac.begin(), mac.end());
  }
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kSetup, wire::encode(setup)));
  std::vector<uint8_t> body;
  Status st = control_->expect(wire::MsgType::kReady, kHandshakeTimeout, &body);
  if (!st.is_ok()) return {st.code(), "receiver did not complete the set-up: " + st.message()};
  return Status::ok();
}

Status SenderLane::setup_fabric(const wire::Accept& accept) {
  const SenderOptions& options = owner_.sender_options();
  const protocol::Descriptor& desc = owner_.descriptor();
  const Transport t = accept.transport;
  fabric::Context* context = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(owner_.shared_context(t, &context));
  // Always with a wake-up fd: a thread that waits for an operation's answer (a status read over
  // tcp is a round trip to the receiver's progress thread) sleeps until it comes (Request::wait).
  SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(*context, /*shared=*/false, /*wakeup=*/true, &worker_));
  SLOTSTREAM_RETURN_IF_ERROR(fabric::Endpoint::create(*worker_, accept.worker_address, &endpoint_));
  const size_t local_size = size_t(options.blocks) * options.block_size;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate(*context, local_size, &local_));
  ring_ = std::make_unique<stream::SendRing>(local_->data(), options.blocks, options.block_size);
  if (desc.sender_wakeup) {
    // Idle, the sending thread sleeps where the peer's operations wake it (Descriptor).
    // Waiting for an event progresses the worker: only with the transmit token.
    fabric::Worker* w = worker_.get();
    stream::SendRing* r = ring_.get();
    ring_->set_sleeper({[w, r](std::chrono::microseconds t) {
                          if (!r->try_take_token()) return std::this_thread::sleep_for(std::min(t, kTokenTakenNap));
                          (void)w->wait_for_event(t);
                          r->give_token();
                        },
                        [w] { w->signal(); }});
  }
  // A filler that waits for a block helps complete the transfers holding the blocks.
  ring_->set_claim_helper([this] { help_complete(); });
  proto_fabric_.reset(new protocol::SenderFabric{
      *context, *worker_, *endpoint_, {options.blocks, options.block_size}, [this] { return alive_st(); }});
  return desc.make_sender(*proto_fabric_, accept.setup, owner_.protocol_options(), &proto_);
}

// Rate-limited: one poll() of the control socket per millisecond at most.
Status SenderLane::alive_st() {
  // A sender failed or cancelled (Sender::cancel) elsewhere: waits inside the protocol end here.
  if (owner_.failed()) return owner_.first_error();
  auto now = Clock::now();
  if (now < next_liveness_) return Status::ok();
  next_liveness_ = now + kLivenessInterval;
  if (endpoint_->failed()) return {Code::kPeerGone, "receiver unreachable (transport error: did it die?)"};
  Status st = control_->check_alive();
  if (st.code() == Code::kPeerGone) return {Code::kPeerGone, "receiver closed the connection (did it die?)"};
  if (st.code() == Code::kInProgress) {  // a frame is waiting
    wire::Frame frame;
    SLOTSTREAM_RETURN_IF_ERROR(control_->receive(Millis(1000), &frame));
    return control_frame(frame);
  }
  return Status::ok();
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
  if (frame.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &refuse));
    return {refuse.code, "receiver ended the connection: " + refuse.message};
  }
  return {Code::kProtocolError, "unexpected control message " + std::to_string(int(frame.type)) + " while sending"};
}

// With the token: transmits the filled blocks from the cursor on, in ring order (at most one
// ring's worth, so a filler that holds the token goes back to filling), then reaps finished
// transfers. `*sent`: blocks handed to the protocol.
Status SenderLane::transmit_filled_st(size_t* sent) {
  *sent = 0;
  for (uint32_t n = 0; n < ring_->blocks(); ++n) {
    const int64_t len = ring_->next_length();
    if (len < 0) break;
    const uint64_t ticket = ring_->cursor();
    ring_->advance();
    if (len == 0) {  // a filler gave up on this block: nothing to send
      ring_->release(ticket);
      continue;
    }
    fabric::Request req;
    SLOTSTREAM_RETURN_IF_ERROR(proto_->transmit_st(ring_->block(ticket), size_t(len), &req));
    if (stream::tracing()) {
      if (auto h = wire::decode_block_header(
              std::span<const std::byte, wire::kBlockHeaderSize>(ring_->block(ticket), wire::kBlockHeaderSize),
              size_t(len) - wire::kBlockHeaderSize)) {
        stream::trace(stream::TraceStage::kPosted, h->device, h->packet);
      }
    }
    if (req.pending()) {
      inflight_.emplace_back(ticket, std::move(req));
    } else {
      ring_->release(ticket);
    }
    ++*sent;
    if ((++transmitted_ & 63) == 0) {
      SLOTSTREAM_RETURN_IF_ERROR(alive_st());
      held_skips_live_.store(proto_->held_skips_st(), std::memory_order_relaxed);
    }
  }
  // Transfers that complete only through this worker's progress (a rendezvous tagged send, a tcp
  // put) advance now, by whoever transmitted them: a filler holding the token would otherwise
  // leave them to the sending thread's next turn.
  if (!inflight_.empty()) worker_->progress();
  return reap_st();
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

// A filler committed a block. If no one transmits right now, transmit from this thread: the
// put leaves without waking the sending thread (the latency path, stream/send_ring.h). Otherwise
// the token's holder sees the block when it gives the token back.
Status SenderLane::transmit_committed() {
  if (!ring_->try_take_token()) {
    ring_->wake_sender();  // the holder may be the sending thread asleep in its worker
    return Status::ok();
  }
  size_t sent = 0;
  return leave_token(transmit_filled_st(&sent));
}

void SenderLane::help_complete() {
  if (!in_flight_.load(std::memory_order_relaxed) || !ring_->try_take_token()) return;
  worker_->progress();
  (void)leave_token(reap_st());  // an error aborts the waiting fillers
}

// A filler's turn with the token ends: blocks left over (the pass is bounded, or committed
// meanwhile) and transfers that need the worker progressed to complete (tcp, rendezvous) are the
// sending thread's; an error of the turn fails the sender, and every filler returns it.
Status SenderLane::leave_token(Status st) {
  if (ring_->give_token() || needs_watcher()) ring_->wake_sender();
  if (st.is_ok()) return st;
  owner_.fail(explain_transmit_error(st));
  return owner_.first_error();
}

// The sending thread: transmits whatever the fillers leave to it, and otherwise does the lane's
// idle work with the token (progresses the worker, the protocol's timers, completions, the
// receiver's liveness), about every millisecond, until finish().
Status SenderLane::sending_thread_st() {
  bool moved = false;  // the last turn transmitted: spin for the next block rather than sleep
  std::chrono::microseconds period = kIdlePeriod;
  uint64_t last_cursor = 0;
  Clock::time_point last_activity = Clock::now();
  std::chrono::microseconds token_nap = kTokenTakenNap;
  for (;;) {
    (void)ring_->wait_next(moved ? kBusySpin : kIdleSpin, period);
    if (owner_.failed()) return Status::ok();  // reported by its thread
    if (!ring_->try_take_token()) {            // a filler is transmitting
      ring_->nap(token_nap);
      token_nap = std::min(2 * token_nap, kMaxTokenTakenNap);
      moved = false;
      continue;
    }
    token_nap = kTokenTakenNap;
    size_t sent = 0;
    Status st = transmit_filled_st(&sent);
    if (st.is_ok() && sent == 0) {  // idle
      worker_->progress();
      st = proto_->idle_st();
      if (st.is_ok()) st = reap_st();
      if (st.is_ok()) st = alive_st();
    }
    SLOTSTREAM_RETURN_IF_ERROR(st);  // keeps the token: the lane is done
    if (finishing_.load(std::memory_order_acquire) && ring_->cursor() == ring_->claimed()) break;
    const auto now = Clock::now();
    if (ring_->cursor() != last_cursor) {  // someone transmitted since the last turn
      last_cursor = ring_->cursor();
      last_activity = now;
    }
    watching_inflight_.store(!inflight_.empty(), std::memory_order_relaxed);
    period = sending_idle_period(!inflight_.empty(), proto_->holding_st(), now - last_activity);
    moved = sent > 0;
    ring_->give_token();  // a block committed meanwhile is seen at once by wait_next
  }
  for (auto& [t, req] : inflight_) SLOTSTREAM_RETURN_IF_ERROR(req.wait(*worker_, [this] { return alive_st(); }));
  inflight_.clear();
  return proto_->finish_st();
}

void SenderLane::sending_loop_st() {
  if (Status st = explain_transmit_error(sending_thread_st()); !st.is_ok()) owner_.fail(st);
}

// Tells the receiver how many messages of each device it must have, and waits until it has
// stored them all (a full disk may make that take a while).
Status SenderLane::fin() {
  wire::Fin fin;
  for (uint16_t d : devices_) fin.messages[d] = owner_.messages_sent(d);
  SLOTSTREAM_RETURN_IF_ERROR(control_->send(wire::MsgType::kFin, wire::encode(fin)));
  // A receiver that reaches into this sender (Descriptor::receiver_endpoint) reads from us until
  // it has let go of our memory: where UCX emulates its reads (tcp) our worker must answer them,
  // so it is progressed here (the sending thread has ended) until the receiver closes the
  // connection — which it does after it freed its half of the protocol.
  const bool answer = owner_.descriptor().receiver_endpoint;
  wire::Frame frame;
  for (;;) {
    // Short waits: a sender cancelled meanwhile (Sender::cancel) stops waiting within 100 ms.
    Status st = control_->receive(answer ? Millis(1) : Millis(100), &frame);
    if (st.code() == Code::kTimeout) {
      if (answer) worker_->progress();
      SLOTSTREAM_RETURN_IF_ERROR(owner_.first_error());
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
