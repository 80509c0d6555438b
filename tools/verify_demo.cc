// `slotstream verify` (check received synthetic frames) and `slotstream demo` (receiver + 12
// cameras + verify, as two real processes over UCX).
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "synthetic.h"

namespace slotstream::tools {
namespace fs = std::filesystem;

namespace {

struct VerifyResult {
  uint64_t frames = 0;
  uint64_t devices = 0;
  std::vector<std::string> problems;
};

bool read_file(const fs::path& p, std::vector<std::byte>* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  out->resize(size_t(in.tellg()));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(out->data()), std::streamsize(out->size()));
  return bool(in);
}

// Checks synthetic frames directory by directory and remembers where each device's frame
// sequence stands, so that the demo can run it repeatedly while frames arrive.
class Verifier {
 public:
  // Checks every complete frame file under `root`; with `consume`, deletes each file once
  // checked (the demo's stand-in for a processing worker, which also keeps the page cache from
  // filling with frames the disk must then absorb). `final`: temporary files left are problems.
  void scan(const fs::path& root, bool consume, bool final) {
    std::error_code ec;
    std::vector<fs::path> device_dirs;
    if (root.filename().string().starts_with("device-")) device_dirs.push_back(root);
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (it->is_directory() && it->path().filename().string().starts_with("device-"))
        device_dirs.push_back(it->path());
    }
    if (ec) r_.problems.push_back("cannot list " + root.string() + ": " + ec.message());
    for (const auto& dir : device_dirs) check_dir(dir, consume, final);
    r_.devices = prev_.size();
  }
  const VerifyResult& result() const { return r_; }

 private:
  void check_dir(const fs::path& dir, bool consume, bool final) {
    uint32_t device = uint32_t(std::stoul(dir.filename().string().substr(7)));
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      std::string name = e.path().filename().string();
      if (!name.starts_with("."))
        files.push_back(e.path());
      else if (final)
        r_.problems.push_back(e.path().string() + ": leftover temporary file");
    }
    std::sort(files.begin(), files.end());
    int64_t& prev = prev_.try_emplace(dir, -1).first->second;
    for (const auto& f : files) {
      if (!read_file(f, &data_)) {
        r_.problems.push_back(f.string() + ": cannot read");
        continue;
      }
      std::string why;
      auto id = check_synthetic(data_, &why);
      if (!id) {
        r_.problems.push_back(f.string() + ": " + why);
      } else if (id->device != device) {
        r_.problems.push_back(f.string() + ": frame of device " + std::to_string(id->device) + " in device-" +
                              std::to_string(device));
      } else if (prev >= 0 && id->frame != uint64_t(prev) + 1 && id->frame != 0) {
        r_.problems.push_back(f.string() + ": frame " + std::to_string(id->frame) + " follows frame " +
                              std::to_string(prev));
      } else {
        ++r_.frames;
      }
      if (id) prev = id->frame;
      if (consume) fs::remove(f, ec);
    }
  }

  std::map<fs::path, int64_t> prev_;  // device directory -> last frame number seen
  VerifyResult r_;
  std::vector<std::byte> data_;
};

VerifyResult verify_tree(const fs::path& root) {
  Verifier v;
  v.scan(root, /*consume=*/false, /*final=*/true);
  return v.result();
}

// Runs a child process; its stdout is returned as a pipe fd (if capture), stderr inherited.
pid_t spawn(const std::vector<std::string>& argv, int* stdout_fd) {
  int fds[2] = {-1, -1};
  if (stdout_fd && pipe2(fds, O_CLOEXEC) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (stdout_fd) dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  if (stdout_fd) {
    close(fds[1]);
    *stdout_fd = fds[0];
  }
  return pid;
}

// Reads one line from fd with a timeout (ms). Empty on timeout/EOF.
std::string read_line(int fd, int timeout_ms) {
  std::string line;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  char c;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    if (read(fd, &c, 1) != 1) break;
    if (c == '\n') return line;
    line += c;
  }
  return line;
}

std::string read_all(int fd) {
  std::string s;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) s.append(buf, size_t(n));
  return s;
}

double cpu_of(const rusage& ru) {
  return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace

int run_verify(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    print_error("verify", "'" + dir + "' is not a directory");
    return kExitUsage;
  }
  VerifyResult r = verify_tree(dir);
  for (const auto& p : r.problems) std::fprintf(stderr, "slotstream verify: %s\n", p.c_str());
  if (r.frames == 0 && r.problems.empty()) {  // an exit 1 with "verified 0 frames" alone says nothing
    print_error("verify",
                "no received frames under '" + dir + "': give the receiver's --out (it holds SENDER/device-D/SEQ.bin)");
  }
  std::printf("verified %llu frames in %llu devices%s\n", (unsigned long long)r.frames, (unsigned long long)r.devices,
              r.problems.empty() ? "" : (", " + std::to_string(r.problems.size()) + " problems").c_str());
  return r.problems.empty() && r.frames > 0 ? kExitOk : kExitError;
}

namespace {

// The demo's output directory: --out, or a fresh temporary one (removed at the end).
bool demo_directory(const DemoArgs& a, fs::path* out, bool* temp) {
  *out = a.out;
  *temp = out->empty();
  if (!*temp) return true;
  char tmpl[] = "/tmp/slotstream-demo-XXXXXX";
  if (!mkdtemp(tmpl)) {
    print_error("demo", std::string("cannot create a temporary directory: ") + strerror(errno));
    return false;
  }
  *out = tmpl;
  return true;
}

// Starts `slotstream recv` for one sender; its address, or "" (reported) when it did not start.
std::string start_receiver(const DemoArgs& a, const std::string& self, const fs::path& out, pid_t* rx, int* rx_out) {
  *rx = spawn({self, "recv", "--listen", "127.0.0.1:0", "--out", out.string(), "--transport", a.transport,
               "--exit-after-senders", "1"},
              rx_out);
  std::string line = read_line(*rx_out, 15000);
  const std::string prefix = "listening on ";
  if (*rx < 0 || !line.starts_with(prefix)) {
    print_error("demo", "the receiver did not start (got '" + line + "')");
    if (*rx > 0) kill(*rx, SIGKILL), waitpid(*rx, nullptr, 0);
    return "";
  }
  return line.substr(prefix.size());
}

// Runs the synthetic cameras to the end, verifying (and, unless --keep, removing) frames while they
// arrive, like a processing worker, with progress every 2 s. Returns the sender's JSON report.
std::string run_cameras(const DemoArgs& a, const std::string& self, const std::string& addr, const fs::path& out,
                        Verifier* verifier, int* tx_status, rusage* tx_ru) {
  int tx_out = -1;
  std::string cams = "0-" + std::to_string(a.cameras - 1) + ":25:640x480x3";
  char dur[32];
  std::snprintf(dur, sizeof dur, "%g", a.seconds);
  pid_t tx = spawn({self, "send", "--to", addr, "--name", "demo", "--transport", a.transport, "--synthetic", cams,
                    "--duration", dur, "--json"},
                   &tx_out);
  std::string tx_json;
  std::thread reader([&] { tx_json = read_all(tx_out); });
  const auto t0 = std::chrono::steady_clock::now();
  for (int last = -1;;) {
    if (wait4(tx, tx_status, WNOHANG, tx_ru) == tx) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (!a.keep) verifier->scan(out, /*consume=*/true, /*final=*/false);
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (int(t) != last && int(t) % 2 == 0) {
      last = int(t);
      std::printf("  streaming... %2d s\n", last);
      std::fflush(stdout);
    }
  }
  reader.join();
  return tx_json;
}

// Gives the receiver a moment to exit on its own, then stops it.
void end_receiver(pid_t rx, int* rx_status, rusage* rx_ru) {
  if (wait4(rx, rx_status, WNOHANG, rx_ru) != 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (wait4(rx, rx_status, WNOHANG, rx_ru) == 0) {
    kill(rx, SIGTERM);
    wait4(rx, rx_status, 0, rx_ru);
  }
}

// Prints what was sent and what was verified; whether every frame arrived intact.
bool report_demo(const std::string& tx_json, const std::string& rx_summary, const VerifyResult& v, double tx_cpu,
                 double rx_cpu) {
  nlohmann::json j = nlohmann::json::parse(tx_json, nullptr, false);
  uint64_t sent = j.is_object() ? j.value("messages", 0ull) : 0;
  std::printf("\nreceiver: %s\n", rx_summary.c_str());
  if (j.is_object()) {
    std::printf(
        "sent:     %llu frames, %.1f MB in %.2f s = %.1f MB/s over %s (sender CPU %.2f s, receiver CPU %.2f s)\n",
        (unsigned long long)sent, j.value("bytes", 0ull) / 1e6, j.value("seconds", 0.0), j.value("mb_per_s", 0.0),
        j.value("transport", "?").c_str(), tx_cpu, rx_cpu);
  }
  std::printf("verified: %llu of %llu frames intact and in order in %llu device directories\n",
              (unsigned long long)v.frames, (unsigned long long)sent, (unsigned long long)v.devices);
  for (size_t i = 0; i < v.problems.size() && i < 10; ++i) std::printf("  problem: %s\n", v.problems[i].c_str());
  return v.problems.empty() && v.frames == sent && sent > 0;
}

}  // namespace

int run_demo(const DemoArgs& a, const std::string& self) {
  if (a.cameras < 1 || a.cameras > 1024 || a.seconds <= 0) {
    print_error("demo", "--cameras must be 1..1024 and --seconds > 0");
    return kExitUsage;
  }
  fs::path out;
  bool temp = false;
  if (!demo_directory(a, &out, &temp)) return kExitError;
  std::printf("slotstream demo: %u cameras x 640x480x3 @ 25 fps for %.0f s over %s, into %s\n", a.cameras, a.seconds,
              a.transport.c_str(), out.c_str());
  std::fflush(stdout);
  pid_t rx = -1;
  int rx_out = -1;
  const std::string addr = start_receiver(a, self, out, &rx, &rx_out);
  if (addr.empty()) return kExitError;
  Verifier verifier;
  rusage tx_ru{}, rx_ru{};
  int tx_status = 0, rx_status = 0;
  const std::string tx_json = run_cameras(a, self, addr, out, &verifier, &tx_status, &tx_ru);
  const std::string rx_summary = read_line(rx_out, 10000);
  end_receiver(rx, &rx_status, &rx_ru);
  verifier.scan(out, /*consume=*/!a.keep, /*final=*/true);
  bool ok = WIFEXITED(tx_status) && WEXITSTATUS(tx_status) == 0;
  ok = report_demo(tx_json, rx_summary, verifier.result(), cpu_of(tx_ru), cpu_of(rx_ru)) && ok;
  std::printf("%s\n", ok ? "demo OK: zero loss" : "demo FAILED");
  if (temp && !a.keep)
    fs::remove_all(out);
  else
    std::printf("frames kept in %s\n", out.c_str());
  return ok ? kExitOk : kExitError;
}

}  // namespace slotstream::tools
