// The receiver's side of the handshake: the pure checks, and ReceiverSession's steps that talk
// to the sender (declared in receiver_session.h).
#include "engine/ucx/session/handshake.h"

#include <thread>

#include "common.h"
#include "engine/hello_rules.h"
#include "engine/ucx/session/receiver_session.h"
#include "engine/ucx/session/transport_choice.h"

namespace slotstream::session {

static_assert(kMaxDevices == engine::kMaxDevices, "the block HELLO's device limit is the engines' one");

EndFacts sender_facts(const wire::Hello& hello) {
  return {hello.host_id, hello.shm_domain, (hello.offers & wire::kOfferShm) != 0,
          (hello.offers & wire::kOfferRdma) != 0};
}

std::optional<Refusal> check_hello(const wire::Hello& hello, const ReceiverTerms& receiver, HelloTerms* terms) {
  HelloTerms t;
  t.protocol = protocol::find(hello.protocol);
  if (!t.protocol) return Refusal{Code::kRefused, "unknown protocol '" + hello.protocol + "'", "protocol"};
  if (Status st = protocol::Options::parse(hello.options, &t.options); !st.is_ok()) {
    return Refusal{Code::kRefused, st.message(), "options"};
  }
  if (Status st = protocol::check_options(*t.protocol, t.options); !st.is_ok()) {
    return Refusal{Code::kRefused, st.message(), "options"};
  }
  if (hello.block_size < kMinBlockSize || hello.block_size > kMaxBlockSize || hello.blocks < 1 ||
      hello.blocks > kMaxBlocks) {
    return Refusal{
        Code::kRefused,
        "unsupported block geometry " + std::to_string(hello.blocks) + " x " + std::to_string(hello.block_size) + " B",
        "geometry"};
  }
  if (auto why = engine::check_sender_name(hello.name)) return Refusal{Code::kRefused, *why, "name"};
  if (auto why = engine::check_devices(hello.devices)) return Refusal{Code::kRefused, *why, "devices"};
  TransportChoice choice = choose_transport(receiver.allowed, hello.transport, sender_facts(hello), receiver.facts);
  if (!choice.transport) return Refusal{Code::kRefused, choice.refusal, "transport"};
  if (*choice.transport == Transport::kRdma && hello.rdma_transport && *hello.rdma_transport != receiver.rdma) {
    return Refusal{Code::kRefused,
                   std::string("this receiver serves rdma over ") + rdma_transport_name(receiver.rdma) +
                       ", the sender asks for " + rdma_transport_name(*hello.rdma_transport) +
                       " (--rdma-transport on both ends)",
                   "transport"};
  }
  t.transport = *choice.transport;
  t.reason = std::move(choice.reason);
  *terms = std::move(t);
  return std::nullopt;
}

RefusalLabels refusal_labels(const Refusal& r) {
  if (r.code == Code::kAuthFailed) return {"authentication", r.reason ? r.reason : "other"};
  if (r.reason) return {r.reason, nullptr};
  switch (r.code) {
    case Code::kProtocolError:
    case Code::kVersionMismatch:
      return {"bad_hello", nullptr};
    case Code::kTimeout:
      return {"timeout", nullptr};
    case Code::kBusy:
      return {"busy", nullptr};
    default:
      return {"other", nullptr};
  }
}

net::Mac hello_proof(const std::string& token, const net::Nonce& receiver_nonce, const net::Nonce& sender_nonce,
                     std::span<const uint8_t> hello_bytes) {
  return net::proof(token, "sender-hello", {receiver_nonce, sender_nonce, hello_bytes});
}

net::Mac accept_proof(const std::string& token, const net::Nonce& receiver_nonce, const net::Nonce& sender_nonce,
                      std::span<const uint8_t> hello_bytes, const wire::Accept& accept) {
  return net::proof(token, "receiver-accept", {receiver_nonce, sender_nonce, hello_bytes, wire::signed_part(accept)});
}

net::Mac setup_proof(const std::string& token, const net::Nonce& receiver_nonce, const net::Nonce& sender_nonce,
                     const wire::Setup& setup) {
  return net::proof(token, "sender-setup", {receiver_nonce, sender_nonce, wire::signed_part(setup)});
}

std::optional<Refusal> check_sender_proof(const std::string& token, const net::Nonce& receiver_nonce,
                                          const net::Nonce& sender_nonce, std::span<const uint8_t> hello_bytes,
                                          std::span<const uint8_t> mac) {
  if (!net::mac_equal(mac, hello_proof(token, receiver_nonce, sender_nonce, hello_bytes))) {
    return Refusal{Code::kAuthFailed, "authentication failed: wrong token (or the hello was altered on the way)",
                   "wrong_token"};
  }
  return std::nullopt;
}

std::optional<Refusal> check_setup_proof(const std::string& token, const net::Nonce& receiver_nonce,
                                         const net::Nonce& sender_nonce, const wire::Setup& setup) {
  if (!net::mac_equal(setup.proof, setup_proof(token, receiver_nonce, sender_nonce, setup))) {
    return Refusal{Code::kAuthFailed, "authentication failed: the sender's set-up is not signed with the token",
                   "unsigned_setup"};
  }
  return std::nullopt;
}

Status expect_progressing(net::ControlSocket& control, wire::MsgType type, net::Millis timeout, fabric::Worker* worker,
                          std::vector<uint8_t>* body) {
  if (worker == nullptr) return control.expect(type, timeout, body);
  for (const auto until = std::chrono::steady_clock::now() + timeout; std::chrono::steady_clock::now() < until;) {
    Status alive = control.check_alive();
    if (alive.code() == Code::kInProgress) return control.expect(type, timeout, body);  // a frame is there
    if (!alive.is_ok()) return alive;
    if (worker->progress_setup() == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  return {Code::kTimeout, "timed out waiting for the peer"};
}

// ------------------------------------------------------------------ ReceiverSession's steps

std::optional<Refusal> ReceiverSession::handshake() {
  wire::Hello hello;
  if (auto r = read_hello(&hello)) return r;
  if (capacity_only_) return std::nullopt;
  HelloTerms terms;
  if (auto r = check_hello(hello, rx_.receiver_terms(), &terms)) return r;
  desc_ = terms.protocol;
  options_ = std::move(terms.options);
  transport_ = terms.transport;
  transport_reason_ = std::move(terms.reason);
  if (auto r = authenticate(hello)) return r;
  // Authenticated (without a token: a hello the receiver accepts): out of the small budget of
  // connections still in their handshake, into the authenticated one (engine/ucx/session/admission.h).
  if (auto why = rx_.authenticated(connection_)) return Refusal{Code::kBusy, *why, "busy"};
  if (auto r = set_up(hello)) return r;
  return connect();
}

std::optional<Refusal> ReceiverSession::read_hello(wire::Hello* hello) {
  wire::Frame frame;
  // Once bytes have come, this connection counts as one that spoke (session/admission.h): marked
  // before they leave the kernel, where the accept loop saw them until now, so that no moment
  // lets it pass for a silent one. The two waits share one kHelloTimeout.
  const auto deadline = Clock::now() + kHelloTimeout;
  Status st = control_->wait_readable(kHelloTimeout);
  if (st.is_ok()) {
    rx_.spoke(connection_);
    st = control_->receive(net::time_left(deadline), &frame);
  }
  if (!st.is_ok()) {
    return Refusal{st.code(), "no valid hello: " + st.message(), st.code() == Code::kTimeout ? "timeout" : "bad_hello"};
  }
  fabric::test_stop_point("hello");
  if (frame.type == wire::MsgType::kCapacityRequest) {
    if (Status st = wire::decode_capacity_request(frame.body); !st.is_ok()) return Refusal{st.code(), st.message()};
    capacity_only_ = true;
    (void)control_->send(wire::MsgType::kCapacity, wire::encode(rx_.capacity()));
    return std::nullopt;
  }
  if (frame.type != wire::MsgType::kHello) {
    return Refusal{Code::kProtocolError, "expected hello, got message type " + std::to_string(int(frame.type))};
  }
  if (Status st = wire::decode(frame.body, hello); !st.is_ok()) return Refusal{st.code(), st.message()};
  hello_bytes_ = std::move(frame.body);
  sender_nonce_ = hello->nonce;
  return std::nullopt;
}

// With a token: the sender proves it over our nonce and every byte of its hello (net/auth.h).
std::optional<Refusal> ReceiverSession::authenticate(const wire::Hello& hello) {
  report_.sender.name = hello.name;
  if (rx_options_.token.empty()) return std::nullopt;
  net::Nonce nonce;
  if (Status st = net::make_nonce(&nonce); !st.is_ok()) return Refusal{st.code(), st.message()};
  if (Status st = control_->send(wire::MsgType::kChallenge, nonce); !st.is_ok())
    return Refusal{st.code(), st.message()};
  std::vector<uint8_t> mac;
  if (Status st = control_->expect(wire::MsgType::kAuth, kHelloTimeout, &mac); !st.is_ok()) {
    return Refusal{Code::kAuthFailed, "authentication failed: " + st.message(), "no_proof"};
  }
  if (auto r = check_sender_proof(rx_options_.token, nonce, sender_nonce_, hello_bytes_, mac)) return r;
  my_nonce_ = nonce;
  return std::nullopt;
}

std::optional<Refusal> ReceiverSession::set_up(const wire::Hello& hello) {
  if (auto why = rx_.register_lane(hello, &group_)) return Refusal{Code::kRefused, *why, "already_connected"};
  registered_ = true;

  SenderInfo& info = report_.sender;
  info.name = hello.name;
  info.protocol = hello.protocol;
  info.transport = transport_;
  info.blocks = hello.blocks;
  info.block_size = hello.block_size;
  info.devices = hello.devices;
  if (hello.flags & wire::kHelloNumbered) {
    for (size_t i = 0; i < hello.devices.size(); ++i) info.first_message[hello.devices[i]] = hello.first[i];
  }
  confirm_ = (hello.flags & wire::kHelloConfirm) != 0;
  geometry_ = {hello.blocks, hello.block_size};

  // Nothing is allocated for a sender before it is authenticated and fits the memory budget.
  const uint64_t region = region_bytes(geometry_);
  if (auto why = rx_.reserve_memory(region)) return Refusal{Code::kRefused, *why, "memory"};
  reserved_bytes_ = region;

  if (auto r = set_up_transport(region)) return r;
  protocol::ReceiverFabric rf{*fabric_->context, worker(), geometry_};
  std::unique_ptr<protocol::ReceiverProtocol> proto;
  if (Status st = desc_->make_receiver(rf, protocol::protocol_options(options_), &proto); !st.is_ok()) {
    return Refusal{st.code(), "cannot set up " + format_bytes(geometry_.bytes()) + " of blocks: " + st.message()};
  }
  proto_ = std::move(proto);
  if (auto r = make_sink()) return r;
  // A sender that packs can have many records per block in flight: the reorder window grows with it.
  bool packs = false;
  (void)protocol::packs(*desc_, options_, &packs);  // checked with the hello
  delivery_ = std::make_unique<stream::Delivery>(*proto_, *sink_, hello.devices, packs ? geometry_.block_size : 0);
  if (lender_) delivery_->set_lending(lender_->lending(), lender_);
  if (confirm_) {
    // The numbers this connection's messages start at: the sender's, or where the sink stands.
    for (uint16_t d : hello.devices) {
      auto n = sink_->numbering(d);
      confirmed_.devices[d].first = n ? n->next : 0;
    }
  }
  delivery_->set_pause_handler([this](uint16_t device, bool paused) { on_pause(device, paused); });
  // A paused device's records copied out of shared blocks: at most another region's worth.
  delivery_->set_park_limit(geometry_.bytes());

  return send_accept();
}

// The sender's sink: the application's MessageSink, or (zero-copy receive) a LendingSink that
// lends messages in place to its ViewSink — only where the protocol can hold single blocks. With
// both set, a sender whose protocol cannot hold blocks gets the MessageSink (its messages copied).
std::optional<Refusal> ReceiverSession::make_sink() {
  const SenderInfo& info = report_.sender;
  if (!rx_options_.make_view_sink || (!desc_->holds && rx_options_.make_sink)) {
    if (Status st = rx_options_.make_sink(info, &sink_); !st.is_ok()) {
      return Refusal{st.code(), "cannot store this sender's data: " + st.message()};
    }
    return std::nullopt;
  }
  if (!desc_->holds) {
    return Refusal{Code::kRefused,
                   "this receiver lends messages in place (zero-copy), which needs a protocol that holds "
                   "single blocks (status 2): use --protocol status_byte, not " +
                       std::string(desc_->name)};
  }
  std::unique_ptr<ViewSink> views;
  if (Status st = rx_options_.make_view_sink(info, &views); !st.is_ok()) {
    return Refusal{st.code(), "cannot take this sender's data: " + st.message()};
  }
  auto lending = std::make_shared<stream::Lending>(info.name, fabric_->context, proto_, geometry_.blocks,
                                                   rx_options_.max_held_blocks);
  auto sink = std::make_unique<stream::LendingSink>(std::move(lending), std::move(views));
  lender_ = sink.get();
  sink_ = std::move(sink);
  return std::nullopt;
}

// The transport's fabric for this sender: its context and worker (and one of the session's own),
// once the NIC may pin this sender's region (rdma: the locked-memory limit).
std::optional<Refusal> ReceiverSession::set_up_transport(uint64_t region) {
  if (Status st = rx_.transport_fabric(transport_, &fabric_); !st.is_ok()) {
    return Refusal{st.code(), "receiver transport set-up failed: " + st.message()};
  }
  // A protocol whose receiver takes part in transfers (notifications, ACKs) gets a worker of its
  // own that only this session's thread progresses — as an RDMA receiver polls its own
  // completion queue — instead of contending with every other session for the shared one. Over
  // rdma with queue pairs per peer (rc, dc) every session has one (a passive one never progresses
  // it while data moves): a sender's queue pairs go with its session's worker. Closing an endpoint
  // alone does not free them where the NIC never reports its queue pair's last receive (UCX 1.13
  // waits for that event, and Soft-RoCE does not send it): on the shared worker they stayed, one
  // per sender that had gone. (ud has one queue pair per worker, and its shared worker a progress
  // thread: a passive protocol over ud stays on it.)
  const fabric::TransportTraits traits = fabric_->context->traits();
  const bool own = desc_->receiver_progress || (transport_ == Transport::kRdma && !traits.target_progress);
  // The NIC pins every region of this process (this sender's and the ones already connected) and
  // what UCX pins for each worker: with a worker of this session's own, one more.
  const fabric::FabricSpec& spec = fabric_->context->spec();
  const uint64_t own_pinned = own ? fabric::worker_pinned_bytes(spec) : 0;
  if (Status st = fabric::check_memlock(spec, fabric::pinned_estimate() + region + own_pinned,
                                        "this sender's blocks" + std::string(own_pinned ? " and its worker" : "") +
                                            ", besides what the senders already connected pin");
      !st.is_ok()) {
    return Refusal{Code::kRefused, "the receiver cannot pin the blocks: " + st.message(), "memory"};
  }
  if (own) {
    if (Status st = fabric::Worker::create(*fabric_->context, /*shared=*/false, /*wakeup=*/true, &own_worker_);
        !st.is_ok()) {
      return Refusal{st.code(), "receiver transport set-up failed: " + st.message()};
    }
  }
  return std::nullopt;
}

// ACCEPT: the transport and why, what this receiver offers, where the sender writes.
std::optional<Refusal> ReceiverSession::send_accept() {
  wire::Accept accept;
  accept.transport = transport_;
  if (transport_ == Transport::kRdma) accept.rdma_transport = fabric_->context->spec().rdma;
  accept.offers = rx_.receiver_offers();
  accept.reason = transport_reason_.substr(0, 1024);
  accept.worker_address = worker().address();
  accept.setup = proto_->setup();
  if (my_nonce_) {
    auto mac = accept_proof(rx_options_.token, *my_nonce_, sender_nonce_, hello_bytes_, accept);
    accept.proof.assign(mac.begin(), mac.end());
  }
  if (Status st = control_->send(wire::MsgType::kAccept, wire::encode(accept)); !st.is_ok()) {
    return Refusal{st.code(), st.message()};
  }
  return std::nullopt;
}

// The sender's half of the set-up (SETUP), then READY. The sender may REFUSE instead: its half of
// the transport could not be set up (it says why, and an auto sender connects again).
std::optional<Refusal> ReceiverSession::connect() {
  std::vector<uint8_t> body;
  // Where the sender's endpoint is wired up with our worker's help (rdma: rc's connection request
  // is answered by the target's worker; tcp: our listener accepts it, engine/ucx/fabric/cm.h), that worker runs
  // until SETUP — before the data path. (A shared worker over tcp has its progress thread.)
  const fabric::TransportTraits t = fabric_->context->traits();
  fabric::Worker* helper = t.setup_progress || (t.cm_connect && own_worker_) ? &worker() : nullptr;
  // Meanwhile the sender connects its endpoint (rdma: and reads a word of ours), which may take
  // each of its time limits (fabric::Endpoint) on a slow host.
  const net::Millis setup_timeout =
      t.setup_progress ? kHelloTimeout + fabric::Endpoint::kConnectTimeout + fabric::Endpoint::kReachTimeout
                       : kHelloTimeout;
  if (Status st = expect_progressing(*control_, wire::MsgType::kSetup, setup_timeout, helper, &body); !st.is_ok()) {
    return Refusal{st.code(), "no set-up from the sender: " + st.message()};
  }
  wire::Setup setup;
  if (Status st = wire::decode(body, &setup); !st.is_ok()) return Refusal{st.code(), st.message()};
  if (my_nonce_) {
    if (auto r = check_setup_proof(rx_options_.token, *my_nonce_, sender_nonce_, setup)) return r;
    // Both ends are authenticated: every frame from here on is signed (READY or REFUSE first).
    control_->sign_frames(net::session_key(rx_options_.token, *my_nonce_, sender_nonce_), /*sender=*/false);
  }
  if (desc_->receiver_endpoint) {
    if (Status st = fabric::Endpoint::create(worker(), setup.worker_address, control_->peer_host(), &to_sender_);
        !st.is_ok()) {
      return Refusal{st.code(), "cannot reach the sender's memory: " + st.message()};
    }
  }
  if (Status st = proto_->connect({to_sender_.get(), setup.setup}); !st.is_ok()) {
    return Refusal{st.code(), "sender set-up rejected: " + st.message()};
  }
  if (Status st = control_->send(wire::MsgType::kReady, {}); !st.is_ok()) return Refusal{st.code(), st.message()};
  // A sender that asked for confirmations learns at once where its numbers start.
  if (confirm_) send_stored();
  return std::nullopt;
}

// REFUSE with the reason, then release whatever the handshake had taken — before the connection
// closes: a sender that connects again once it sees the close (an auto sender whose transport
// failed) finds its name and lane free. (No data moves before READY: nothing writes the region.)
void ReceiverSession::refuse(const Refusal& refusal) {
  std::string who =
      report_.sender.name.empty() ? report_.sender.peer : report_.sender.name + " (" + report_.sender.peer + ")";
  // A connection closed for room is logged with the others it was closed with (receiver.cc).
  const bool evicted = rx_.evicted_for_room(connection_);
  if (!evicted) rx_.event("refused sender " + who + ": " + refusal.message);
  rx_.count_refusal(evicted ? RefusalLabels{"evicted", nullptr} : refusal_labels(refusal));
  wire::Refuse r{refusal.code, refusal.message};
  (void)control_->send(wire::MsgType::kRefuse, wire::encode(r));
  free_region();
  if (reserved_bytes_) rx_.release_memory(reserved_bytes_);
  if (registered_) {
    report_.reason = "refused: " + refusal.message;
    rx_.lane_ended(group_, report_);
  }
  control_->drain_and_close(net::Millis(200));
}

}  // namespace slotstream::session
