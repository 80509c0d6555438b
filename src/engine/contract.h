// The one contract behind Sender and Receiver (include/slotstream/slotstream.h). Each engine implements
// it: UCX's block engine (Sender::Impl and Receiver::Impl, src/engine/ucx/sender.h and receiver.h) and the
// datagram engine (src/engine/dgram/engine.h). Sender and Receiver are facades: they check the options, pick the
// engine by transport and protocol (engine_for) and forward every call.
//
// One exception keeps UCX's hot path as it was: a filler's DeviceStream::send on a UCX device goes
// straight to its lane (no virtual call per message); only other engines' devices go through
// SenderEngine::send_with.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"

namespace slotstream::engine {

enum class Kind { kUcx, kDatagram };

// Which engine runs `options`: the datagram one for transport udp or a datagram protocol's name
// (dgram_rc runs over tcp), UCX's otherwise. `protocol` is SenderOptions::protocol.
Kind engine_for(Transport transport, const std::string& protocol);

using Deadline = std::optional<std::chrono::steady_clock::time_point>;

// A connected sender. Threading: as Sender's public functions (any thread), and send_with as
// DeviceStream's (one thread per device).
class SenderEngine {
 public:
  virtual ~SenderEngine() = default;
  // The handle of a declared device (nullptr for others).
  virtual DeviceStream* device(uint16_t device) = 0;
  // One message of `device` (DeviceStream::send_with's contract; `progress` continues one that timed out).
  virtual Status send_with(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill, Deadline deadline,
                           DeviceStream::Progress* progress) = 0;
  // The same for a message given whole (DeviceStream::send): an engine may send it from where it lies.
  virtual Status send(uint16_t device, std::span<const std::byte> message, Deadline deadline,
                      DeviceStream::Progress* progress) = 0;
  // Waits until the receiver has accounted for every message (stats().delivered: what it said), then closes.
  virtual Status finish() = 0;
  virtual void abort(Status why) = 0;
  virtual SenderStats stats() const = 0;
  virtual Transport transport() const = 0;
  virtual const std::string& transport_reason() const = 0;
  virtual const std::string& protocol() const = 0;
  virtual uint32_t blocks() const = 0;
  virtual uint32_t block_size() const = 0;
  virtual Sender::Confirmed confirmed(uint16_t device) const = 0;
  virtual std::chrono::steady_clock::duration receiver_silence() const = 0;
  virtual Status continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) = 0;
};

// A started receiver. Threading: any thread (Receiver's contract).
class ReceiverEngine {
 public:
  virtual ~ReceiverEngine() = default;
  virtual std::string listen_address() const = 0;
  // Receiver::stop(reason): UCX tells each connected sender the reason; the datagram engine ends its
  // sessions without one.
  virtual void stop(const std::string& reason) = 0;
  virtual uint64_t sessions_ended() const = 0;
  virtual std::vector<SessionReport> live_sessions() const = 0;
  virtual void wait_sessions(uint64_t n) = 0;
  virtual RefusalCounts refusals() const = 0;
  virtual bool accepting() const = 0;
  virtual uint64_t memory_in_use() const = 0;
  virtual uint64_t memory_budget() const = 0;
  virtual std::map<std::string, uint64_t> counters() const = 0;
  virtual bool settled() const = 0;
};

}  // namespace slotstream::engine
