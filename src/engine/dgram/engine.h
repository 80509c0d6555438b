// The datagram engine behind Sender and Receiver (src/engine/contract.h): DatagramSender and DatagramReceiver
// (engine/dgram/send/sender.h, engine/dgram/recv/receiver.h) with slotstream's options, sinks and reports. Sender and
// Receiver choose it for transport udp and for a datagram protocol's name (dgram_rc runs over tcp).
//
//   SenderOptions          -> DatagramSenderOptions: blocks = message slots per device (ring),
//                             datagram.* = segment size, largest message, multicast TTL and interface,
//                             faults; the protocol's default is write_record
//   finish()               -> FIN, then the receiver's FIN_ACK: SenderStats::delivered
//   ReceiverOptions        -> DatagramReceiverOptions: datagram.* = partial messages, timers, largest
//                             message, multicast interface, faults
//   make_sink's MessageSink   each message through MessageSink::deliver_datagram (its number, partial
//                             or complete): the sink is the store
//
// What the datagram transport cannot do is refused with the reason: zero-copy receive (no blocks to
// lend), numbered streams and stored confirmations (SenderOptions::first_message, confirm_stored,
// Sender::continue_at), the block transports' testing aid skip_packet_every.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "engine/contract.h"
#include "engine/dgram/send/sender.h"
#include "engine/dgram/wire/control.h"
#include "slotstream/slotstream.h"

namespace slotstream::dgram {

// What Sender::validate says of options that choose the datagram engine, beyond what every engine
// checks (name, the option schema's ranges, devices): the protocol and the transport agree, and
// nothing is asked that this engine cannot do.
Status validate_sender(const SenderOptions& o);

class EngineSender final : public engine::SenderEngine {
 public:
  // Validates, then connects (the handshake; to a multicast group: its ANNOUNCE). *out is set only on success.
  static Status connect(const SenderOptions& o, std::unique_ptr<EngineSender>* out);
  // The Sender's handle of a declared device (Sender::connect makes them: DeviceStream is its friend).
  void adopt(uint16_t device, std::unique_ptr<DeviceStream> stream);

  DeviceStream* device(uint16_t device) override;
  // `fill` is called once, for the whole message (one "fragment"); a deadline does not apply: only
  // dgram_rd waits, for the receiver's credits.
  Status send_with(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill, engine::Deadline deadline,
                   DeviceStream::Progress* progress) override;
  Status send(uint16_t device, std::span<const std::byte> message, engine::Deadline deadline,
              DeviceStream::Progress* progress) override;
  Status finish() override;
  void abort(Status why) override;
  SenderStats stats() const override;
  Transport transport() const override { return transport_; }
  const std::string& transport_reason() const override { return reason_; }
  const std::string& protocol() const override { return protocol_; }
  uint32_t blocks() const override { return ring_; }
  uint32_t block_size() const override { return 0; }  // no blocks: messages go whole into regions
  Sender::Confirmed confirmed(uint16_t) const override { return {}; }
  // Not tracked: the datagram receiver's liveness is its session timeout, and a reliable protocol's
  // sender fails when its retransmissions go unanswered.
  std::chrono::steady_clock::duration receiver_silence() const override { return {}; }
  Status continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout) override;

 private:
  EngineSender() = default;
  Status first_error() const;
  // A send's failure, or why the sender was aborted meanwhile.
  Status sent(Status st) const;

  std::unique_ptr<DatagramSender> tx_;
  std::map<uint16_t, std::unique_ptr<DeviceStream>> streams_;
  std::string protocol_;
  Transport transport_ = Transport::kUdp;
  std::string reason_;
  uint32_t ring_ = 0;
  mutable std::mutex mu_;  // guards what follows
  Status aborted_;         // abort()'s reason: every later send and finish returns it
  bool finished_ = false;
  Status finish_status_;
  FinAck report_;  // the receiver's FIN_ACK, after finish()
};

// Starts the datagram receiver for `o` (o.transport is udp). *out is set only on success.
Status start_receiver(ReceiverOptions o, std::unique_ptr<engine::ReceiverEngine>* out);

}  // namespace slotstream::dgram
