#include "engine/dgram/llp/injector.h"

#include <cstdlib>

namespace slotstream::dgram {

Injector::Verdict Injector::next(size_t bytes) {
  Verdict v;
  ++stats_.datagrams;
  if (chance(o_.loss)) {
    v.drop = true;
    ++stats_.dropped;
    return v;
  }
  if (bytes > 0 && chance(o_.corrupt)) {
    v.flip_bit = int64_t(std::uniform_int_distribution<uint64_t>(0, bytes * 8 - 1)(rng_));
    ++stats_.corrupted;
  }
  if (chance(o_.duplicate)) {
    v.duplicate = true;
    ++stats_.duplicated;
  }
  if (chance(o_.reorder)) {
    v.reorder = true;
    ++stats_.reordered;
  }
  return v;
}

void Injector::corrupt(std::span<std::byte> d, const Verdict& v) {
  if (v.flip_bit < 0 || size_t(v.flip_bit / 8) >= d.size()) return;
  d[size_t(v.flip_bit / 8)] ^= std::byte(1u << (v.flip_bit % 8));
}

bool parse_percent(const std::string& text, double* fraction) {
  std::string t = text;
  if (!t.empty() && t.back() == '%') t.pop_back();
  if (t.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size() || !(v >= 0 && v <= 100)) return false;
  *fraction = v / 100;
  return true;
}

}  // namespace slotstream::dgram
