// The preload shim's configuration (the SLOTSTREAM_UDP_* environment, udp_shim.cc lists it), read once at
// load so that a malformed setting stops the program at start; its counters, and their report at exit
// (SLOTSTREAM_UDP_LOG).
#include <fcntl.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "engine/dgram/shim/internal.h"

namespace slotstream::dgram::shim {

Counters g_counters;
ReassemblyCounters g_reassembly;

namespace {

[[noreturn]] void die(const std::string& why) {
  std::fprintf(stderr, "slotstream_udp: %s; stopping (fix the environment or unset it)\n", why.c_str());
  std::fflush(stderr);
  _exit(2);
}

// SLOTSTREAM_UDP_KEY_FILE's contents without trailing whitespace (what net::read_token_file reads).
void load_key(const char* path, Config* c) {
  FILE* f = std::fopen(path, "rb");
  if (!f) die(std::string("cannot read SLOTSTREAM_UDP_KEY_FILE '") + path + "': " + std::strerror(errno));
  std::string token;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) token.append(buf, n);
  std::fclose(f);
  while (!token.empty() && std::isspace(static_cast<unsigned char>(token.back()))) token.pop_back();
  if (token.empty()) die(std::string("SLOTSTREAM_UDP_KEY_FILE '") + path + "' is empty");
  c->keyed = true;
  c->key = shim_key(token);
}

// A whole number lo..hi from the environment, or `fallback` when unset.
long env_number(const char* name, long lo, long hi, long fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (errno || *end || n < lo || n > hi) {
    die(std::string(name) + " expects a whole number " + std::to_string(lo) + ".." + std::to_string(hi) + ", got '" +
        v + "'");
  }
  return n;
}

// One of two words from the environment: true for `yes`, false for `no` (and when unset).
bool env_choice(const char* name, const char* yes, const char* no) {
  const char* v = std::getenv(name);
  if (!v || !*v || std::strcmp(v, no) == 0) return false;
  if (std::strcmp(v, yes) == 0) return true;
  die(std::string(name) + " expects '" + yes + "' or '" + no + "', got '" + v + "'");
}

void load_recombination(Config* c) {
  c->mtu = size_t(env_number("SLOTSTREAM_UDP_MTU", 576, 65535, 1500));
  c->reassembly.timeout_ns = env_number("SLOTSTREAM_UDP_REASSEMBLY_MS", 1, 600000, 200) * 1'000'000;
  c->reassembly.deliver_partial = env_choice("SLOTSTREAM_UDP_PARTIAL", "deliver", "drop");
  c->plain_accept = env_choice("SLOTSTREAM_UDP_PLAIN", "accept", "drop");
  c->gso = !env_choice("SLOTSTREAM_UDP_GSO", "off", "on");
}

}  // namespace

Config load_config() {
  Config c;
  std::string err;
  if (const char* k = std::getenv("SLOTSTREAM_UDP_KEY_FILE"); k && *k) load_key(k, &c);
  if (const char* p = std::getenv("SLOTSTREAM_UDP_PORTS")) {
    if (!PortSet::parse(p, &c.ports, &err)) die(err);
  }
  struct {
    const char* name;
    double* out;
  } rates[] = {{"SLOTSTREAM_UDP_INJECT_LOSS", &c.inject.loss},
               {"SLOTSTREAM_UDP_INJECT_CORRUPT", &c.inject.corrupt},
               {"SLOTSTREAM_UDP_INJECT_DUPLICATE", &c.inject.duplicate}};
  for (auto& r : rates) {
    if (const char* v = std::getenv(r.name); v && *v && !parse_percent(v, r.out)) {
      die(std::string(r.name) + " expects a percentage 0..100, got '" + v + "'");
    }
  }
  if (const char* s = std::getenv("SLOTSTREAM_UDP_INJECT_SEED")) c.inject.seed = std::strtoull(s, nullptr, 10);
  if (const char* l = std::getenv("SLOTSTREAM_UDP_LOG")) c.log = l;
  load_recombination(&c);
  return c;
}

// This thread's MAC (an OpenSSL context is for one thread at a time); nullptr without a key.
SegmentMac* mac() {
  if (!config().keyed) return nullptr;
  thread_local SegmentMac m(config().key);
  return &m;
}

namespace {

__attribute__((constructor)) void shim_init() {
  (void)real();
  (void)config();  // malformed settings stop the program now, not at its first datagram
}

__attribute__((destructor)) void shim_report() {
  const Config& c = config();
  if (c.log.empty()) return;
  const Counters& k = g_counters;
  const ReassemblyCounters& r = g_reassembly;
  const std::pair<const char*, uint64_t> fields[] = {
      {"wrapped", k.wrapped},
      {"unwrapped", k.unwrapped},
      {"passed", k.passed},
      {"large", k.large},
      {"segments", k.segments},
      {"segments_in", k.segments_in},
      {"gso_messages", k.gso_messages},
      {"gso_segments", k.gso_segments},
      {"gso_refused", k.gso_refused},
      {"reassembled", r.reassembled},
      {"partial_delivered", r.partial_delivered},
      {"partial_dropped", r.partial_dropped},
      {"late_segments", r.late_segments},
      {"duplicate_segments", r.duplicate_segments},
      {"bad_segments", r.bad_segments},
      {"dropped_crc", k.dropped_crc},
      {"dropped_malformed", k.dropped_malformed},
      {"dropped_auth", k.dropped_auth},
      {"dropped_plain", k.dropped_plain},
      {"plain_accepted", k.plain_accepted},
      {"emsgsize", k.emsgsize},
      {"injected_loss", k.injected_loss},
      {"injected_corrupt", k.injected_corrupt},
      {"injected_duplicate", k.injected_duplicate},
  };
  // Programs that never touched a UDP socket (shells, helpers a program starts) say nothing.
  uint64_t any = 0;
  for (const auto& [_, v] : fields) any += v;
  if (any == 0) return;
  std::string line = "slotstream_udp pid=" + std::to_string(getpid());
  for (const auto& [name, v] : fields) line += std::string(" ") + name + "=" + std::to_string(v);
  line += "\n";
  int fd = c.log == "1" ? STDERR_FILENO : ::open(c.log.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  if (real().write(fd, line.data(), line.size()) < 0) { /* nowhere left to say it */
  }
  if (fd != STDERR_FILENO) ::close(fd);
}

}  // namespace

}  // namespace slotstream::dgram::shim
