#include "engine/dgram/engine.h"

#include <atomic>
#include <chrono>
#include <mutex>

#include "engine/dgram/protocol/protocol.h"
#include "engine/dgram/recv/receiver.h"
#include "engine/dgram/recv/stores.h"

namespace slotstream::dgram {

namespace {

InjectOptions inject_of(const DatagramFaults& f) {
  InjectOptions o;
  o.loss = f.loss;
  o.reorder = f.reorder;
  o.duplicate = f.duplicate;
  o.corrupt = f.corrupt;
  o.seed = f.seed;
  return o;
}

std::string names(bool over_tcp) {
  std::string out;
  for (const Descriptor* d : protocols()) {
    if (d->over_tcp == over_tcp) out += (out.empty() ? "" : ", ") + std::string(d->name);
  }
  return out;
}

// The datagram protocol `o` asks for (SenderOptions::protocol, else write_record), checked against its
// transport.
Status resolve(const SenderOptions& o, const Descriptor** out) {
  const std::string name = o.protocol.empty() ? kDefaultProtocol : o.protocol;
  if (name.find(':') != std::string::npos) {
    return {Code::kInvalidArgument, "protocol '" + name + "': the datagram protocols take no options (" + names(false) +
                                        ", " + names(true) + ")"};
  }
  const Descriptor* d = find_protocol(name);
  if (!d) {
    return {Code::kInvalidArgument, "protocol " + name +
                                        " runs over UCX (transport shm, tcp, rdma or auto); over udp: " + names(false) +
                                        " (and dgram_rc over tcp)"};
  }
  const Transport want = d->over_tcp ? Transport::kTcp : Transport::kUdp;
  if (o.transport != want) {
    return {Code::kInvalidArgument,
            "protocol " + name + " runs over " + transport_name(want) + ": give transport " + transport_name(want)};
  }
  *out = d;
  return Status::ok();
}

DatagramSenderOptions datagram_options(const SenderOptions& o, const Descriptor& d) {
  DatagramSenderOptions x;
  x.host = o.host;
  x.port = o.port;
  x.name = o.name;
  x.protocol = std::string(d.name);
  x.devices = o.devices;
  x.ring = o.blocks;
  x.max_message = o.datagram.max_message;
  x.segment_size = o.datagram.segment_size;
  x.token = o.token;
  x.inject = inject_of(o.datagram.faults);
  x.ttl = o.datagram.ttl;
  x.interface = o.datagram.interface;
  return x;
}

}  // namespace

Status validate_sender(const SenderOptions& o) {
  const Descriptor* d = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(resolve(o, &d));
  const char* refused = o.rdma.transport || !o.rdma.device.empty()
                            ? "rdma options (rdma.transport, rdma.device) apply to transport rdma or auto"
                        : !o.first_message.empty()
                            ? "first_message: the datagram transport does not number messages on the "
                              "receiver's disk from the sender (it numbers them per connection)"
                        : o.confirm_stored    ? "confirm_stored: the datagram transport confirms what was stored at "
                                                "finish() only (SenderStats::delivered)"
                        : o.skip_packet_every ? "skip_packet_every is the block transports' testing aid; the datagram "
                                                "transport injects faults instead (datagram.faults)"
                                              : nullptr;
  if (refused) return {Code::kInvalidArgument, refused};
  return DatagramSender::validate(datagram_options(o, *d));
}

// ------------------------------------------------------------------------------------ sender

Status EngineSender::connect(const SenderOptions& o, std::unique_ptr<EngineSender>* out) {
  SLOTSTREAM_RETURN_IF_ERROR(validate_sender(o));
  const Descriptor* d = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(resolve(o, &d));
  std::unique_ptr<EngineSender> e(new EngineSender());
  SLOTSTREAM_RETURN_IF_ERROR(DatagramSender::connect(datagram_options(o, *d), &e->tx_));
  e->protocol_ = std::string(d->name);
  e->transport_ = d->over_tcp ? Transport::kTcp : Transport::kUdp;
  e->ring_ = o.blocks;
  e->reason_ = std::string(transport_name(e->transport_)) + ": the datagram transport (" + e->protocol_ + ", " +
               (e->tx_->multicast() ? "to an IP multicast group" : "one receiver") + ")";
  *out = std::move(e);
  return Status::ok();
}

void EngineSender::adopt(uint16_t device, std::unique_ptr<DeviceStream> stream) {
  streams_[device] = std::move(stream);
}

DeviceStream* EngineSender::device(uint16_t device) {
  auto it = streams_.find(device);
  return it == streams_.end() ? nullptr : it->second.get();
}

Status EngineSender::first_error() const {
  std::lock_guard lock(mu_);
  if (!aborted_.is_ok()) return aborted_;
  if (finished_) return {Code::kCancelled, "the sender has finished"};
  return Status::ok();
}

Status EngineSender::sent(Status st) const {
  if (st.is_ok()) return st;
  Status a = first_error();
  return a.is_ok() ? st : a;  // aborted meanwhile: say why
}

Status EngineSender::send_with(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill,
                               engine::Deadline /*deadline*/, DeviceStream::Progress* progress) {
  SLOTSTREAM_RETURN_IF_ERROR(first_error());
  if (!streams_.contains(device))
    return {Code::kInvalidArgument, "device " + std::to_string(device) + " is not declared"};
  if (progress) progress->next_fragment = 0;  // a message goes whole: nothing to continue
  return sent(tx_->send_with(device, length, fill));
}

Status EngineSender::send(uint16_t device, std::span<const std::byte> message, engine::Deadline /*deadline*/,
                          DeviceStream::Progress* progress) {
  SLOTSTREAM_RETURN_IF_ERROR(first_error());
  if (!streams_.contains(device))
    return {Code::kInvalidArgument, "device " + std::to_string(device) + " is not declared"};
  if (progress) progress->next_fragment = 0;
  return sent(tx_->send(device, message));
}

Status EngineSender::finish() {
  std::unique_lock lock(mu_);
  if (finished_) return finish_status_;
  finished_ = true;
  if (!aborted_.is_ok()) return finish_status_ = aborted_;
  lock.unlock();
  FinAck report;
  Status st = tx_->finish(&report);
  lock.lock();
  report_ = std::move(report);
  finish_status_ = aborted_.is_ok() ? st : aborted_;
  return finish_status_;
}

void EngineSender::abort(Status why) {
  std::lock_guard lock(mu_);
  if (aborted_.is_ok()) aborted_ = std::move(why);
}

SenderStats EngineSender::stats() const {
  const DatagramSenderStats d = tx_->stats();
  SenderStats s;
  s.messages = d.messages;
  s.bytes = d.bytes;
  s.records = d.datagrams;
  s.units = d.datagrams;
  s.per_device = d.per_device;
  s.waits = d.credit_waits;
  s.connections = 1;
  s.multicast = tx_->multicast();
  s.protocol_counters = {{"datagrams", d.datagrams},
                         {"retransmits", d.retransmits},
                         {"retransmit_timeouts", d.timeouts},
                         {"credit_waits", d.credit_waits},
                         {"forged", d.forged},
                         {"injected_loss", d.injected_loss},
                         {"injected_corrupt", d.injected_corrupt},
                         {"injected_duplicate", d.injected_duplicate},
                         {"injected_reorder", d.injected_reorder}};
  std::lock_guard lock(mu_);
  for (const FinAck::Device& dev : report_.devices) {
    DeviceStats& x = s.delivered[dev.device];
    x.messages = dev.counts.complete;
    x.partial = dev.counts.partial;
    x.dropped = dev.counts.dropped;
    x.lost = dev.counts.lost;
    x.bytes = dev.counts.valid_bytes;
  }
  return s;
}

Status EngineSender::continue_at(uint16_t, uint64_t, std::chrono::milliseconds) {
  return {Code::kInvalidArgument,
          "continue_at: the datagram transport does not number messages on the receiver's disk from the sender"};
}

// ---------------------------------------------------------------------------------- receiver

namespace {

// One sender's MessageSink as the datagram receiver's store: each message with its number, partial or
// complete (MessageSink::deliver_datagram).
class SinkStore final : public MessageStore {
 public:
  explicit SinkStore(std::unique_ptr<MessageSink> sink) : sink_(std::move(sink)) {}
  Status store(const Delivered& m) override {
    MessageSink::DatagramMessage dm;
    dm.device = m.device;
    dm.number = m.msn;
    dm.partial = m.partial;
    dm.data = m.data;
    if (m.partial && m.valid) {
      for (const auto& r : m.valid->ranges()) dm.valid.emplace_back(r.offset, r.length);
    }
    return sink_->deliver_datagram(dm);
  }

 private:
  std::unique_ptr<MessageSink> sink_;
};

// How long after the last FIN_ACK a finished sender may still repeat its FIN (every 200 ms until it
// hears one): Receiver::settled().
constexpr int64_t kLingerNs = 1'000'000'000;

class EngineReceiver final : public engine::ReceiverEngine {
 public:
  static Status start(ReceiverOptions o, std::unique_ptr<EngineReceiver>* out) {
    std::unique_ptr<EngineReceiver> e(new EngineReceiver());
    DatagramReceiverOptions x;
    x.host = o.host;
    x.port = o.port;
    x.interface = o.datagram.interface;
    x.keep_partial = o.datagram.keep_partial;
    x.message_timeout_ns = o.datagram.message_timeout.count();
    x.session_timeout_ns = o.datagram.session_timeout.count();
    x.max_message = o.datagram.max_message;
    x.token = o.token;
    x.max_memory = o.max_memory;
    x.inject = inject_of(o.datagram.faults);
    x.holds = o.holds;
    if (o.make_sink) {
      x.make_store = [make = o.make_sink](const SenderInfo& info, std::unique_ptr<MessageStore>* store) {
        std::unique_ptr<MessageSink> sink;
        SLOTSTREAM_RETURN_IF_ERROR(make(info, &sink));
        if (sink) *store = std::make_unique<SinkStore>(std::move(sink));
        return Status::ok();
      };
    }
    // Both run on the datagram receiver's callback thread, never on its network thread; it counts a session
    // as ended once on_session_end has returned (engine/dgram/recv/receiver.h).
    x.on_session_end = o.on_session_end;
    x.on_event = o.on_event;
    SLOTSTREAM_RETURN_IF_ERROR(DatagramReceiver::start(std::move(x), &e->rx_));
    *out = std::move(e);
    return Status::ok();
  }
  ~EngineReceiver() override { stop(""); }

  std::string listen_address() const override { return rx_->listen_address(); }
  void stop(const std::string& /*reason*/) override {
    stopped_ = true;
    if (rx_) rx_->stop();  // (none when start failed) returns once the ended sessions' reports were given
  }
  uint64_t sessions_ended() const override { return rx_->sessions_ended(); }
  std::vector<SessionReport> live_sessions() const override { return rx_->live_sessions(); }
  void wait_sessions(uint64_t n) override { rx_->wait_sessions(n); }
  RefusalCounts refusals() const override { return {}; }  // counters() has the datagram receiver's
  bool accepting() const override { return !stopped_.load(); }
  uint64_t memory_in_use() const override { return rx_->counters().memory_promised; }
  uint64_t memory_budget() const override { return rx_->counters().memory_budget; }
  std::map<std::string, uint64_t> counters() const override {
    const DatagramReceiver::Counters c = rx_->counters();
    const ReceiverCounters& r = c.receiver;
    std::map<std::string, uint64_t> out = {{"hellos_refused", r.hellos_refused},
                                           {"challenges", r.challenges},
                                           {"auth_failures", r.auth_failures},
                                           {"replies_withheld", r.replies_withheld},
                                           {"sessions_evicted", r.sessions_evicted},
                                           {"memory_refusals", r.memory_refusals},
                                           {"connections_refused", r.connections_refused},
                                           {"connections_evicted", r.connections_evicted},
                                           {"connections_timed_out", r.connections_timed_out},
                                           {"accept_errors", r.accept_errors},
                                           {"log_suppressed", r.log_suppressed},
                                           {"sessions_terminated", r.sessions_terminated},
                                           {"memory_promised", c.memory_promised},
                                           {"memory_budget", c.memory_budget},
                                           {"connections", c.connections}};
    for (size_t i = 0; i < kAnnounceRefusals; ++i) {
      out[std::string("announces_refused:") + refusal_label(AnnounceRefusal(i))] = r.announces_refused[i];
    }
    for (const auto& [k, v] : protocol_counters(c.unattributed)) out["unattributed:" + k] = v;
    return out;
  }
  bool settled() const override { return rx_->since_last_fin_ack_ns() > kLingerNs; }

 private:
  EngineReceiver() = default;
  std::atomic<bool> stopped_ = false;
  std::unique_ptr<DatagramReceiver> rx_;
};

}  // namespace

Status start_receiver(ReceiverOptions o, std::unique_ptr<engine::ReceiverEngine>* out) {
  if (o.make_view_sink && !o.make_sink) {
    return {Code::kInvalidArgument,
            "zero-copy receive (make_view_sink) lends receive blocks in place; the datagram transport has none "
            "(its messages are reassembled from datagrams): give make_sink"};
  }
  if (o.rdma.transport || !o.rdma.device.empty()) {
    return {Code::kInvalidArgument, "rdma options (rdma.transport, rdma.device) apply to transport rdma or auto"};
  }
  std::unique_ptr<EngineReceiver> e;
  SLOTSTREAM_RETURN_IF_ERROR(EngineReceiver::start(std::move(o), &e));
  *out = std::move(e);
  return Status::ok();
}

}  // namespace slotstream::dgram
