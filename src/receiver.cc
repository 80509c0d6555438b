// The receiver: a facade that checks what every engine needs and runs the engine the transport
// chooses (src/engine/contract.h): the datagram engine (src/engine/dgram/engine.h) for udp, else
// UCX's (src/engine/ucx/receiver.h).
#include "engine/ucx/receiver.h"
#include "common.h"
#include "engine/contract.h"
#include "engine/dgram/engine.h"
#include "slotstream/options.h"
#include "slotstream/slotstream.h"

namespace slotstream {

Receiver::Receiver(std::unique_ptr<engine::ReceiverEngine> engine) : engine_(std::move(engine)) {}

Receiver::~Receiver() = default;  // the engine stops

Status Receiver::start(ReceiverOptions options, std::unique_ptr<Receiver>* out) {
  if (!options.make_sink && !options.make_view_sink) {
    return {Code::kInvalidArgument, "ReceiverOptions::make_sink (or make_view_sink, for zero-copy) is required"};
  }
  SLOTSTREAM_RETURN_IF_ERROR(check_receiver_options(options));
  if (options.max_memory == 0) options.max_memory = default_max_memory();
  std::unique_ptr<engine::ReceiverEngine> engine;
  if (options.transport == Transport::kUdp) {
    SLOTSTREAM_RETURN_IF_ERROR(dgram::start_receiver(std::move(options), &engine));
  } else {
    SLOTSTREAM_RETURN_IF_ERROR(Impl::start(std::move(options), &engine));
  }
  out->reset(new Receiver(std::move(engine)));
  return Status::ok();
}

// ------------------------------------------------------------------------------ the facade

std::string Receiver::listen_address() const { return engine_->listen_address(); }
void Receiver::stop() { engine_->stop(""); }
void Receiver::stop(const std::string& reason) { engine_->stop(reason); }
uint64_t Receiver::sessions_ended() const { return engine_->sessions_ended(); }
std::vector<SessionReport> Receiver::live_sessions() const { return engine_->live_sessions(); }
void Receiver::wait_sessions(uint64_t n) { engine_->wait_sessions(n); }
RefusalCounts Receiver::refusals() const { return engine_->refusals(); }
bool Receiver::accepting() const { return engine_->accepting(); }
uint64_t Receiver::memory_in_use() const { return engine_->memory_in_use(); }
uint64_t Receiver::memory_budget() const { return engine_->memory_budget(); }
std::map<std::string, uint64_t> Receiver::counters() const { return engine_->counters(); }
bool Receiver::settled() const { return engine_->settled(); }

}  // namespace slotstream
