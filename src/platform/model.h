// The platform's data model in etcd (docs/platform.md has the whole picture):
//
//   /slotstream/v1/receivers/<receiver>             ReceiverRecord (JSON), under the receiver's lease
//   /slotstream/v1/reservations/<receiver>/<sender> Reservation (JSON), under the sender's lease
//
// A receiver's key exists while the receiver lives (it keeps its lease alive); a reservation while
// its sender lives. What a receiver has room for is its capacity minus the reservations under its
// name — a sum that only a transaction comparing the mod revisions of that whole prefix may add
// to (reservation.h), so concurrent requesters never over-commit one receiver.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "slotstream/status.h"

namespace slotstream::platform {

inline constexpr const char* kPrefix = "/slotstream/v1/";
std::string receivers_prefix();
std::string receiver_key(const std::string& receiver);
std::string reservations_prefix();
std::string reservations_prefix(const std::string& receiver);  // one receiver's
std::string reservation_key(const std::string& receiver, const std::string& sender);

// What a sender asks for, and what a reservation holds: processing (CPU cores for its workers),
// bandwidth (bytes/s), frame rate (messages/s) and receive memory (its blocks, bytes).
struct Amount {
  double cpu = 0;
  double bandwidth = 0;
  double fps = 0;
  double memory = 0;
  Amount& operator+=(const Amount& o);
};
// "cpu 1.5, 46.1 MB/s, 300 fps, 32.0 MiB"
std::string describe(const Amount& a);

// The most any amount or capacity on the platform may be. A number beyond it — or negative, or not
// finite — is a mistake or a forgery: a reservation of cpu -100 would make room for others on a full
// receiver, an absurdly large one would swallow the small ones it is summed with.
inline constexpr double kMaxCpu = 1 << 20;                // cores
inline constexpr double kMaxBandwidth = 1e15;             // bytes/s (8 Pb/s)
inline constexpr double kMaxFps = 1e9;                    // messages/s
inline constexpr double kMaxMemory = double(1ull << 50);  // bytes (1 PiB)
// Why `a` is not an amount the platform takes ("cpu -100: must be 0..1048576"), or nullopt.
std::optional<std::string> invalid_amount(const Amount& a);

// A receiver's capacity for platform senders; an unset dimension is not limited.
struct Capacity {
  std::optional<double> cpu, bandwidth, fps, memory;
};

// What a receiver publishes about itself (and refreshes about every second).
struct ReceiverRecord {
  std::string name;
  std::string address;                  // its control address, HOST:PORT, for senders
  std::vector<std::string> transports;  // those it serves ("shm", "tcp")
  std::string host_id;                  // shm needs sender and receiver on one host
  Capacity capacity;
  // Measured now: idle CPU cores, available memory, the part of its receive memory budget
  // (--max-memory) no sender holds, connected senders, bytes waiting for its workers.
  double free_cpu = 0;
  uint64_t free_memory = 0;
  uint64_t free_receive_memory = 0;
  uint32_t senders = 0;
  uint64_t backlog_bytes = 0;
  int64_t updated_ms = 0;  // wall clock of the last refresh
  // Not in the JSON: etcd's create revision of the record as read (which registration it is).
  int64_t registered_revision = 0;
};
std::string encode(const ReceiverRecord& r);
// Parses and checks a record (check_record): a bad one is a kProtocolError saying what is wrong.
Status decode(const std::string& json, ReceiverRecord* out);
// What makes `r` a record no live receiver wrote: a name that is not one, an address that is not
// HOST:PORT (port 1-65535), an unknown transport, a capacity or a measure out of range.
std::optional<std::string> invalid_record(const ReceiverRecord& r);

struct Reservation {
  std::string sender;
  std::string receiver;
  Amount amount;
  std::vector<uint16_t> devices;
};
std::string encode(const Reservation& r);
// Parses and checks a reservation: names, an amount in range (invalid_amount), at most
// kMaxReservationDevices devices.
Status decode(const std::string& json, Reservation* out);
inline constexpr size_t kMaxReservationDevices = 4096;

// Receiver and sender names become key parts: 1-64 characters of [A-Za-z0-9._:-], not starting
// with '.' or '-'. Returns why a name is not one.
std::optional<std::string> invalid_platform_name(const std::string& name);

}  // namespace slotstream::platform
