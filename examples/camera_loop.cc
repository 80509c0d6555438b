// The C++ twin of examples/python/camera_sender.py, for measuring what Python costs
// (docs/benchmarks.md): one thread sends every camera's frame in turn, each frame a buffer in
// memory (what a capture API hands over) copied once into a send block by DeviceStream::send().
//
//   camera_loop HOST:PORT TRANSPORT CAMERAS FPS SECONDS      FPS 0: as fast as the receiver takes them
//
// Prints one JSON line like the Python example: frames, seconds, frames_per_s, mb_per_s, cpu_seconds.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "slotstream/slotstream.h"

using namespace slotstream;
using Clock = std::chrono::steady_clock;

static double cpu_seconds() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

int main(int argc, char** argv) {
  if (argc != 6) return std::fprintf(stderr, "usage: camera_loop HOST:PORT shm|tcp|auto CAMERAS FPS SECONDS\n"), 2;
  std::string to = argv[1];
  SenderOptions o;
  o.host = to.substr(0, to.rfind(':'));
  o.port = uint16_t(std::stoi(to.substr(to.rfind(':') + 1)));
  o.name = "camera-loop";
  o.transport = parse_transport(argv[2]).value_or(Transport::kAuto);
  const int cameras = std::stoi(argv[3]);
  const double fps = std::stod(argv[4]), seconds = std::stod(argv[5]);
  for (int d = 0; d < cameras; ++d) o.devices.push_back(uint16_t(d));

  const size_t frame_bytes = 640 * 480 * 3;
  std::vector<std::vector<std::byte>> frames(cameras, std::vector<std::byte>(frame_bytes));
  std::mt19937_64 rng(7);
  for (auto& f : frames) {
    for (auto& b : f) b = std::byte(rng());
  }

  std::unique_ptr<Sender> tx;
  if (Status st = Sender::connect(o, &tx); !st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  uint64_t sent = 0;
  const double cpu0 = cpu_seconds();
  const auto t0 = Clock::now();
  for (uint64_t k = 0; std::chrono::duration<double>(Clock::now() - t0).count() < seconds; ++k) {
    if (fps > 0)
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(k / fps)));
    for (int d = 0; d < cameras; ++d) {
      std::memcpy(frames[d].data(), &k, sizeof k);  // the frame number, as the Python example stamps it
      if (Status st = tx->device(uint16_t(d))->send(frames[d]); !st.is_ok()) {
        return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
      }
      ++sent;
    }
  }
  if (Status st = tx->finish(); !st.is_ok()) return std::fprintf(stderr, "%s\n", st.to_string().c_str()), 1;
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf(
      "{\"frames\": %llu, \"cameras\": %d, \"seconds\": %.3f, \"frames_per_s\": %.1f, \"mb_per_s\": %.1f, "
      "\"cpu_seconds\": %.3f, \"transport\": \"%s\"}\n",
      (unsigned long long)sent, cameras, secs, sent / secs, sent * frame_bytes / secs / 1e6, cpu_seconds() - cpu0,
      transport_name(tx->transport()));
  return 0;
}
