// The sender: control handshake, the fabric, the send ring, and the one sending thread that owns
// the UCX worker (paper §3.2.4). Filler threads reach it only through DeviceStream.
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <condition_variable>
#include <thread>

#include "common.h"
#include "fabric/fabric.h"
#include "net/auth.h"
#include "net/control_socket.h"
#include "protocol/protocol.h"
#include "slotstream/slotstream.h"
#include "stream/fragment.h"
#include "stream/send_ring.h"
#include "stream/trace.h"
#include "wire/block_header.h"
#include "wire/control.h"

namespace slotstream {

using Clock = std::chrono::steady_clock;
using net::Millis;

namespace {
constexpr Millis kHandshakeTimeout{10000};
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
// The sending thread found the token taken (a filler transmits, maybe waiting for a free block).
constexpr auto kTokenTakenNap = std::chrono::microseconds(20);

wire::WireTransport to_wire_transport(Transport t) {
  switch (t) {
    case Transport::kShm: return wire::WireTransport::kShm;
    case Transport::kTcp: return wire::WireTransport::kTcp;
    default: return wire::WireTransport::kAuto;
  }
}

// Checks the options and resolves the protocol ("NAME[:key=value,...]").
Status validate(const SenderOptions& o, const protocol::Descriptor** desc, protocol::Options* proto_options) {
  if (auto why = invalid_sender_name(o.name)) return {Code::kInvalidArgument, *why + " ('" + o.name + "')"};
  if (o.block_size < kMinBlockSize || o.block_size > kMaxBlockSize) {
    return {Code::kInvalidArgument, "block size must be " + std::to_string(kMinBlockSize) + ".." +
                                        std::to_string(kMaxBlockSize) + " bytes"};
  }
  if (o.blocks < 1 || o.blocks > kMaxBlocks) {
    return {Code::kInvalidArgument, "blocks must be 1.." + std::to_string(kMaxBlocks)};
  }
  if (o.devices.empty()) return {Code::kInvalidArgument, "no devices declared"};
  std::string name;
  SLOTSTREAM_RETURN_IF_ERROR(protocol::Options::parse_spec(o.protocol, &name, proto_options));
  *desc = protocol::find(name);
  if (!*desc) return {Code::kInvalidArgument, "unknown protocol '" + name + "'"};
  if ((*desc)->reference && !o.allow_reference) {
    return {Code::kInvalidArgument, "'" + name + "' is a benchmark reference, not a protocol for data"};
  }
  return protocol::check_options(**desc, *proto_options);
}

}  // namespace

// One connection to the receiver: control socket, UCX endpoint, send ring, protocol and the
// sending thread that owns the lane's worker. Most protocols use one lane for every device;
// one that cannot share a connection between devices (sliding window) gets one lane per device.
struct Lane {
  Sender::Impl& owner;
  uint16_t index = 0;
  std::vector<uint16_t> devices;
  std::unique_ptr<net::ControlSocket> control;
  std::unique_ptr<fabric::Worker> worker;
  std::unique_ptr<fabric::Endpoint> endpoint;
  std::unique_ptr<fabric::MemoryRegion> local;
  std::unique_ptr<stream::SendRing> ring;
  std::unique_ptr<protocol::SenderFabric> proto_fabric;
  std::unique_ptr<protocol::SenderProtocol> proto;
  std::thread sending_thread;
  std::atomic<bool> finishing{false};
  std::atomic<uint64_t> held_skips_live{0};  // for progress displays while sending

  // Owned by whoever holds the ring's transmit token (the "_st" functions, protocol.h): the
  // worker, the protocol, and these.
  std::deque<std::pair<uint64_t, fabric::Request>> inflight;  // (ticket, transfer), oldest first
  uint64_t transmitted = 0;
  Clock::time_point next_liveness{};
  std::atomic<bool> in_flight{false};  // !inflight.empty(), for a filler leaving the token

  explicit Lane(Sender::Impl& o) : owner(o) {}
  Status handshake(const wire::Hello& hello);
  Status setup_fabric(const wire::Accept& accept);
  Status transmit_committed();
  Status transmit_filled_st(size_t* sent);
  Status reap_st();
  Status sending_thread_st();
  void sending_loop_st();
  Status alive_st();
  // A control frame from the receiver while data moves (PAUSE).
  Status control_frame(const wire::Frame& frame);
  Status fin();
};

struct Sender::Impl {
  SenderOptions options;
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  Transport transport = Transport::kShm;
  std::unique_ptr<fabric::Context> context;  // shared by the lanes
  std::vector<std::unique_ptr<Lane>> lanes;
  std::map<uint16_t, Lane*> lane_of;
  std::map<uint16_t, std::unique_ptr<DeviceStream>> devices;
  std::map<uint16_t, std::atomic<uint64_t>> messages;  // completed send()s per device
  std::atomic<uint64_t> bytes{0};

  // Devices the receiver paused (PAUSE: their worker is behind); fillers of others go on.
  std::mutex pause_mutex;
  std::condition_variable unpaused;
  std::set<uint16_t> paused;
  std::atomic<size_t> paused_count{0};  // paused.size(), read without the lock on every message

  std::mutex error_mutex;
  Status error;  // first error of any transmitting thread
  std::atomic<bool> failed{false};  // error is set
  std::atomic<bool> finishing{false};  // finish() was called (any thread)
  // The sending threads have been joined: their protocol counters may be read (stats()).
  std::atomic<bool> joined{false};

  void fail(Status st) {
    {
      std::lock_guard lock(error_mutex);
      if (error.is_ok()) error = std::move(st);
      failed.store(true, std::memory_order_release);
      for (auto& lane : lanes) {
        if (lane->ring) lane->ring->abort();
      }
    }
    std::lock_guard lock(pause_mutex);
    unpaused.notify_all();
  }
  void set_paused(uint16_t device, bool is_paused) {
    std::lock_guard lock(pause_mutex);
    if (is_paused) {
      paused.insert(device);
    } else {
      paused.erase(device);
      unpaused.notify_all();
    }
    paused_count.store(paused.size(), std::memory_order_release);
  }
  // Blocks a filler while the receiver has its device paused; the first error ends the wait.
  Status wait_unpaused(uint16_t device) {
    if (paused_count.load(std::memory_order_acquire) == 0) return Status::ok();  // the common case
    std::unique_lock lock(pause_mutex);
    unpaused.wait(lock, [&] { return !paused.contains(device) || !first_error().is_ok(); });
    return first_error();
  }
  Status first_error() {
    std::lock_guard lock(error_mutex);
    return error;
  }
  void join_all() {
    for (auto& lane : lanes) {
      lane->finishing.store(true, std::memory_order_release);
      if (lane->ring) lane->ring->wake_sender();  // it may be in a long idle sleep
      if (lane->sending_thread.joinable()) lane->sending_thread.join();
    }
  }
};

// HELLO, then CHALLENGE/AUTH when the receiver asks, ACCEPT (verified when we have a token),
// our SETUP, READY (wire/control.h, net/auth.h).
Status Lane::handshake(const wire::Hello& hello) {
  const SenderOptions& options = owner.options;
  const std::vector<uint8_t> hello_bytes = wire::encode(hello);
  SLOTSTREAM_RETURN_IF_ERROR(control->send(wire::MsgType::kHello, hello_bytes));
  wire::Frame frame;
  SLOTSTREAM_RETURN_IF_ERROR(control->receive(kHandshakeTimeout, &frame));
  std::optional<net::Nonce> receiver_nonce;
  if (frame.type == wire::MsgType::kChallenge) {
    if (frame.body.size() != wire::kNonceSize) return {Code::kProtocolError, "malformed challenge"};
    if (options.token.empty()) {
      return {Code::kAuthFailed, "authentication failed: the receiver requires a token (--token-file)"};
    }
    receiver_nonce.emplace();
    std::copy(frame.body.begin(), frame.body.end(), receiver_nonce->begin());
    auto mac = net::proof(options.token, "sender-hello", {*receiver_nonce, hello.nonce, hello_bytes});
    SLOTSTREAM_RETURN_IF_ERROR(control->send(wire::MsgType::kAuth, mac));
    SLOTSTREAM_RETURN_IF_ERROR(control->receive(kHandshakeTimeout, &frame));
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
      return {Code::kAuthFailed, "authentication failed: the receiver did not ask for the token, so it cannot prove "
                                 "it is the receiver you share it with (start it with --token-file)"};
    }
    auto mac = net::proof(options.token, "receiver-accept",
                          {*receiver_nonce, hello.nonce, hello_bytes, wire::signed_part(accept)});
    if (!net::mac_equal(accept.proof, mac)) {
      return {Code::kAuthFailed, "authentication failed: the receiver's answer is not signed with the token"};
    }
  }
  SLOTSTREAM_RETURN_IF_ERROR(setup_fabric(accept));

  wire::Setup setup;
  setup.worker_address = worker->address();
  setup.setup = proto->setup();
  if (receiver_nonce) {
    auto mac = net::proof(options.token, "sender-setup", {*receiver_nonce, hello.nonce, wire::signed_part(setup)});
    setup.proof.assign(mac.begin(), mac.end());
  }
  SLOTSTREAM_RETURN_IF_ERROR(control->send(wire::MsgType::kSetup, wire::encode(setup)));
  std::vector<uint8_t> body;
  Status st = control->expect(wire::MsgType::kReady, kHandshakeTimeout, &body);
  if (!st.is_ok()) return {st.code(), "receiver did not complete the set-up: " + st.message()};
  return Status::ok();
}

Status Lane::setup_fabric(const wire::Accept& accept) {
  const SenderOptions& options = owner.options;
  Transport t = accept.transport == wire::WireTransport::kTcp ? Transport::kTcp : Transport::kShm;
  if (!owner.context) {
    owner.transport = t;
    SLOTSTREAM_RETURN_IF_ERROR(fabric::Context::create(to_wire(t), &owner.context));
  } else if (t != owner.transport) {
    return {Code::kProtocolError, "receiver chose different transports for one sender's connections"};
  }
  fabric::Context& context = *owner.context;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::Worker::create(context, /*shared=*/false, owner.desc->sender_wakeup, &worker));
  SLOTSTREAM_RETURN_IF_ERROR(fabric::Endpoint::create(*worker, accept.worker_address, &endpoint));
  const size_t local_size = size_t(options.blocks) * options.block_size;
  SLOTSTREAM_RETURN_IF_ERROR(fabric::MemoryRegion::allocate(context, local_size, &local));
  ring = std::make_unique<stream::SendRing>(local->data(), options.blocks, options.block_size);
  if (owner.desc->sender_wakeup) {
    // Idle, the sending thread sleeps where the peer's operations wake it (Descriptor).
    // Waiting for an event progresses the worker: only with the transmit token.
    fabric::Worker* w = worker.get();
    stream::SendRing* r = ring.get();
    ring->set_sleeper({[w, r](std::chrono::microseconds t) {
                         if (!r->try_take_token()) return std::this_thread::sleep_for(std::min(t, kTokenTakenNap));
                         (void)w->wait_for_event(t);
                         r->give_token();
                       },
                       [w] { w->signal(); }});
  }
  proto_fabric.reset(new protocol::SenderFabric{context, *worker, *endpoint, {options.blocks, options.block_size},
                                                [this] { return alive_st(); }});
  return owner.desc->make_sender(*proto_fabric, accept.setup, owner.proto_options, &proto);
}

// Rate-limited: one poll() of the control socket per millisecond at most.
Status Lane::alive_st() {
  auto now = Clock::now();
  if (now < next_liveness) return Status::ok();
  next_liveness = now + kLivenessInterval;
  if (endpoint->failed()) return {Code::kPeerGone, "receiver unreachable (transport error: did it die?)"};
  Status st = control->check_alive();
  if (st.code() == Code::kPeerGone) return {Code::kPeerGone, "receiver closed the connection (did it die?)"};
  if (st.code() == Code::kInProgress) {  // a frame is waiting
    wire::Frame frame;
    SLOTSTREAM_RETURN_IF_ERROR(control->receive(Millis(1000), &frame));
    return control_frame(frame);
  }
  return Status::ok();
}

Status Lane::control_frame(const wire::Frame& frame) {
  if (frame.type == wire::MsgType::kPause) {
    wire::Pause pause;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &pause));
    owner.set_paused(pause.device, pause.paused);
    return Status::ok();
  }
  if (frame.type == wire::MsgType::kRefuse) {
    wire::Refuse refuse;
    SLOTSTREAM_RETURN_IF_ERROR(wire::decode(frame.body, &refuse));
    return {refuse.code, "receiver ended the connection: " + refuse.message};
  }
  return {Code::kProtocolError, "unexpected control message " + std::to_string(int(frame.type)) + " while sending"};
}

namespace {
// A transport error on tcp (e.g. "Endpoint timeout") is how UCX reports a dead receiver: say so.
Status explain_transmit_error(Status st) {
  if (st.code() == Code::kPeerGone && st.message().find("receiver") == std::string::npos) {
    return {Code::kPeerGone, "lost the receiver (did it die?): " + st.message()};
  }
  return st;
}
}  // namespace

// With the token: transmits the filled blocks from the cursor on, in ring order (at most one
// ring's worth, so a filler that holds the token goes back to filling), then reaps finished
// transfers. `*sent`: blocks handed to the protocol.
Status Lane::transmit_filled_st(size_t* sent) {
  *sent = 0;
  for (uint32_t n = 0; n < ring->blocks(); ++n) {
    const int64_t len = ring->next_length();
    if (len < 0) break;
    const uint64_t ticket = ring->cursor();
    ring->advance();
    if (len == 0) {  // a filler gave up on this block: nothing to send
      ring->release(ticket);
      continue;
    }
    fabric::Request req;
    SLOTSTREAM_RETURN_IF_ERROR(proto->transmit_st(ring->block(ticket), size_t(len), &req));
    if (stream::tracing()) {
      if (auto h = wire::decode_block_header(std::span<const std::byte, wire::kBlockHeaderSize>(
                                                 ring->block(ticket), wire::kBlockHeaderSize),
                                             size_t(len) - wire::kBlockHeaderSize)) {
        stream::trace(stream::TraceStage::kPosted, h->device, h->packet);
      }
    }
    if (req.pending()) {
      inflight.emplace_back(ticket, std::move(req));
    } else {
      ring->release(ticket);
    }
    ++*sent;
    if ((++transmitted & 63) == 0) {
      SLOTSTREAM_RETURN_IF_ERROR(alive_st());
      held_skips_live.store(proto->held_skips_st(), std::memory_order_relaxed);
    }
  }
  return reap_st();
}

// Frees the blocks of finished transfers, oldest first (their completions come in order).
Status Lane::reap_st() {
  while (!inflight.empty()) {
    Status st = inflight.front().second.check();
    if (st.code() == Code::kInProgress) break;
    SLOTSTREAM_RETURN_IF_ERROR(st);
    ring->release(inflight.front().first);
    inflight.pop_front();
  }
  in_flight.store(!inflight.empty(), std::memory_order_relaxed);
  return Status::ok();
}

// A filler committed a block. If no one transmits right now, transmit from this thread: the
// put leaves without waking the sending thread (the latency path, stream/send_ring.h). Otherwise
// the token's holder sees the block when it gives the token back.
Status Lane::transmit_committed() {
  if (!ring->try_take_token()) {
    ring->wake_sender();  // the holder may be the sending thread asleep in its worker
    return Status::ok();
  }
  size_t sent = 0;
  Status st = transmit_filled_st(&sent);
  // Blocks left over (the pass is bounded, or committed meanwhile) and transfers that need the
  // worker progressed to complete (tcp) are the sending thread's.
  if (ring->give_token() || in_flight.load(std::memory_order_relaxed)) ring->wake_sender();
  if (st.is_ok()) return st;
  owner.fail(explain_transmit_error(st));
  return owner.first_error();
}

// The sending thread: transmits whatever the fillers leave to it, and otherwise does the lane's
// idle work with the token (progresses the worker, the protocol's timers, completions, the
// receiver's liveness), about every millisecond, until finish().
Status Lane::sending_thread_st() {
  bool moved = false;  // the last turn transmitted: spin for the next block rather than sleep
  std::chrono::microseconds period = kIdlePeriod;
  uint64_t last_cursor = 0;
  Clock::time_point last_activity = Clock::now();
  for (;;) {
    (void)ring->wait_next(moved ? kBusySpin : kIdleSpin, period);
    if (owner.failed.load(std::memory_order_acquire)) return Status::ok();  // reported by its thread
    if (!ring->try_take_token()) {  // a filler is transmitting
      std::this_thread::sleep_for(kTokenTakenNap);
      moved = false;
      continue;
    }
    size_t sent = 0;
    Status st = transmit_filled_st(&sent);
    if (st.is_ok() && sent == 0) {  // idle
      worker->progress();
      st = proto->idle_st();
      if (st.is_ok()) st = reap_st();
      if (st.is_ok()) st = alive_st();
    }
    SLOTSTREAM_RETURN_IF_ERROR(st);  // keeps the token: the lane is done
    if (finishing.load(std::memory_order_acquire) && ring->cursor() == ring->claimed()) break;
    // Sooner while transfers are still in flight (tcp puts, rendezvous sends: only their
    // completion, which needs the worker progressed, can free a block for the fillers) or while
    // the protocol holds records back (holding_st: its idle_st() flushes them).
    const auto now = Clock::now();
    if (ring->cursor() != last_cursor) {  // someone transmitted since the last turn
      last_cursor = ring->cursor();
      last_activity = now;
    }
    period = !inflight.empty()                 ? kInFlightPeriod
             : proto->holding_st()             ? kHoldingIdlePeriod
             : now - last_activity > kLongIdle ? kLongIdlePeriod
                                               : kIdlePeriod;
    moved = sent > 0;
    ring->give_token();  // a block committed meanwhile is seen at once by wait_next
  }
  for (auto& [t, req] : inflight) SLOTSTREAM_RETURN_IF_ERROR(req.wait(*worker, [this] { return alive_st(); }));
  inflight.clear();
  return proto->finish_st();
}

void Lane::sending_loop_st() {
  if (Status st = explain_transmit_error(sending_thread_st()); !st.is_ok()) owner.fail(st);
}

// Tells the receiver how many messages of each device it must have, and waits until it has
// stored them all (a full disk may make that take a while).
Status Lane::fin() {
  wire::Fin fin;
  for (uint16_t d : devices) fin.messages[d] = owner.messages[d].load();
  SLOTSTREAM_RETURN_IF_ERROR(control->send(wire::MsgType::kFin, wire::encode(fin)));
  // A receiver that reaches into this sender (Descriptor::receiver_endpoint) reads from us until
  // it has let go of our memory: where UCX emulates its reads (tcp) our worker must answer them,
  // so it is progressed here (the sending thread has ended) until the receiver closes the
  // connection — which it does after it freed its half of the protocol.
  const bool answer = owner.desc->receiver_endpoint;
  wire::Frame frame;
  for (;;) {
    Status st = control->receive(answer ? Millis(1) : Millis(1000), &frame);
    if (st.code() == Code::kTimeout) {
      if (answer) worker->progress();
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
      if (control->receive(Millis(1), &frame).code() == Code::kPeerGone) break;
      worker->progress();
    }
  }
  if (!ack.ok) return {Code::kIoError, "receiver reported: " + ack.message};
  return Status::ok();
}

Sender::Sender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Sender::~Sender() {
  if (!impl_->finishing.load()) impl_->fail({Code::kCancelled, "sender closed before finish()"});
  impl_->join_all();
}

Status Sender::connect(const SenderOptions& options, std::unique_ptr<Sender>* out) {
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  SLOTSTREAM_RETURN_IF_ERROR(validate(options, &desc, &proto_options));
  std::unique_ptr<Sender> sender(new Sender(std::make_unique<Impl>()));
  Impl& im = *sender->impl_;
  im.options = options;
  im.desc = desc;
  im.proto_options = proto_options;

  // Group the devices into lanes (connections).
  std::vector<std::vector<uint16_t>> groups;
  if (desc->connection_per_device) {
    for (uint16_t d : options.devices) groups.push_back({d});
  } else {
    groups.push_back(options.devices);
  }
  if (groups.size() > 65535) return {Code::kInvalidArgument, "too many connections"};
  uint64_t group_id = 0;
  if (Status st = net::make_nonce_u64(&group_id); !st.is_ok()) return st;

  wire::Hello hello;
  hello.protocol = std::string(desc->name);
  hello.options = proto_options.text();
  hello.blocks = options.blocks;
  hello.block_size = options.block_size;
  hello.transport = to_wire_transport(options.transport);
  hello.host_id = host_id();
  hello.name = options.name;
  hello.group = group_id;
  hello.lanes = static_cast<uint16_t>(groups.size());
  for (size_t i = 0; i < groups.size(); ++i) {
    auto lane = std::make_unique<Lane>(im);
    lane->index = static_cast<uint16_t>(i);
    lane->devices = groups[i];
    SLOTSTREAM_RETURN_IF_ERROR(net::ControlSocket::connect(options.host, options.port, Millis(5000), &lane->control));
    hello.lane = lane->index;
    hello.devices = lane->devices;
    SLOTSTREAM_RETURN_IF_ERROR(net::make_nonce(&hello.nonce));
    SLOTSTREAM_RETURN_IF_ERROR(lane->handshake(hello));
    for (uint16_t d : lane->devices) im.lane_of[d] = lane.get();
    im.lanes.push_back(std::move(lane));
  }
  for (uint16_t d : options.devices) {
    im.devices[d].reset(new DeviceStream(*sender, d));
    im.messages[d] = 0;
  }
  for (auto& lane : im.lanes) {
    Lane* l = lane.get();
    l->sending_thread = std::thread([l] { l->sending_loop_st(); });
  }
  *out = std::move(sender);
  return Status::ok();
}

DeviceStream* Sender::device(uint16_t device) {
  auto it = impl_->devices.find(device);
  return it == impl_->devices.end() ? nullptr : it->second.get();
}

Status Sender::finish() {
  Impl& im = *impl_;
  if (im.finishing.exchange(true)) return im.first_error();
  im.join_all();
  Status st = im.first_error();
  // fin() progresses each lane's worker, whose handlers (credit updates, ACKs) still write protocol
  // counters: stats() may read those only after the last fin() returned.
  for (auto& lane : im.lanes) {
    if (!st.is_ok()) break;
    st = lane->fin();
  }
  im.joined.store(true, std::memory_order_release);
  return st;
}

SenderStats Sender::stats() const {
  SenderStats s;
  for (auto& [d, n] : impl_->messages) {
    s.per_device[d] = n.load();
    s.messages += s.per_device[d];
  }
  s.bytes = impl_->bytes.load();
  if (!impl_->joined.load(std::memory_order_acquire)) {  // the sending threads own protocol counters
    for (auto& lane : impl_->lanes) s.held_skips += lane->held_skips_live.load(std::memory_order_relaxed);
    return s;
  }
  for (auto& lane : impl_->lanes) {
    if (!lane->proto) continue;
    protocol::ProtocolStats c = lane->proto->stats();
    s.records += c.records;
    s.sync_operations += c.sync_ops;
    s.held_skips += c.held_skips;
    s.waits += c.waits;
    s.wait_ns += c.wait_ns;
    s.wait_samples_ns.insert(s.wait_samples_ns.end(), c.wait_samples_ns.begin(), c.wait_samples_ns.end());
    s.sync_op_samples_ns.insert(s.sync_op_samples_ns.end(), c.sync_op_samples_ns.begin(), c.sync_op_samples_ns.end());
    for (const auto& [k, v] : c.counters) s.protocol_counters[k] += v;
  }
  s.connections = impl_->lanes.size();
  return s;
}

Transport Sender::transport() const { return impl_->transport; }
uint32_t Sender::blocks() const { return impl_->options.blocks; }
uint32_t Sender::block_size() const { return impl_->options.block_size; }

// ----------------------------------------------------------------------------- DeviceStream

Status DeviceStream::send(std::span<const std::byte> message) {
  return send_with(message.size(), [&](uint64_t offset, std::span<std::byte> dst) {
    std::memcpy(dst.data(), message.data() + offset, dst.size());
    return Status::ok();
  });
}

Status DeviceStream::send_with(uint64_t length, const FillFn& fill) {
  Sender::Impl& im = *sender_.impl_;
  // Back-pressure for this device alone (its worker on the receiver is behind).
  SLOTSTREAM_RETURN_IF_ERROR(im.wait_unpaused(device_));
  Lane& lane = *im.lane_of.at(device_);
  stream::SendRing& ring = *lane.ring;
  const uint32_t capacity = im.options.block_size - uint32_t(wire::kBlockHeaderSize);
  const uint64_t n = stream::fragment_count(length, capacity);
  for (uint64_t i = 0; i < n; ++i) {
    stream::Fragment f = stream::fragment_at(length, capacity, i);
    stream::SendRing::Slot slot;
    if (Status st = ring.claim(&slot); !st.is_ok()) {
      Status err = im.first_error();
      return err.is_ok() ? st : err;
    }
    // paper §3.2.3: fill the payload, write device and packet number, then mark the block full.
    Status st = fill(f.offset, slot.block.subspan(wire::kBlockHeaderSize, f.length));
    if (!st.is_ok()) {
      ring.commit(slot, 0);  // gives the block back unsent; the receiver drops the partial message
      return st;
    }
    if (const uint32_t every = im.options.skip_packet_every; every && next_packet_ % (every + 1) == every) {
      ++next_packet_;  // testing aid: this packet number is never sent (SenderOptions)
    }
    wire::BlockHeader h{f.flags, device_, next_packet_++, f.length};
    wire::encode_block_header(h, slot.block.first<wire::kBlockHeaderSize>());
    ring.commit(slot, uint32_t(wire::kBlockHeaderSize + f.length), /*wake=*/false);
    if (stream::tracing()) stream::trace(stream::TraceStage::kCommitted, device_, h.packet);
    if (Status st = lane.transmit_committed(); !st.is_ok()) return st;
  }
  im.messages[device_].fetch_add(1, std::memory_order_relaxed);
  im.bytes.fetch_add(length, std::memory_order_relaxed);
  return Status::ok();
}

}  // namespace slotstream
