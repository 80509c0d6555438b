// slotstream public API: move many device streams over one one-sided-RDMA connection (UCX) to a
// passive receiver that hands each device's messages, complete and in order, to a sink.
//
//   Sender: connect -> device(D) per filler thread -> send()/send_with() -> finish()
//   Receiver: start(options with a sink factory) -> ... -> stop()/wait()
//
// The protocol code is the same on every transport: shm (UCX's posix/sysv shared memory, one host),
// tcp (between hosts without RDMA NICs: the library carries puts and gets itself, so the receiver's
// CPU places every block), and rdma (UCX's rc, dc or ud on InfiniBand/RoCE NICs: rc and dc are
// one-sided in the NIC, so by design the receiver's CPU takes no part; ud keeps its reliability in
// software and needs the receiver's progress). docs/rdma.md says what of rdma is tested without a
// NIC and what only scripts/rdma-check.sh checks on hardware.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "slotstream/status.h"

namespace slotstream {

namespace engine {  // what Sender and Receiver dispatch to (internal: src/engine/contract.h)
class SenderEngine;
class ReceiverEngine;
}  // namespace engine

// This library's version, "MAJOR.MINOR.PATCH" (CMake's project VERSION).
const char* version();

// kAuto: shm when both ends share a host and its shared memory, else rdma when both ends have a
// usable RDMA device, else tcp (the receiver decides from the HELLO and says why). kUdp is the
// datagram transport (RDMA over UDP datagrams, docs/datagram.md): the datagram engine behind the same
// Sender and Receiver, with its own protocols (write_record, dgram_send, dgram_rd, rd_write_record;
// its RC baseline dgram_rc runs over tcp) and settings (SenderOptions::datagram,
// ReceiverOptions::datagram). kAuto never chooses it.
enum class Transport { kAuto, kShm, kTcp, kRdma, kUdp };
std::optional<Transport> parse_transport(std::string_view text);  // "auto", "shm", "tcp", "rdma", "udp"
const char* transport_name(Transport t);

// Which of UCX's RDMA transports `rdma` uses: rc (reliable connection, the default: rc_mlx5 or
// rc_verbs), dc (dynamically connected, ConnectX only: dc_mlx5) or ud (unreliable datagram with
// UCX's software reliability: ud_mlx5 or ud_verbs; RMA is emulated, the receiver must progress).
enum class RdmaTransport { kRc, kDc, kUd };
std::optional<RdmaTransport> parse_rdma_transport(std::string_view text);  // "rc", "dc", "ud"
const char* rdma_transport_name(RdmaTransport t);

// Where and how `rdma` runs. A user's UCX_TLS / UCX_NET_DEVICES in the environment win over these
// (and are reported).
struct RdmaOptions {
  // Receiver: which RDMA transport it serves (unset: rc). Sender: unset follows the receiver; set,
  // a receiver that serves another one refuses it.
  std::optional<RdmaTransport> transport;
  // UCX's device name NAME:PORT (e.g. mlx5_0:1: UCX_NET_DEVICES); empty: any device UCX finds.
  std::string device;
};

// What this host offers (`slotstream transports`): each transport, whether it can be used, why
// not; for rdma every device port, from UCX (its components' memory domains and transport
// resources) and, where UCX does not say, /sys/class/infiniband.
struct RdmaPort {
  std::string name;                         // UCX's device name, "mlx5_0:1"
  std::string state;                        // "ACTIVE", "DOWN", ... ("" when unknown)
  std::string link_layer;                   // "InfiniBand", "Ethernet" (RoCE), ... ("" when unknown)
  std::vector<std::string> ucx_transports;  // what UCX offers on it: rc_mlx5, dc_mlx5, ud_verbs, ...
};
struct TransportInfo {
  std::string name;  // shm, tcp, rdma, udp
  bool available = false;
  std::string why;  // what it is and why (not) available
  std::vector<RdmaPort> ports;
};
// Queries UCX (and sysfs) each call; takes milliseconds. `rdma` selects the device and RDMA
// transport that rdma's availability is judged for.
std::vector<TransportInfo> host_transports(const RdmaOptions& rdma = {});

// Defaults chosen for the paper's workload (12 cameras of 640x480x3 = 921,600-byte frames at
// 25 fps): one frame fits one block with its header, and 32 blocks keep more than two frames per
// camera in flight, so a receiver that is briefly slow does not stall the cameras. 32 MiB of
// receiver memory per sender.
inline constexpr uint32_t kDefaultBlocks = 32;
inline constexpr uint32_t kDefaultBlockSize = 1u << 20;
inline constexpr uint32_t kMinBlockSize = 64;
inline constexpr uint32_t kMaxBlockSize = 64u << 20;
inline constexpr uint32_t kMaxBlocks = 4096;
inline constexpr const char* kDefaultProtocol = "status_byte";
// How long a sender waits on a receiver that has stopped saying anything (SenderOptions::stall_timeout):
// long enough for a loaded machine's hiccups, short enough that a stopped receiver is not waited on
// for ever.
inline constexpr std::chrono::milliseconds kDefaultStallTimeout{30000};
inline constexpr std::chrono::milliseconds kMinStallTimeout{2000};

// Sender names become directory names on the receiver: 1-64 characters of [A-Za-z0-9._-], not
// starting with '.' or '-'. Returns the reason when invalid.
std::optional<std::string> invalid_sender_name(std::string_view name);

// "4G", "512M", "64KiB", "1048576": a byte count with an optional binary unit (K, M, G, T =
// 2^10..2^40; "KiB"/"KB"/"K" alike). nullopt when malformed or too large.
std::optional<uint64_t> parse_size(std::string_view text);

// The receiver's default memory budget for all senders' blocks: a quarter of the physical memory,
// or of the container's memory limit when that is lower.
uint64_t default_max_memory();

// "HOST:PORT" or "[IPv6]:PORT" (port 0..65535) as the CLI's --to/--listen take it. *host and *port are set only
// on success; the error says what is wrong with `text`.
Status parse_address(std::string_view text, std::string* host, uint16_t* port);
// A --token-file: the whole file without trailing whitespace; a missing, unreadable or empty file is an error.
Status read_token_file(const std::string& path, std::string* token);

// The protocols this build knows, both engines', for --help, `slotstream protocols` and the benchmark.
struct ProtocolInfo {
  std::string name;
  std::string summary;
  // Which engine runs it: "ucx" (the block protocols, src/engine/ucx/protocol) or "dgram" (the datagram
  // transport's, src/engine/dgram), and the transports it runs on ("shm", "tcp", "rdma"; "udp"; dgram_rc: "tcp").
  std::string engine;
  std::vector<std::string> transports;
  std::string options;                 // the options it takes (NAME:key=value,...), for people
  bool reference = false;              // a benchmark reference, not a protocol for data
  bool holds = false;                  // the receiver can hold single blocks (back-pressure, paper §3.3)
  bool connection_per_device = false;  // devices cannot share a connection: one per device
  bool receiver_progress = false;      // the receiver's CPU takes part in every transfer
  bool receiver_endpoint = false;      // the receiver reaches into the sender's memory (gets, writes)
  bool sender_wakeup = false;          // the idle sending thread sleeps on its worker's wake-up fd
  bool packs = false;                  // small messages share a block by default (pack=on|off)
  // Whether the receiver's CPU takes part in transfers on each transport (the protocol's own
  // receiver_progress, or a transport whose RMA needs the target's progress: tcp, rdma over ud):
  // keys "shm", "tcp", "rdma:rc", "rdma:dc", "rdma:ud" (datagram protocols: their transport, always
  // true: the kernel's sockets). False everywhere for a passive receiver.
  std::map<std::string, bool> receiver_progress_on;
  // The datagram engine's capabilities (false for block protocols, which deliver every message in
  // order or fail): every segment arrives (RD's retransmission, RC's stream); an incomplete message
  // can be kept (RDMA Write-Record, ReceiverOptions::datagram.keep_partial); messages are placed
  // one-sided into the receiver's tagged regions; it can send to an IP multicast group.
  bool reliable = false;
  bool partial = false;
  bool one_sided = false;
  bool multicast = false;
};
// Every protocol of both engines (UCX's first); references (benchmark ceilings) only when asked.
std::vector<ProtocolInfo> protocols(bool with_references = false);

// ------------------------------------------------------------------------------------ Sender

// The datagram transport's default protocol (kUdp with SenderOptions::protocol empty).
inline constexpr const char* kDefaultDatagramProtocol = "write_record";

// Faults injected on the datagrams one end sends or receives (the datagram transport; tests and
// benchmarks): fractions 0..1 of the datagrams, seeded (the same seed, the same faults).
struct DatagramFaults {
  double loss = 0;
  double reorder = 0;
  double duplicate = 0;
  double corrupt = 0;  // one bit flipped: the CRC must catch it
  uint64_t seed = 1;
};

// What the datagram transport's sender needs beyond SenderOptions (docs/datagram.md). Its message
// slots per device are SenderOptions::blocks (STags, or receives posted; 1..1024); block_size
// does not apply.
struct DatagramOptions {
  uint32_t segment_size = 8192;    // payload bytes per datagram (64..65,407; 1408 fits a 1500-byte MTU)
  uint64_t max_message = 1 << 20;  // the largest message this sender will send (its receiver regions' size)
  int ttl = 0;                     // to an IP multicast group: its hop limit (0: 1, this network only)
  std::string interface;           // to an IP multicast group: where its datagrams leave (empty: by route)
  DatagramFaults faults;           // testing: faults on the datagrams this end sends
};

struct SenderOptions {
  std::string host;  // receiver (udp: also an IP multicast group 239.x.y.z, UD protocols only)
  uint16_t port = 0;
  std::string name;  // see invalid_sender_name()
  // NAME or NAME:key=value,... (e.g. "carc:budget=2M"); a datagram protocol (write_record, dgram_rd,
  // ...) with transport udp (dgram_rc: tcp). Empty: the transport's default, kDefaultProtocol, or
  // kDefaultDatagramProtocol over udp.
  std::string protocol;
  Transport transport = Transport::kAuto;
  RdmaOptions rdma;  // for transport rdma, and for auto (whether this end offers rdma)
  uint32_t blocks = kDefaultBlocks;
  uint32_t block_size = kDefaultBlockSize;
  DatagramOptions datagram;       // for the datagram transport (udp, and dgram_rc)
  std::string token;              // empty: no authentication
  std::vector<uint16_t> devices;  // every device this sender will use
  bool allow_reference = false;   // benchmark only: permit reference "protocols"
  // Testing aid (like ReceiverOptions::holds): after every N packets of a device one packet
  // number is left out, as if its block had been lost, so that gap detection can be tested end
  // to end. 0: never.
  uint32_t skip_packet_every = 0;
  // Message numbers on the receiver's disk (a stream that moves between receivers keeps them,
  // src/platform). Empty: each device continues after its last message there. Otherwise one
  // entry per declared device: its first message on this connection is stored as that number,
  // and a number the receiver already has is recognised as a duplicate (dropped, counted).
  std::map<uint16_t, uint64_t> first_message;
  // Ask the receiver to confirm what it has stored while data moves (Sender::confirmed()).
  bool confirm_stored = false;
  // A receiver says something on the control connection at least every second (KEEPALIVE), also
  // while it holds its blocks on purpose (a full disk, a busy worker: the sender then waits, nothing
  // is dropped). One that says nothing for this long is stopped or hung: the sender fails with
  // kPeerGone ("lost the receiver"), as when it dies. The same limit ends a wait for a read of the
  // receiver's memory (the status read) that the transport has not answered while the receiver kept
  // talking (a response the NIC lost): kTransportError. At least 2 s (kMinStallTimeout); 0: wait for ever.
  std::chrono::milliseconds stall_timeout{kDefaultStallTimeout};
};

// What became of one device's messages: the same report for every transport. A block transport
// (shm, tcp, rdma) delivers every message or breaks it with a gap; the datagram transport (udp, and
// its RC baseline) may also keep a message partial, drop it, or lose it whole, and says which.
struct DeviceStats {
  uint64_t messages = 0;    // complete messages stored
  uint64_t bytes = 0;       // payload bytes stored (datagram: also the valid bytes of kept partial messages)
  uint64_t gaps = 0;        // missing packet numbers (datagram: messages of which nothing arrived, = lost)
  uint64_t duplicates = 0;  // duplicate packets dropped (datagram: segments whose bytes were all there)
  uint64_t partial = 0;     // incomplete messages kept (datagram RDMA Write-Record, recv --partial keep)
  uint64_t dropped = 0;     // incomplete messages (or ones not storable in time) discarded
  uint64_t lost = 0;        // messages of which nothing arrived (datagram)
  uint64_t pauses = 0;      // times the device was paused because its sink was busy (worker backlog)
  bool paused = false;      // paused right now

  // Adds another report of the same device (a lane, or another device for a total): counters
  // summed, paused if either is.
  void add(const DeviceStats& o);
};

struct SenderStats {
  uint64_t messages = 0;
  uint64_t bytes = 0;            // payload bytes
  uint64_t records = 0;          // records (block header + payload: a message or a fragment) transmitted
  uint64_t units = 0;            // what the protocol moved: blocks (packed: several records each)
  uint64_t sync_operations = 0;  // status-array reads, ACKs, credit updates...
  uint64_t held_skips = 0;       // receiver blocks skipped because they were held
                                 // (while sending: updated every 64 records)
  // Times the sender found no free receiver space and waited, and their total duration: the
  // synchronisation-control latency, measured the same way for every protocol.
  uint64_t waits = 0;
  uint64_t wait_ns = 0;
  uint64_t connections = 0;  // control connections (lanes) used
  std::map<uint16_t, uint64_t> per_device;
  std::vector<uint64_t> wait_samples_ns;              // one per wait
  std::vector<uint64_t> sync_op_samples_ns;           // one per synchronisation operation (its own cost)
  std::map<std::string, uint64_t> protocol_counters;  // the protocol's own, by name
  // The datagram transport: what the receiver made of every message, as it said when finish()
  // returned (its FIN_ACK), per device: messages = complete, partial, dropped, lost, bytes = the
  // valid bytes. Empty for a block transport (it delivers every message or fails) and for a
  // multicast group (each of its receivers accounts on its own).
  std::map<uint16_t, DeviceStats> delivered;
  bool multicast = false;  // the datagram transport sent to an IP multicast group
};

class Sender;

// One device's stream. Threading: use each DeviceStream from one thread at a time (a filler
// thread); different devices may be filled concurrently. Fillers make no UCX calls, except that
// a filler whose message finds the connection idle transmits it itself (no hand-off delay).
class DeviceStream {
 public:
  // Writes `payload_offset`-relative bytes of the message into `dst` (the free space of a send
  // block). Called once per fragment, in order. A small message is written straight into a
  // block that other devices' messages share (packing): `fill` should copy or compute, not wait.
  using FillFn = std::function<Status(uint64_t payload_offset, std::span<std::byte> dst)>;

  // Sends one message (copied into send blocks, fragmented if larger than one block).
  Status send(std::span<const std::byte> message);
  // Sends one message of `length` bytes produced in place by `fill` (no intermediate copy).
  Status send_with(uint64_t length, const FillFn& fill);

  // Where a message that timed out stands (the fragments already sent).
  struct Progress {
    uint64_t next_fragment = 0;
  };
  // The same, giving up at `deadline` with kTimeout while no send block is free (the receiver is
  // slow, stalled or has this device paused) — so that a caller can check for a signal or its own
  // time limit and call again. Call again with the same message and *progress to continue it
  // where it stopped; a fresh Progress starts a new message, and the receiver then discards the
  // unfinished one (it never stores half a message). The filler never waits inside the protocol:
  // it transmits only while the receiver has room, and leaves the rest to the sending thread.
  Status send(std::span<const std::byte> message, std::chrono::steady_clock::time_point deadline, Progress* progress);
  Status send_with(uint64_t length, const FillFn& fill, std::chrono::steady_clock::time_point deadline,
                   Progress* progress);
  uint16_t device() const { return device_; }

 private:
  friend class Sender;
  using Deadline = std::optional<std::chrono::steady_clock::time_point>;
  DeviceStream(Sender& sender, uint16_t device, void* lane) : sender_(sender), device_(device), lane_(lane) {}
  // A device of an engine other than UCX's (lane_ nullptr): its messages go through the engine.
  Status send_other(uint64_t length, const FillFn& fill, Deadline deadline, Progress* progress);
  // Where a message's bytes come from: `fill` (send_with), or, without one, copied from `message` (send) —
  // a plain copy, not a std::function call per message.
  struct Source {
    const FillFn* fill = nullptr;
    std::span<const std::byte> message;
    Status write(uint64_t offset, std::span<std::byte> dst) const;
  };
  Status send_until(uint64_t length, const Source& source, Deadline deadline, Progress* progress);
  Status send_packed(uint64_t length, const Source& source, Deadline deadline);
  Status send_blocks(uint64_t length, const Source& source, Deadline deadline, Progress* progress);
  uint32_t take_packet();
  Sender& sender_;
  uint16_t device_;
  void* lane_;  // the UCX connection that carries this device (internal); nullptr: another engine's
  uint32_t next_packet_ = 0;
  // Completed send()s and their bytes: written by the device's one filler thread (no atomic
  // read-modify-write per message), read by any thread.
  std::atomic<uint64_t> messages_{0};
  std::atomic<uint64_t> bytes_{0};
};

class Sender {
 public:
  // Connects, authenticates and sets up the protocol. *out is set only on success.
  static Status connect(const SenderOptions& options, std::unique_ptr<Sender>* out);
  // What connect() checks before it touches the network: name, geometry, devices, protocol and
  // its options (an unknown protocol's error lists the known ones). Any thread.
  static Status validate(const SenderOptions& options);
  ~Sender();

  // A handle per device declared in SenderOptions::devices (nullptr for others).
  DeviceStream* device(uint16_t device);
  // Waits until every message is in a receiver block and stored by the receiver, then closes.
  // Call after all fillers have returned. Any thread. Protocol counters in stats() are filled
  // in after this.
  Status finish();
  // Ends the connection at once from any thread, e.g. a watchdog whose filler has waited too long for
  // receiver space, or a caller whose user interrupted a wait (the Python binding): fillers waiting in
  // send() and every later send() or finish() return `why` (the first error wins if the connection had
  // already failed); a finish() in progress returns within ~100 ms. What the receiver has stored stays
  // stored; a message half sent is discarded there, and the receiver reports this sender lost. The
  // Sender must still be destroyed as usual.
  void abort(Status why);
  SenderStats stats() const;
  Transport transport() const;
  // Why the receiver chose transport() (its ACCEPT), and what was tried before it (auto: a
  // transport whose set-up failed on this side, e.g. "shm failed (...); then: tcp: ...").
  const std::string& transport_reason() const;
  uint32_t blocks() const;
  uint32_t block_size() const;
  // With SenderOptions::confirm_stored: what the receiver has confirmed stored of `device` on this
  // connection — messages first .. first + stored - 1 (first: nullopt until it said). Any thread.
  struct Confirmed {
    std::optional<uint64_t> first;
    uint64_t stored = 0;
  };
  Confirmed confirmed(uint16_t device) const;
  // How long since the receiver last said anything on the control connection (the longest of its
  // connections; a live receiver says something at least every second; 0 over the datagram transport,
  // which does not track it). Any thread.
  std::chrono::steady_clock::duration receiver_silence() const;
  // Moves `device`'s numbers on the receiver's disk forward: its next message is stored as `number`
  // (never behind its last one), and confirmed() counts it from there. For a stream whose numbers
  // went on elsewhere meanwhile (the platform's edge, src/platform): call only while every message
  // of the device sent on this connection is confirmed stored and no send() of it is in progress;
  // the other devices keep flowing. Waits for the receiver's answer (kRefused: its sink cannot
  // number, or the number is behind; the connection goes on). Any thread, one call at a time.
  Status continue_at(uint16_t device, uint64_t number, std::chrono::milliseconds timeout);
  // The protocol in use: SenderOptions::protocol's name, or the transport's default.
  const std::string& protocol() const;

  struct Impl;  // the UCX engine (src/engine/ucx/sender.h)

 private:
  friend class DeviceStream;
  explicit Sender(std::unique_ptr<engine::SenderEngine> engine);
  std::unique_ptr<engine::SenderEngine> engine_;  // the engine the options chose
  Impl* impl_ = nullptr;  // engine_ when it is UCX's: the fillers' path goes to it without a virtual call
};

// ---------------------------------------------------------------------------------- Receiver

// One complete message handed to a sink in place (MessageSink::deliver): its bytes lie in the
// receiver block that brought it and are valid only during the call.
struct Message {
  uint16_t device = 0;
  uint32_t packet = 0;  // the packet number of its record (per device, wraps at 2^32)
  // Which of the pass's receive blocks holds it (several small messages can share one: packing).
  // A sink that keeps views of blocks instead of copying (zero-copy receive, below) holds blocks by
  // this index; for a sink that copies, every block is released once the call returned.
  uint32_t block = 0;
  std::span<const std::byte> data;
};

// Where one sender's messages go. Calls for one device come in message order. A message that
// arrived whole in one block (every small message) comes in a batch: deliver() with every such
// message of a consumer pass, devices interleaved, each device's in order. A message that spans
// blocks comes piece by piece: begin, append..., commit (or abort). A failing call has no effect
// and is retried later with the same arguments, so a sink can report a full disk and the data
// waits in the receiver's block (back-pressure) instead of being lost. Threading: one sender's
// sink is called from one thread only.
class MessageSink {
 public:
  virtual ~MessageSink() = default;
  virtual Status begin(uint16_t device) = 0;
  virtual Status append(uint16_t device, std::span<const std::byte> data) = 0;
  virtual Status commit(uint16_t device) = 0;
  virtual void abort(uint16_t device) = 0;
  // Stores `batch` in order; `*stored` = how many were stored. A failure is about message
  // `*stored` (nothing of it was stored: the receiver offers it again later; kBusy pauses its
  // device alone, as from begin()); the messages after it were not looked at. The default calls
  // begin/append/commit for each; a sink that can take a batch in one go (one lock, one
  // notification, one write) overrides it.
  virtual Status deliver(std::span<const Message> batch, size_t* stored);
  // A sink that numbers messages (DirSink): the number the next message of `device` gets, and
  // how many were recognised as stored already (SenderInfo::first_message) and dropped. Same
  // thread as the calls above.
  struct Numbering {
    uint64_t next = 0;
    uint64_t already_stored = 0;
  };
  virtual std::optional<Numbering> numbering(uint16_t /*device*/) { return std::nullopt; }

  // One message of the datagram transport (Transport::kUdp), which may lose messages or keep incomplete
  // ones: each with its sender's number, so that a sink can leave a lost one's number unused (DirSink
  // does: the loss is visible on disk). Same thread and retry contract as above (kBusy pauses the
  // device). The default stores a complete message with begin/append/commit and discards a partial one
  // (it still counts as partial in the report); DirSink stores it as <SEQ>.partial beside <SEQ>.valid.
  struct DatagramMessage {
    uint16_t device = 0;
    uint32_t number = 0;   // the sender's message number of `device` on this connection: 0, 1, 2, ...
    bool partial = false;  // incomplete, kept (DatagramReceiveOptions::keep_partial): holes are zero
    std::span<const std::byte> data;
    std::vector<std::pair<uint64_t, uint64_t>> valid;  // partial: the [offset, length] ranges that arrived
  };
  virtual Status deliver_datagram(const DatagramMessage& m);
};

// ------------------------------------------------------------------------ zero-copy receive
//
// The paper's status 2 (§3.3, §4.2.7) for applications: with ReceiverOptions::make_view_sink each
// complete message is lent to the application where it arrived — a read-only view into the
// receive block the sender wrote, no copy. While any view of a block lives, the block's status
// byte is 2 (held): the sender skips it and keeps writing the other blocks. Releasing the last
// view of a block (MessageView::release() or its destructor, from any thread) sets the byte back
// to 0 and the sender may reuse the block.
//
//   - Small messages packed into one block (record packing) are each lent in place; their block
//     is held until every one of its views is released.
//   - A message that spans several blocks (fragmented), or one copied aside while its device
//     was paused, is copied once into memory the view owns (copied() says so); its blocks are
//     released at once.
//   - Views of one device come in message order; releases may come in any order.
//   - At most ReceiverOptions::max_held_blocks blocks of one sender are held by views at once.
//     At the limit the receiver lends nothing more: further messages wait, unreleased, in their
//     blocks, and the sender waits when it finds no free block — back-pressure, nothing is
//     dropped. The receiver says so (ReceiverOptions::on_event, SessionReport::view_limit_waits):
//     an application that keeps every view while it waits for the next message would otherwise
//     wait forever.
//   - Views may outlive the sender's session (the sender finished or died): the block memory
//     stays mapped until the last view of it is released. Release every view before the
//     Receiver is destroyed (its memory budget no longer counts the session's region).
//   - Only protocols with a per-block status (ProtocolInfo::holds: status_byte) can lend blocks;
//     a sender using another protocol is refused with the reason, or, where the receiver also has
//     a make_sink, served by that sink (a copy; slotstreamsrc does so).
// One message lent in place. Move-only. Threading: a view may be moved to, read on and released
// from any thread; one view is not to be used from two threads at once.
class MessageView {
 public:
  struct Lease;  // what keeps data() valid (internal: src/engine/ucx/stream/lending.h)
  MessageView() = default;
  MessageView(MessageView&&) noexcept = default;
  MessageView& operator=(MessageView&& other) noexcept;
  MessageView(const MessageView&) = delete;
  MessageView& operator=(const MessageView&) = delete;
  ~MessageView() = default;  // releases

  explicit operator bool() const { return lease_ != nullptr; }
  const std::string& sender() const;  // the sender's name (empty for an empty view)
  uint16_t device() const { return device_; }
  uint32_t packet() const { return packet_; }  // the packet number of its (first) record
  // The message's bytes: in the receive block (in place), or in the view's own copy (copied()).
  // Valid until release(); empty afterwards.
  std::span<const std::byte> data() const { return data_; }
  bool copied() const { return copied_; }
  // Whether data() lies in memory registered with UCX for the receive blocks (a check that the
  // view is really in place; false for copies).
  bool in_registered_memory() const;
  // Gives the message back: once every view of its block is released, the sender may reuse the
  // block. Idempotent. Any thread.
  void release();

 private:
  std::shared_ptr<Lease> lease_;
  std::span<const std::byte> data_;
  uint16_t device_ = 0;
  uint32_t packet_ = 0;
  bool copied_ = false;
};

// Where a zero-copy receiver hands one sender's messages (ReceiverOptions::make_view_sink).
// Threading: called from that sender's session thread only, per device in message order.
class ViewSink {
 public:
  virtual ~ViewSink() = default;
  // Takes one message: on success the view (moved out of `view`) is the application's to keep,
  // hand to another thread and release. kBusy: not taken (leave `view` alone) — its device pauses
  // and the message is offered again later (as MessageSink's kBusy). Any other error stalls the
  // sender until it clears, as for a MessageSink.
  virtual Status take(MessageView& view) = 0;
};

struct SenderInfo {
  std::string name;
  std::string peer;  // control connection's remote address
  std::string protocol;
  Transport transport = Transport::kShm;
  uint32_t blocks = 0;
  uint32_t block_size = 0;
  std::vector<uint16_t> devices;
  // SenderOptions::first_message as the sender asked: empty, or each device's first number.
  std::map<uint16_t, uint64_t> first_message;
};

// How long the receiver took to store a sender's messages: from the consumer pass that first took
// up a message's first block to the sink's commit (reassembly of fragments, back-pressure waits,
// the write itself). Not end to end: a block header carries no send time, and two hosts' clocks
// are not comparable. Prometheus-style buckets (slotstream_message_store_seconds).
struct LatencyHistogram {
  // Upper bounds in seconds; a last bucket counts what exceeds them all.
  static constexpr std::array<double, 16> kBounds = {0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                     0.025,   0.05,   0.1,     0.25,   0.5,   1,      2.5,   5};
  std::array<uint64_t, kBounds.size() + 1> buckets{};  // per bucket, not cumulative
  uint64_t count = 0;
  double sum_seconds = 0;
  // `n` observations of one value (the messages a receiver's pass stores in one batch share their
  // store latency: one bucket lookup for all of them).
  void observe(double seconds, uint64_t n = 1);
  void merge(const LatencyHistogram& other);
};

struct SessionReport {
  SenderInfo sender;
  bool finished = false;  // true: clean FIN; false: lost (peer died) or stopped
  std::string reason;     // why it ended, when not finished
  uint64_t messages = 0;  // complete messages stored
  uint64_t bytes = 0;
  uint64_t gaps = 0;  // missing packets
  uint64_t duplicates = 0;
  uint64_t unknown_device = 0;  // blocks for devices the sender did not declare
  uint64_t out_of_window = 0;   // packet numbers far outside the reorder window
  uint64_t bad_headers = 0;
  uint64_t partial_discarded = 0;
  uint64_t already_stored = 0;  // messages whose number was stored already (a resent stream), dropped
  uint64_t held_blocks = 0;     // blocks held right now (back-pressure, --hold-block)
  // Zero-copy receive: views lent (messages handed in place; copied ones not counted), blocks the
  // application holds through views right now, and times the receiver stopped lending because
  // that reached ReceiverOptions::max_held_blocks (the sender then waits).
  uint64_t views_lent = 0;
  uint64_t views_held_blocks = 0;
  uint64_t view_limit_waits = 0;
  uint64_t stalls = 0;  // times the sink refused data (disk full, worker backlog)
  // Buffer utilisation (SDP Fig. 6): receiver memory held by records not yet released, and the
  // payload bytes in it, on average over the session (bytes; time-weighted).
  double buffer_held_avg = 0;
  double buffer_useful_avg = 0;
  double seconds = 0;
  std::map<uint16_t, DeviceStats> per_device;
  // The receiving protocol's own counters (e.g. credit updates sent, most unprocessed bytes,
  // buffered_read's reads and bytes read; the datagram transport's datagrams, CRC errors, ...),
  // summed over the sender's connections; documented where each protocol counts them (protocol.h,
  // src/engine/dgram/recv/report.h).
  std::map<std::string, uint64_t> protocol_counters;
  LatencyHistogram store_latency;  // complete messages, from first block to stored

  // Adds another connection (lane) of the same sender: every counter summed, devices and
  // per-device counters merged, finished only if both are, the first reason kept, the longer
  // duration. What the receiver's final report and its live counters both use.
  void merge(const SessionReport& lane);
};

struct HoldSpec {  // hold receiver block `index` from `from_ms` to `to_ms`
  uint32_t index = 0;
  uint32_t from_ms = 0;
  uint32_t to_ms = 0;
};

// What the datagram transport's receiver needs beyond ReceiverOptions (docs/datagram.md).
struct DatagramReceiveOptions {
  // With a multicast group as ReceiverOptions::host (239.x.y.z): the interface to join it on (empty:
  // the one the kernel routes the group to).
  std::string interface;
  // An RDMA Write-Record message still incomplete when its timer fires is handed to the sink as
  // partial (MessageSink::deliver_datagram) instead of being counted and discarded.
  bool keep_partial = false;
  // From a message's first segment until it is given up as incomplete (and from a later message until
  // one of which nothing arrived counts as lost).
  std::chrono::nanoseconds message_timeout = std::chrono::milliseconds(200);
  // Silence after which a sender is lost, and a reliable protocol's message without a new byte is given up.
  std::chrono::nanoseconds session_timeout = std::chrono::seconds(30);
  uint64_t max_message = 64ull << 20;  // the largest message (region) a sender may announce
  DatagramFaults faults;               // testing: faults on the datagrams this end receives
};

struct ReceiverOptions {
  std::string host = "0.0.0.0";
  uint16_t port = 0;
  Transport transport = Transport::kAuto;  // which transports senders may use
  RdmaOptions rdma;                        // rdma's device and RDMA transport (rc unless set)
  std::string token;                       // empty: no authentication
  // Creates the sink for a newly accepted sender.
  std::function<Status(const SenderInfo&, std::unique_ptr<MessageSink>*)> make_sink;
  // Zero-copy receive (see MessageView): each sender's messages are lent in place to the ViewSink
  // it creates. A sender whose protocol cannot hold blocks gets make_sink's sink instead (its
  // messages copied; SenderInfo::protocol says which), or is refused when make_sink is unset.
  std::function<Status(const SenderInfo&, std::unique_ptr<ViewSink>*)> make_view_sink;
  // Most blocks of one sender that views may hold at once (0: half its blocks, at least 1; more
  // than its blocks counts as all of them).
  uint32_t max_held_blocks = 0;
  // Called when a sender's session ends: from the session's thread (UCX transports), or (udp) from the
  // receiver's callback thread, in order with on_event — never from its network thread, so a callback
  // that blocks (a stdout nobody reads) holds back only the reports and events after it, not the senders.
  // sessions_ended() and wait_sessions() count a session once this has returned.
  std::function<void(const SessionReport&)> on_session_end;
  // Called when a connection is refused or a sink reports an error (for logs/CLI).
  std::function<void(const std::string&)> on_event;
  // Called instead of on_event for what needs someone to act (a sink that can store nothing, e.g. a
  // full disk: blocks are held, the sender waits, nothing is dropped); unset: on_event.
  std::function<void(const std::string&)> on_warning;
  std::vector<HoldSpec> holds;  // test/benchmark aid (paper §3.3)
  bool busy_poll = false;       // never sleep when idle (latency measurements)
  // One consumer thread serves every sender in turn, one pass each, instead of a thread per
  // sender (the thesis's single receiver; `bench fan_in`).
  bool round_robin = false;
  // Most bytes of blocks given to all connected senders together (0: default_max_memory()). A
  // sender that would pass it is refused before anything is allocated.
  uint64_t max_memory = 0;
  // Unprocessed bytes waiting for workers, reported to capacity queries (optional).
  std::function<uint64_t()> backlog_bytes;
  // transport udp: the datagram receiver's settings. It serves UD and RD senders on a UDP port and
  // dgram_rc senders on the TCP port of the same number; make_view_sink does not apply (no blocks to
  // lend: with make_sink set its messages are copied to it, without it start() refuses).
  DatagramReceiveOptions datagram;
};

// What a receiver reports to `send --to A,B,C` when asked for its capacity.
struct Capacity {
  uint32_t senders = 0;         // connections served now
  uint64_t backlog_bytes = 0;   // unprocessed bytes waiting for workers
  double load = 0;              // 1-minute load average per CPU
  uint64_t shm_free_bytes = 0;  // free space in /dev/shm (where shm regions live)
};
// Asks a receiver's control port for its capacity (2 s deadline).
Status query_capacity(const std::string& host, uint16_t port, Capacity* out);

// Connections a receiver refused since it started, by reason. `refused` counts every refusal
// (reasons: protocol, options, geometry, name, devices, transport, authentication,
// already_connected, memory, busy, evicted (an unauthenticated connection closed to make room for
// new ones), bad_hello, timeout, setup, other); `authentication_failures`
// counts the authentication ones again, by what failed (wrong_token, no_proof, unsigned_setup).
struct RefusalCounts {
  std::map<std::string, uint64_t> refused;
  std::map<std::string, uint64_t> authentication_failures;
};

class Receiver {
 public:
  // Binds the control listener and starts serving. *out is set only on success.
  static Status start(ReceiverOptions options, std::unique_ptr<Receiver>* out);
  ~Receiver();  // stops
  std::string listen_address() const;
  // Stops accepting, ends every session (discarding partial messages). Any thread. Each connected
  // sender is told, before the receiver's memory goes, that the receiver stopped — with `reason`
  // when given (e.g. "the receiver's worker failed: ...") — and reports that rather than a
  // transport error. The first stop's reason is the one told (shm, tcp, rdma; the datagram transport
  // ends its sessions without it).
  void stop();
  void stop(const std::string& reason);
  // Number of accepted sessions that have ended.
  uint64_t sessions_ended() const;
  // Counters of the senders being served now, one report per sender (its connections merged;
  // refreshed every ~100 ms). Any thread.
  std::vector<SessionReport> live_sessions() const;
  // Blocks until `sessions_ended() >= n` or stop() was called.
  void wait_sessions(uint64_t n);
  // Refused connections so far, by reason. Any thread.
  RefusalCounts refusals() const;
  // The control listener is open and its accept loop runs (false once stop() was called).
  bool accepting() const;
  // Receiver memory promised to the connected senders' blocks, and the budget it counts against
  // (ReceiverOptions::max_memory, or its default). Any thread.
  uint64_t memory_in_use() const;
  uint64_t memory_budget() const;
  // The receiver's own counters beyond its senders' reports: for udp the datagrams that belonged to no
  // session ("unattributed:<key>", keys as SessionReport::protocol_counters), and what it turned away
  // or cut short ("hellos_refused", "challenges", "auth_failures", "announces_refused:<reason>",
  // "connections", ...: docs/datagram.md). Empty over UCX (refusals() says what it refused). Any thread.
  std::map<std::string, uint64_t> counters() const;
  // False while a sender that finished may still repeat its FIN: udp answers a FIN with a FIN_ACK that
  // can be lost, and the sender repeats its FIN every 200 ms until it hears one — a receiver about to
  // exit after its last sender waits for this (about a second after the last FIN it answered). Always
  // true over UCX. Any thread.
  bool settled() const;

  struct Impl;  // the UCX engine (src/engine/ucx/receiver.h)

 private:
  explicit Receiver(std::unique_ptr<engine::ReceiverEngine> engine);
  std::unique_ptr<engine::ReceiverEngine> engine_;
};

}  // namespace slotstream
