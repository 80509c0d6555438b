// A seeded fault injector for datagrams, on either end of the stack (`--inject-loss P` and the
// reorder/duplicate/corrupt knobs for tests): the same seed and the same datagram sequence give
// the same faults, so a failing test can be replayed. Real loss for benchmarks comes from
// nftables in a network namespace instead (docs/benchmarks.md); this one needs no privileges.
//
// Probabilities are fractions in [0, 1] (the CLI takes percent). Each datagram is, independently:
// dropped (loss), else possibly corrupted (one random bit flipped anywhere — the CRC32C must
// catch it), duplicated (delivered twice), or reordered (held back and delivered after the next
// datagram). Threading: one thread per object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <span>
#include <string>

namespace slotstream::dgram {

struct InjectOptions {
  double loss = 0;
  double reorder = 0;
  double duplicate = 0;
  double corrupt = 0;
  uint64_t seed = 1;
  bool any() const { return loss > 0 || reorder > 0 || duplicate > 0 || corrupt > 0; }
};

class Injector {
 public:
  explicit Injector(const InjectOptions& o) : o_(o), rng_(o.seed) {}

  struct Verdict {
    bool drop = false;
    bool duplicate = false;
    bool reorder = false;
    int64_t flip_bit = -1;  // bit index into the datagram to invert, or -1
  };
  Verdict next(size_t datagram_bytes);
  // Applies a verdict's corruption in place.
  static void corrupt(std::span<std::byte> datagram, const Verdict& v);

  struct Stats {
    uint64_t datagrams = 0;
    uint64_t dropped = 0;
    uint64_t reordered = 0;
    uint64_t duplicated = 0;
    uint64_t corrupted = 0;
  };
  const Stats& stats() const { return stats_; }
  const InjectOptions& options() const { return o_; }

 private:
  bool chance(double p) { return p > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  InjectOptions o_;
  std::mt19937_64 rng_;
  Stats stats_;
};

// Parses a percentage "0".."100" (an optional trailing '%') into a fraction; false if invalid.
bool parse_percent(const std::string& text, double* fraction);

}  // namespace slotstream::dgram
