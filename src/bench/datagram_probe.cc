// The datagram probe (include/slotstream/datagram_probe.h): the engine's receiver with a store that only
// times messages, and the engine's sender.
#include "slotstream/datagram_probe.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <utility>

#include "engine/dgram/recv/receiver.h"
#include "engine/dgram/send/sender.h"
#include "engine/dgram/wire/control.h"

namespace slotstream {

namespace {

dgram::InjectOptions inject_options(const DatagramFaults& f) {
  return {f.loss, f.reorder, f.duplicate, f.corrupt, f.seed};
}

struct Samples {
  std::mutex mu;
  DatagramProbeTimes times;
};

// Counts and times messages; stores nothing.
class MeasuringStore final : public dgram::MessageStore {
 public:
  explicit MeasuringStore(std::shared_ptr<Samples> s) : s_(std::move(s)) {}
  Status store(const dgram::Delivered& m) override {
    std::lock_guard lock(s_->mu);
    DatagramProbeTimes& t = s_->times;
    if (t.first_ns == 0 || m.first_ns < t.first_ns) t.first_ns = m.first_ns;
    t.arrivals_ns.push_back(m.done_ns);
    if (!m.partial && m.data.size() >= 8) {
      int64_t stamp = 0;
      std::memcpy(&stamp, m.data.data(), 8);
      t.latencies_ns.push_back(m.done_ns - stamp);
    }
    return Status::ok();
  }

 private:
  std::shared_ptr<Samples> s_;
};

}  // namespace

struct DatagramProbeReceiver::Impl {
  std::mutex mu;
  // Per sender name, the samples of its sessions not reported yet, oldest first, each with the address it came
  // from. A report is given on the receiver's callback thread, maybe after the next session of its name has
  // started (behind a report that is still being written): it takes its own session's samples, and drops those
  // of older sessions of that name, which ended without a report (a hello never followed by data).
  std::map<std::string, std::deque<std::pair<std::string, std::shared_ptr<Samples>>>> samples;
  std::unique_ptr<dgram::DatagramReceiver> rx;
};

DatagramProbeReceiver::DatagramProbeReceiver(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatagramProbeReceiver::~DatagramProbeReceiver() { stop(); }

Status DatagramProbeReceiver::start(DatagramProbeReceiverOptions o, std::unique_ptr<DatagramProbeReceiver>* out) {
  auto impl = std::make_unique<Impl>();
  Impl* self = impl.get();
  dgram::DatagramReceiverOptions d;
  d.host = o.host;
  d.port = o.port;
  d.keep_partial = o.keep_partial;
  d.message_timeout_ns = o.message_timeout.count();
  d.session_timeout_ns = o.session_timeout.count();
  d.inject = inject_options(o.faults);
  d.token = o.token;
  d.make_store = [self](const SenderInfo& info, std::unique_ptr<dgram::MessageStore>* s) {
    auto x = std::make_shared<Samples>();
    std::lock_guard lock(self->mu);
    self->samples[info.name].emplace_back(info.peer, x);
    *s = std::make_unique<MeasuringStore>(x);
    return Status::ok();
  };
  d.on_session_end = [self, report = std::move(o.on_session_end)](const SessionReport& r) {
    std::shared_ptr<Samples> x;
    {
      std::lock_guard lock(self->mu);
      if (auto it = self->samples.find(r.sender.name); it != self->samples.end()) {
        auto& sessions = it->second;
        auto own = std::find_if(sessions.begin(), sessions.end(),
                                [&](const auto& entry) { return entry.first == r.sender.peer; });
        if (own != sessions.end()) {
          x = own->second;
          sessions.erase(sessions.begin(), own + 1);
        }
        if (sessions.empty()) self->samples.erase(it);
      }
    }
    if (!report) return;
    if (!x) return report(r, DatagramProbeTimes{});
    std::lock_guard lock(x->mu);
    report(r, x->times);
  };
  d.on_event = std::move(o.on_event);
  SLOTSTREAM_RETURN_IF_ERROR(dgram::DatagramReceiver::start(std::move(d), &impl->rx));
  out->reset(new DatagramProbeReceiver(std::move(impl)));
  return Status::ok();
}

std::string DatagramProbeReceiver::listen_address() const { return impl_->rx->listen_address(); }
uint64_t DatagramProbeReceiver::sessions_ended() const { return impl_->rx->sessions_ended(); }
std::chrono::nanoseconds DatagramProbeReceiver::since_last_fin_ack() const {
  return std::chrono::nanoseconds(impl_->rx->since_last_fin_ack_ns());
}
void DatagramProbeReceiver::stop() { impl_->rx->stop(); }

struct DatagramProbeSender::Impl {
  std::unique_ptr<dgram::DatagramSender> tx;
};

DatagramProbeSender::DatagramProbeSender(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DatagramProbeSender::~DatagramProbeSender() = default;

Status DatagramProbeSender::connect(const DatagramProbeSenderOptions& o, std::unique_ptr<DatagramProbeSender>* out) {
  dgram::DatagramSenderOptions d;
  d.host = o.host;
  d.port = o.port;
  d.name = o.name;
  d.protocol = o.protocol;
  d.devices = {0};
  d.ring = o.slots;
  d.segment_size = o.segment_size;
  d.max_message = o.max_message;
  d.finish_timeout_ns = o.finish_timeout.count();
  d.inject = inject_options(o.faults);
  d.token = o.token;
  auto impl = std::make_unique<Impl>();
  SLOTSTREAM_RETURN_IF_ERROR(dgram::DatagramSender::connect(d, &impl->tx));
  out->reset(new DatagramProbeSender(std::move(impl)));
  return Status::ok();
}

Status DatagramProbeSender::send(std::span<const std::byte> message) { return impl_->tx->send(0, message); }

Status DatagramProbeSender::finish() {
  dgram::FinAck report;
  return impl_->tx->finish(&report);
}

DatagramProbeSenderStats DatagramProbeSender::stats() const {
  const dgram::DatagramSenderStats s = impl_->tx->stats();
  return {s.messages, s.bytes, s.datagrams, s.retransmits, s.credit_waits};
}

}  // namespace slotstream
