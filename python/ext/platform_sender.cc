// Python's PlatformSender (include/slotstream/platform.h): a sender whose receiver the platform chooses, and its
// Python class.
#include "sender.h"
#include "slotstream/platform.h"

namespace slotstream::py {

namespace {

// A sender whose receiver the platform chooses (include/slotstream/platform.h): the same
// send/finish/close contract as PySender.
class PyPlatformSender : public SenderLife<PlatformSender> {
 public:
  PyPlatformSender(const std::string& platform, std::optional<std::string> name, const std::vector<int>& devices,
                   double need_cpu, double need_bandwidth, double need_fps, const std::string& transport,
                   std::optional<std::string> protocol, int64_t blocks, int64_t block_size,
                   std::optional<std::string> token, int64_t lease_ttl, double patience, double stall_timeout,
                   std::optional<std::string> platform_cacert, std::optional<std::string> platform_cert,
                   std::optional<std::string> platform_key, std::optional<std::string> platform_user,
                   std::optional<std::string> platform_password, std::optional<std::string> rdma_transport,
                   std::optional<std::string> rdma_device)
      : SenderLife("PlatformSender") {
    PlatformSenderOptions o;
    o.platform = platform;
    o.security = {platform_cacert.value_or(""), platform_cert.value_or(""), platform_key.value_or(""),
                  platform_user.value_or(""), platform_password.value_or("")};
    SenderArgs args{std::move(name), transport,        std::move(protocol),       blocks,
                    block_size,      std::move(token), std::move(rdma_transport), std::move(rdma_device)};
    args.stall_timeout = stall_timeout;
    o.sender = args.options(devices, &device_locks_);
    if (o.sender.protocol.empty()) o.sender.protocol = kDefaultProtocol;  // the platform serves UCX transports
    o.need = {need_cpu, need_bandwidth, need_fps};
    o.lease_ttl_seconds = lease_ttl;
    o.patience = std::chrono::milliseconds(int64_t(patience * 1000));
    Status st;
    {
      nb::gil_scoped_release nogil;  // scheduling and the handshake may take seconds
      st = PlatformSender::connect(std::move(o), &sender_);
    }
    check(st);
  }

  // A step that gives up has not taken the message (PlatformSender::send with a deadline): the next
  // step sends it afresh.
  void send(int device, nb::handle data, std::optional<double> timeout) {
    send_with(device, data, timeout,
              [device](PlatformSender& s, std::span<const std::byte> bytes, Clock::time_point deadline,
                       DeviceStream::Progress*) { return s.send(uint16_t(device), bytes, deadline); });
  }
  void finish(std::optional<double> timeout) { SenderLife::finish(timeout); }
  void finish_no_timeout() { SenderLife::finish(); }
  void close() { SenderLife::close(); }

  nb::dict stats() const {
    auto s = stats_snapshot();
    nb::dict d;
    if (!s) return d;
    d["messages"] = s->messages;
    d["resent"] = s->resent;
    d["reschedules"] = s->reschedules;
    d["connections"] = s->connections;
    d["receiver"] = s->receiver;
    d["schedule_ms"] = s->schedule_ms;
    return d;
  }
};

}  // namespace

void bind_platform_sender(nb::module_& m) {
  nb::class_<PyPlatformSender> cls(
      m, "PlatformSender",
      "A sender whose receiver the cloud-edge platform (etcd) chooses and reserves for the resources it\n"
      "needs; when that receiver dies it gets another and sends again what was not confirmed stored\n"
      "(docs/platform.md). The same send/finish/close contract and context manager as Sender.");
  cls.def(nb::init<const std::string&, std::optional<std::string>, const std::vector<int>&, double, double, double,
                   const std::string&, std::optional<std::string>, int64_t, int64_t, std::optional<std::string>,
                   int64_t, double, double, std::optional<std::string>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<std::string>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<std::string>>(),
          "platform"_a, "name"_a = nb::none(), nb::kw_only(), "devices"_a.sig("(0,)") = std::vector<int>{0},
          "need_cpu"_a = 0.0, "need_bandwidth"_a = 0.0, "need_fps"_a = 0.0, "transport"_a = "auto",
          "protocol"_a = nb::none(), "blocks"_a = kDefaultBlocks, "block_size"_a = kDefaultBlockSize,
          "token"_a = nb::none(), "lease_ttl"_a = 5, "patience"_a = 30.0,
          "stall_timeout"_a = kDefaultStallTimeout.count() / 1000.0, "platform_cacert"_a = nb::none(),
          "platform_cert"_a = nb::none(), "platform_key"_a = nb::none(), "platform_user"_a = nb::none(),
          "platform_password"_a = nb::none(), "rdma_transport"_a = nb::none(), "rdma_device"_a = nb::none(),
          "Asks the platform at `platform` (\"etcd://HOST:PORT[,HOST:PORT...]\") for a receiver with room for\n"
          "need_cpu cores, need_bandwidth bytes/s and need_fps messages/s (and the blocks' memory), and\n"
          "connects as sender `name`; `transport`, `protocol` (None: status_byte), `blocks`, `block_size`,\n"
          "`token`, `rdma_transport` and `rdma_device` as Sender's. Raises Refused with every receiver's\n"
          "shortfall when none has room, InvalidArgument for a negative or absurd need. A protected etcd\n"
          "(docs/platform.md): TLS with `platform_cacert` (PEM file of the members' CA;\n"
          "`platform_cert`/`platform_key`: a client certificate), etcd's own users with\n"
          "`platform_user`/`platform_password`. `stall_timeout` as Sender's; a receiver whose platform record\n"
          "went with its lease and that says nothing is left sooner (the next send moves).")
      .def("send", &PyPlatformSender::send, "device"_a, "data"_a, nb::kw_only(), "timeout"_a = nb::none(),
           nb::sig("def send(self, device: int, data: typing_extensions.Buffer | numpy.typing.NDArray[typing.Any], *, "
                   "timeout: float | None = None) -> None"),
           "Sends one message (kept until the receiver confirms it stored). Thread-safe. Waits (GIL released)\n"
           "while the receiver has no room; Ctrl-C (KeyboardInterrupt) or `timeout` seconds\n"
           "(slotstream.Timeout) give up, the message not sent (a message larger than a block whose first\n"
           "part went is sent in full).")
      .def("finish", &PyPlatformSender::finish, nb::kw_only(), "timeout"_a = nb::none(),
           "Waits until every message is stored (moving on if the receiver dies), then releases the reservation.\n"
           "Ctrl-C (KeyboardInterrupt) or `timeout` seconds (slotstream.Timeout) abandon the stream instead:\n"
           "the receiver keeps the complete messages; the reservation goes.")
      .def("close", &PyPlatformSender::close, "Abandons the stream without waiting; the reservation goes.")
      .def("stats", &PyPlatformSender::stats, nb::sig("def stats(self) -> dict[str, typing.Any]"),
           "Counters: messages, resent, reschedules, connections, receiver (the current one), schedule_ms.")
      .def_prop_ro("closed", [](const PyPlatformSender& s) { return s.is_closed(); });
  def_context_manager<PyPlatformSender, &PyPlatformSender::finish_no_timeout, &PyPlatformSender::close>(
      cls, "def __enter__(self) -> PlatformSender");
}

}  // namespace slotstream::py
