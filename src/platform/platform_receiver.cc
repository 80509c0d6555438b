// The platform's receiver side and its reading (include/slotstream/platform.h): PlatformRegistration
// around Registration (registration.h) with what a receiver measures, and read_platform_state.
#include <unistd.h>

#include "common.h"
#include "platform/etcd.h"
#include "platform/host.h"
#include "platform/model.h"
#include "platform/registration.h"
#include "platform/reservation.h"
#include "slotstream/platform.h"

namespace slotstream {

namespace {

// What the receiver serves, for the platform's choice: its transport, or under auto shm and tcp, and
// rdma when this host has a usable RDMA device (the receiver offers it then).
std::vector<std::string> served_transports(Transport transport, const RdmaOptions& rdma) {
  if (transport != Transport::kAuto) return {transport_name(transport)};
  std::vector<std::string> out = {"shm", "tcp"};
  for (const TransportInfo& t : host_transports(rdma)) {
    if (t.name == "rdma" && t.available) out.push_back("rdma");
  }
  return out;
}

std::string host_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// The address senders use: the one given, or the listen address as bound (a wildcard host becomes this
// host's name).
Status advertised_address(const std::string& given, const Receiver& rx, std::string* out) {
  std::string host;
  uint16_t port = 0;
  if (!given.empty()) {
    if (Status st = parse_address(given, &host, &port); !st.is_ok()) {
      return {Code::kInvalidArgument, "the receiver's address: " + st.message()};
    }
    *out = given;
    return Status::ok();
  }
  SLOTSTREAM_RETURN_IF_ERROR(parse_address(rx.listen_address(), &host, &port));
  if (host == "0.0.0.0" || host == "::" || host.empty()) host = host_name();
  *out = host + ":" + std::to_string(port);
  return Status::ok();
}

}  // namespace

struct PlatformRegistration::Impl {
  std::string name, address;
  std::unique_ptr<platform::Registration> registration;
};

PlatformRegistration::PlatformRegistration(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PlatformRegistration::~PlatformRegistration() = default;
bool PlatformRegistration::lost() const { return impl_->registration->lost(); }
const std::string& PlatformRegistration::name() const { return impl_->name; }
const std::string& PlatformRegistration::address() const { return impl_->address; }

Status PlatformRegistration::start(const Receiver& rx, PlatformReceiverOptions o,
                                   std::unique_ptr<PlatformRegistration>* out) {
  platform::RegistrationOptions ro;
  SLOTSTREAM_RETURN_IF_ERROR(platform::etcd_config(o.platform, o.security, &ro.etcd));
  platform::ReceiverRecord& rec = ro.record;
  SLOTSTREAM_RETURN_IF_ERROR(advertised_address(o.address, rx, &rec.address));
  rec.name = o.name.empty() ? rec.address : o.name;
  rec.transports = served_transports(o.transport, o.rdma);
  rec.host_id = host_id();
  rec.capacity.cpu = o.capacity.cpu.value_or(platform::online_cpus());
  rec.capacity.bandwidth = o.capacity.bandwidth;
  rec.capacity.fps = o.capacity.fps;
  rec.capacity.memory = double(rx.memory_budget());
  ro.ttl_seconds = o.lease_ttl_seconds;
  auto meter = std::make_shared<CpuMeter>();
  ro.measure = [&rx, backlog = o.backlog_bytes, meter](platform::ReceiverRecord* r) {
    r->free_cpu = meter->read().idle_cores;
    r->free_memory = platform::available_memory();
    const uint64_t used = rx.memory_in_use(), budget = rx.memory_budget();
    r->free_receive_memory = used < budget ? budget - used : 0;
    r->senders = uint32_t(rx.live_sessions().size());
    r->backlog_bytes = backlog ? backlog() : 0;
  };
  ro.on_event = std::move(o.on_event);
  ro.on_lost = std::move(o.on_lost);
  auto impl = std::make_unique<Impl>();
  impl->name = rec.name;
  impl->address = rec.address;
  SLOTSTREAM_RETURN_IF_ERROR(platform::Registration::start(std::move(ro), &impl->registration));
  out->reset(new PlatformRegistration(std::move(impl)));
  return Status::ok();
}

Status read_platform_state(const std::string& url, const PlatformSecurity& security, PlatformState* out) {
  platform::EtcdConfig config;
  SLOTSTREAM_RETURN_IF_ERROR(platform::etcd_config(url, security, &config));
  std::unique_ptr<platform::EtcdClient> etcd;
  std::vector<platform::ReceiverRecord> receivers;
  std::vector<platform::Reservation> reservations;
  PlatformState state;
  Status st = platform::EtcdClient::create(std::move(config), &etcd);
  if (st.is_ok()) st = platform::read_platform(*etcd, &receivers, &reservations, &state.revision, &state.skipped);
  // Past the options, nothing is the caller's argument: a refusal by etcd is not kInvalidArgument.
  if (st.code() == Code::kInvalidArgument) return {Code::kIoError, st.message()};
  SLOTSTREAM_RETURN_IF_ERROR(st);
  for (const auto& r : receivers) {
    state.receivers.push_back(
        {r.name, r.address, r.free_cpu, r.free_memory, r.free_receive_memory, r.senders, platform::encode(r)});
  }
  for (const auto& r : reservations) {
    state.reservations.push_back({r.sender, r.receiver, platform::describe(r.amount), platform::encode(r)});
  }
  *out = std::move(state);
  return Status::ok();
}

}  // namespace slotstream
