// The sender: a facade that checks what every engine checks and runs the engine the options choose
// (src/engine/contract.h): the datagram engine (src/engine/dgram/engine.h) for transport udp and the
// datagram protocols, else UCX's (src/engine/ucx/sender.h).
#include "engine/ucx/sender.h"
#include "common.h"
#include "engine/contract.h"
#include "engine/dgram/engine.h"
#include "engine/hello_rules.h"
#include "slotstream/options.h"
#include "slotstream/slotstream.h"

namespace slotstream {

namespace {

// What every engine checks: the name, the ranges of the option schema (slotstream/options.h), devices.
Status validate_common(const SenderOptions& o) {
  if (auto why = invalid_sender_name(o.name)) return {Code::kInvalidArgument, *why + " ('" + o.name + "')"};
  SLOTSTREAM_RETURN_IF_ERROR(check_sender_options(o));
  if (o.devices.empty()) return {Code::kInvalidArgument, "no devices declared"};
  // The receiver refuses such a hello too (engine/hello_rules.h): said here before connecting.
  if (auto why = engine::check_devices(o.devices)) return {Code::kInvalidArgument, *why};
  return Status::ok();
}

}  // namespace

Sender::Sender(std::unique_ptr<engine::SenderEngine> engine)
    : engine_(std::move(engine)),
      impl_(dynamic_cast<Impl*>(engine_.get())) {}

Sender::~Sender() = default;  // the engine ends what is still running

Status Sender::validate(const SenderOptions& options) {
  SLOTSTREAM_RETURN_IF_ERROR(validate_common(options));
  if (engine::engine_for(options.transport, options.protocol) == engine::Kind::kDatagram) {
    return dgram::validate_sender(options);
  }
  const protocol::Descriptor* desc = nullptr;
  protocol::Options proto_options;
  return Impl::validate(options, &desc, &proto_options);
}

Status Sender::connect(const SenderOptions& options, std::unique_ptr<Sender>* out) {
  SLOTSTREAM_RETURN_IF_ERROR(validate_common(options));
  if (engine::engine_for(options.transport, options.protocol) == engine::Kind::kDatagram) {
    std::unique_ptr<dgram::EngineSender> engine;
    SLOTSTREAM_RETURN_IF_ERROR(dgram::EngineSender::connect(options, &engine));
    dgram::EngineSender& e = *engine;
    std::unique_ptr<Sender> sender(new Sender(std::move(engine)));
    for (uint16_t d : options.devices) e.adopt(d, std::unique_ptr<DeviceStream>(new DeviceStream(*sender, d, nullptr)));
    *out = std::move(sender);
    return Status::ok();
  }
  return Impl::connect(options, out);
}

// ------------------------------------------------------------------------------ the facade

DeviceStream* Sender::device(uint16_t device) { return engine_->device(device); }
Status Sender::finish() { return engine_->finish(); }
void Sender::abort(Status why) { engine_->abort(std::move(why)); }
SenderStats Sender::stats() const { return engine_->stats(); }
Transport Sender::transport() const { return engine_->transport(); }
const std::string& Sender::transport_reason() const { return engine_->transport_reason(); }
const std::string& Sender::protocol() const { return engine_->protocol(); }
uint32_t Sender::blocks() const { return engine_->blocks(); }
uint32_t Sender::block_size() const { return engine_->block_size(); }
Status Sender::continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) {
  return engine_->continue_at(device, number, timeout);
}
Sender::Confirmed Sender::confirmed(uint16_t device) const { return engine_->confirmed(device); }
std::chrono::steady_clock::duration Sender::receiver_silence() const { return engine_->receiver_silence(); }

}  // namespace slotstream
