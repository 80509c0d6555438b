// Sends a few messages on two devices to a running `slotstream recv`, using only what an
// installed slotstream provides (the public header and the library).
//
//   consumer HOST PORT NAME TRANSPORT     message i of device d: "consumer <d> <i> " + (i * 1000) x 'a'+d
#include <cstdio>
#include <string>

#include <slotstream/slotstream.h>

int main(int argc, char** argv) {
  if (argc != 5) return std::fprintf(stderr, "usage: consumer HOST PORT NAME shm|tcp\n"), 2;
  slotstream::SenderOptions options;
  options.host = argv[1];
  options.port = static_cast<uint16_t>(std::stoi(argv[2]));
  options.name = argv[3];
  options.transport = slotstream::parse_transport(argv[4]).value_or(slotstream::Transport::kAuto);
  options.blocks = 8;
  options.block_size = 4096;  // the larger messages are fragmented
  options.devices = {0, 1};
  std::unique_ptr<slotstream::Sender> sender;
  if (auto st = slotstream::Sender::connect(options, &sender); !st.is_ok()) {
    return std::fprintf(stderr, "consumer: %s\n", st.to_string().c_str()), 1;
  }
  for (int i = 0; i < 10; ++i) {
    for (uint16_t d : options.devices) {
      std::string message = "consumer " + std::to_string(d) + " " + std::to_string(i) + " " +
                            std::string(size_t(i) * 1000, char('a' + d));
      if (auto st = sender->device(d)->send(std::as_bytes(std::span(message))); !st.is_ok()) {
        return std::fprintf(stderr, "consumer: %s\n", st.to_string().c_str()), 1;
      }
    }
  }
  if (auto st = sender->finish(); !st.is_ok()) return std::fprintf(stderr, "consumer: %s\n", st.to_string().c_str()), 1;
  std::printf("consumer: sent %llu messages over %s\n", (unsigned long long)sender->stats().messages,
              slotstream::transport_name(sender->transport()));
  return 0;
}
