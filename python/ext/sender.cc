// Python's Sender (slotstream.h Sender): connect, send, finish, close, stats, and its Python class.
#include <unistd.h>

#include "sender.h"

namespace slotstream::py {

std::string default_sender_name() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

// Checks and declares devices for a sender: 0..65535, each once; one mutex each.
std::vector<uint16_t> declare_devices(const std::vector<int>& devices, DeviceLocks* locks) {
  std::vector<uint16_t> out;
  for (int d : devices) {
    if (d < 0 || d > 65535) check({Code::kInvalidArgument, "device " + std::to_string(d) + " is not in 0..65535"});
    if (locks->contains(d)) check({Code::kInvalidArgument, "device " + std::to_string(d) + " is declared twice"});
    out.push_back(uint16_t(d));
    (*locks)[d] = std::make_unique<std::mutex>();
  }
  return out;
}

std::mutex* device_lock(DeviceLocks& locks, int device) {
  auto it = locks.find(device);
  if (it == locks.end()) {
    check({Code::kInvalidArgument,
           "device " + std::to_string(device) + " was not declared (Sender(..., devices=[...]) lists every device)"});
  }
  return it->second.get();
}

namespace {

class PySender : public SenderLife<Sender> {
 public:
  PySender(const std::string& to, std::optional<std::string> name, const std::string& transport,
           std::optional<std::string> protocol, int64_t blocks, int64_t block_size, const std::vector<int>& devices,
           std::optional<std::string> token, std::optional<std::string> rdma_transport,
           std::optional<std::string> rdma_device, std::optional<int64_t> segment_size,
           std::optional<int64_t> max_message, std::optional<int64_t> ttl, std::optional<std::string> interface,
           double stall_timeout)
      : SenderLife("Sender") {
    const SenderArgs args{std::move(name),
                          transport,
                          std::move(protocol),
                          blocks,
                          block_size,
                          std::move(token),
                          std::move(rdma_transport),
                          std::move(rdma_device),
                          segment_size,
                          max_message,
                          ttl,
                          std::move(interface),
                          stall_timeout};
    SenderOptions o = args.options(devices, &device_locks_);
    check(parse_address(to, &o.host, &o.port));
    Status st;
    {
      nb::gil_scoped_release nogil;  // the handshake may take seconds
      st = Sender::connect(o, &sender_);
    }
    check(st);
    transport_ = transport_name(sender_->transport());
    transport_reason_ = sender_->transport_reason();
    o.protocol = sender_->protocol();
    options_ = std::move(o);
  }

  void send(int device, nb::handle data, std::optional<double> timeout) {
    send_with(
        device, data, timeout,
        [device](Sender& s, std::span<const std::byte> bytes, Clock::time_point step,
                 DeviceStream::Progress* progress) { return s.device(uint16_t(device))->send(bytes, step, progress); });
  }
  void finish(std::optional<double> timeout) { SenderLife::finish(timeout); }
  void finish_no_timeout() { SenderLife::finish(); }
  void close() { SenderLife::close(); }

  nb::dict stats() const {
    auto s = stats_snapshot();
    nb::dict d;
    if (!s) return d;
    // The protocol counters (blocks, synchronisations) are left out: their names are still
    // changing in the C++ API, and `slotstream bench` is where they are reported.
    d["messages"] = s->messages;
    d["bytes"] = s->bytes;
    d["held_skips"] = s->held_skips;
    d["connections"] = s->connections;
    d["per_device"] = s->per_device;
    if (!s->delivered.empty()) {  // the datagram transport: what the receiver said at finish()
      nb::dict delivered;
      for (const auto& [device, c] : s->delivered) {
        nb::dict x;
        x["complete"] = c.messages;
        x["partial"] = c.partial;
        x["dropped"] = c.dropped;
        x["lost"] = c.lost;
        x["valid_bytes"] = c.bytes;
        delivered[nb::int_(device)] = x;
      }
      d["delivered"] = delivered;
    }
    return d;
  }

  const std::string& transport() const { return transport_; }
  const std::string& transport_reason() const { return transport_reason_; }
  const SenderOptions& options() const { return options_; }

 private:
  SenderOptions options_;
  std::string transport_;  // what the receiver chose
  std::string transport_reason_;
};

}  // namespace

void bind_sender(nb::module_& m) {
  nb::class_<PySender> cls(m, "Sender",
                           "A connection to a slotstream receiver that carries the messages of several devices.\n\n"
                           "Use it as a context manager: leaving the block normally waits until the receiver has\n"
                           "stored every message (finish()); leaving it by an exception abandons the connection.");
  cls.def(nb::init<const std::string&, std::optional<std::string>, const std::string&, std::optional<std::string>,
                   int64_t, int64_t, const std::vector<int>&, std::optional<std::string>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<int64_t>, std::optional<int64_t>, std::optional<int64_t>,
                   std::optional<std::string>, double>(),
          "to"_a, "name"_a = nb::none(), "transport"_a = "auto", "protocol"_a = nb::none(), "blocks"_a = kDefaultBlocks,
          "block_size"_a = kDefaultBlockSize, nb::kw_only(), "devices"_a.sig("(0,)") = std::vector<int>{0},
          "token"_a = nb::none(), "rdma_transport"_a = nb::none(), "rdma_device"_a = nb::none(),
          "segment_size"_a = nb::none(), "max_message"_a = nb::none(), "ttl"_a = nb::none(), "interface"_a = nb::none(),
          "stall_timeout"_a = kDefaultStallTimeout.count() / 1000.0,
          "Connects to the receiver at `to` (\"HOST:PORT\") as sender `name` (default: the host name)\n"
          "and declares `devices`, the device numbers send() will use. `transport`: 'auto' (shm on one\n"
          "host, else rdma where both ends have an RDMA NIC, else tcp), 'shm', 'tcp' or 'rdma'\n"
          "(`rdma_transport` 'rc', 'dc' or 'ud', default the receiver's; `rdma_device` 'mlx5_0:1'), or\n"
          "'udp': the datagram transport (`protocol` write_record (default), dgram_send, dgram_rd or\n"
          "rd_write_record; `blocks` message slots per device; `segment_size` bytes per datagram,\n"
          "`max_message` the largest message (default 1 MiB), `ttl` and `interface` for a multicast group).\n"
          "`stall_timeout`: seconds to wait on a receiver that says nothing (a live one says it is alive\n"
          "every second, also while it holds its blocks): then it counts as stopped or hung and send()\n"
          "and finish() raise PeerGone; at least 2, 0 waits for ever (not the datagram transport's).\n"
          "`protocol` None: the transport's default. Raises slotstream.Error subclasses (ConnectFailed,\n"
          "Refused, InvalidArgument — e.g. rdma without a usable device —, ...) with the library's message.")
      .def("send", &PySender::send, "device"_a, "data"_a, nb::kw_only(), "timeout"_a = nb::none(),
           nb::sig("def send(self, device: int, data: typing_extensions.Buffer | numpy.typing.NDArray[typing.Any], *, "
                   "timeout: float | None = None) -> None"),
           "Sends one message: any C-contiguous buffer (bytes, bytearray, memoryview, numpy array)\n"
           "is read in place and copied once, into the library's send block. Waits (GIL released) while\n"
           "every block is in flight, returning to Python every 0.1 s so that Ctrl-C raises\n"
           "KeyboardInterrupt; after `timeout` seconds raises slotstream.Timeout. An interrupted message\n"
           "was not sent (the receiver discards any part of it). Thread-safe.")
      .def("finish", &PySender::finish, nb::kw_only(), "timeout"_a = nb::none(),
           "Waits until the receiver has stored every message, then closes the connection. Ctrl-C\n"
           "(KeyboardInterrupt, within 0.2 s) or `timeout` seconds (slotstream.Timeout) abandon the\n"
           "connection instead: the receiver keeps the complete messages and reports the sender lost.")
      .def("close", &PySender::close, "Abandons the connection without waiting (unfinished messages are lost).")
      .def("stats", &PySender::stats, nb::sig("def stats(self) -> dict[str, typing.Any]"),
           "Counters: messages, bytes, per_device, held_skips (receiver blocks skipped because held),\n"
           "connections (filled in by finish()); over udp, after finish(), delivered: what the receiver\n"
           "made of each device's messages (complete, partial, dropped, lost, valid_bytes).")
      .def_prop_ro("transport", &PySender::transport, "'shm', 'tcp', 'rdma' or 'udp': what carries it.")
      .def_prop_ro("transport_reason", &PySender::transport_reason,
                   "Why the receiver chose it (and what failed on this side before it).")
      .def_prop_ro("name", [](const PySender& s) { return s.options().name; })
      .def_prop_ro("protocol", [](const PySender& s) { return s.options().protocol; })
      .def_prop_ro("blocks", [](const PySender& s) { return s.options().blocks; })
      .def_prop_ro("block_size", [](const PySender& s) { return s.options().block_size; })
      .def_prop_ro(
          "devices",
          [](const PySender& s) { return std::vector<int>(s.options().devices.begin(), s.options().devices.end()); })
      .def_prop_ro("closed", [](const PySender& s) { return s.is_closed(); });
  // Leaving the block normally waits for the receiver; leaving it by an exception abandons.
  def_context_manager<PySender, &PySender::finish_no_timeout, &PySender::close>(cls, "def __enter__(self) -> Sender");
}

}  // namespace slotstream::py
