// The edge server (`slotstream edge`, docs/platform.md): it processes its own devices, each into a sink of
// its own, and while its load is above a threshold it offloads devices one at a time to receivers the
// platform schedules, through a PlatformSender — taking them back when the load falls below another
// (OffloadPolicy, decide_offload: slotstream/platform.h).
//
// A device's messages keep their numbers across every move: an offloaded device's next message is
// numbered on the receiver from the local sink's next one (NUMBER on the open connection), and a device
// coming back continues locally after the last one the receiver confirmed stored, so every message is
// stored exactly once, here or on a receiver. A move is one device's: the others keep their connection
// (PlatformSender::set_devices; docs/platform.md says when a move must reconnect them). While a device
// moves, its new messages wait in the edge (up to 256 MiB over all devices) instead of stalling its
// filler.
//
//   EdgeServer: add(device, sink) per device -> send_with(...) per filler thread, control() on one
//   thread -> stop control(), join the fillers -> finish() -> stats()
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slotstream/platform.h"
#include "slotstream/slotstream.h"

namespace slotstream {

struct EdgeServerOptions {
  OffloadPolicy policy;
  PlatformNeed per_device;  // what one offloaded device needs of a receiver
  // The load the policy compares with its thresholds (CpuMeter's busy percent, a worker backlog, ...).
  // Called from control()'s thread about every 100 ms.
  std::function<double()> load;
  // Each move decided and each move no receiver took, one line (control()'s thread; may be empty).
  std::function<void(const std::string&)> on_event;
};

struct EdgeDeviceStats {
  uint64_t local = 0;   // messages stored here
  uint64_t remote = 0;  // messages sent through the platform
  uint64_t held = 0;    // messages that waited in the edge during a move
  uint64_t holds = 0;   // moves that held this device's messages (its own, and those that reconnected it)
};

struct EdgeServerStats {
  std::map<uint16_t, EdgeDeviceStats> devices;
  uint64_t moves = 0;            // moves tried
  uint64_t refused_moves = 0;    // of which no receiver took: the device stayed here
  uint64_t reconnect_moves = 0;  // moves that had to reconnect the devices offloaded already
  std::vector<double> move_ms;   // each move, from its decision until its devices landed
};

// Threading: add() before anything else, from one thread; send_with() of one device from one thread at a
// time, different devices concurrently; control() on one thread of its own; finish() once control() has
// returned and no send_with() is in progress; stats() after finish().
class EdgeServer {
 public:
  // `remote` is connected with no device offloaded and every device movable
  // (PlatformSenderOptions::movable); it must outlive the edge server.
  EdgeServer(EdgeServerOptions options, PlatformSender& remote);
  ~EdgeServer();
  EdgeServer(const EdgeServer&) = delete;
  EdgeServer& operator=(const EdgeServer&) = delete;

  // Device `device` is processed here by `sink`; its numbers continue the sink's (MessageSink::numbering).
  // A device that comes back continues at a number the receiver gives: `sink` must be a SkippableSink
  // (slotstream/sinks.h), or that device fails with the reason.
  void add(uint16_t device, std::unique_ptr<MessageSink> sink);
  // One message of `device`, stored here or sent through the platform, wherever the device goes now
  // (DeviceStream::send_with's contract). A busy local sink (its worker is behind) is waited for.
  Status send_with(uint16_t device, uint64_t length, const DeviceStream::FillFn& fill);
  // Reads the load and moves devices as the policy says until `done` is set.
  void control(const std::atomic<bool>& done);
  // The end: the platform sender is finished (what went to receivers is stored there), its reservation
  // released, and every device's numbers checked (kProtocolError names a device whose numbers do not run
  // on: a bug). Also the first error a device met.
  Status finish();
  EdgeServerStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace slotstream
