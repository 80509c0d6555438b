// The smallest complete slotstream program: a receiver and a sender in one process, three
// devices, messages checked on arrival. Uses only the public API (include/slotstream).
//
//   build/examples/hello_stream [shm|tcp]
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "slotstream/slotstream.h"

using namespace slotstream;

// A sink that keeps every message in memory, per device, in order.
class MemorySink : public MessageSink {
 public:
  explicit MemorySink(std::map<uint16_t, std::vector<std::string>>& out) : out_(out) {}
  Status begin(uint16_t device) override {
    current_[device].clear();
    return Status::ok();
  }
  Status append(uint16_t device, std::span<const std::byte> d) override {
    current_[device].append(reinterpret_cast<const char*>(d.data()), d.size());
    return Status::ok();
  }
  Status commit(uint16_t device) override {
    out_[device].push_back(current_[device]);
    return Status::ok();
  }
  void abort(uint16_t device) override { current_[device].clear(); }

 private:
  std::map<uint16_t, std::vector<std::string>>& out_;
  std::map<uint16_t, std::string> current_;  // message being assembled, per device
};

int main(int argc, char** argv) {
  const auto parsed = argc > 1 ? parse_transport(argv[1]) : std::optional<Transport>(Transport::kShm);
  if (!parsed) return std::fprintf(stderr, "usage: hello_stream [shm|tcp|rdma] (default shm)\n"), 2;
  const Transport transport = *parsed;
  std::map<uint16_t, std::vector<std::string>> received;

  ReceiverOptions ro;
  ro.host = "127.0.0.1";
  ro.transport = transport;
  ro.make_sink = [&](const SenderInfo&, std::unique_ptr<MessageSink>* sink) {
    *sink = std::make_unique<MemorySink>(received);
    return Status::ok();
  };
  std::unique_ptr<Receiver> rx;
  if (Status st = Receiver::start(ro, &rx); !st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;

  SenderOptions so;
  so.host = "127.0.0.1";
  so.port = uint16_t(std::stoi(rx->listen_address().substr(rx->listen_address().rfind(':') + 1)));
  so.name = "hello";
  so.transport = transport;
  so.blocks = 4;
  so.block_size = 4096;  // messages below are larger: they are fragmented and reassembled
  so.devices = {0, 1, 2};
  std::unique_ptr<Sender> tx;
  if (Status st = Sender::connect(so, &tx); !st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;

  const int kMessages = 20;
  for (int i = 0; i < kMessages; ++i) {
    for (uint16_t d : so.devices) {
      std::string msg =
          "device " + std::to_string(d) + " message " + std::to_string(i) + " " + std::string(i * 700, 'x');
      if (Status st = tx->device(d)->send(std::as_bytes(std::span(msg))); !st.is_ok()) return 1;
    }
  }
  if (Status st = tx->finish(); !st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  rx->wait_sessions(1);
  rx->stop();

  for (uint16_t d : so.devices) {
    if (received[d].size() != kMessages)
      return std::fprintf(stderr, "device %u: %zu messages\n", d, received[d].size()), 1;
    for (int i = 0; i < kMessages; ++i) {
      std::string want =
          "device " + std::to_string(d) + " message " + std::to_string(i) + " " + std::string(i * 700, 'x');
      if (received[d][i] != want)
        return std::fprintf(stderr, "device %u message %d differs (%zu vs %zu bytes)\n", d, i, received[d][i].size(),
                            want.size()),
               1;
    }
  }
  std::printf("hello_stream: %d messages x %zu devices over %s arrived complete and in order\n", kMessages,
              so.devices.size(), transport_name(tx->transport()));
  return 0;
}
