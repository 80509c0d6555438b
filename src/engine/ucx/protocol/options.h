// Protocol options: what follows the protocol's name in `--protocol NAME:key=value,key=value`
// (e.g. `carc:budget=2M`). The sender checks them against the protocol before connecting, sends
// the text in HELLO, and both ends build their half of the protocol from the same options.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>

#include "slotstream/status.h"

namespace slotstream::protocol {

class Options {
 public:
  // "key=value,key=value" (empty text: no options). Keys are [a-z0-9_]; a key given twice, an
  // empty key or a missing '=' is an error.
  static Status parse(std::string_view text, Options* out);
  // Splits "NAME[:OPTIONS]" into the protocol's name and its options.
  static Status parse_spec(std::string_view spec, std::string* name, Options* out);

  // Canonical text (keys sorted), as sent in HELLO.
  std::string text() const;
  bool empty() const { return values_.empty(); }
  bool has(std::string_view key) const { return values_.contains(std::string(key)); }
  // A copy without `key` (the stream layer's own options, split from the protocol's).
  Options without(std::string_view key) const {
    Options o = *this;
    o.values_.erase(std::string(key));
    return o;
  }

  // Typed reads; an absent key yields `fallback`, a malformed value an error naming the key.
  Status size(std::string_view key, uint64_t fallback, uint64_t* out) const;  // "2M", "65536"
  Status number(std::string_view key, uint64_t fallback, uint64_t* out) const;
  Status flag(std::string_view key, bool fallback, bool* out) const;  // 0/1, true/false, on/off
  // One of `allowed` (e.g. flush=call|idle); the error lists them.
  Status choice(std::string_view key, std::initializer_list<std::string_view> allowed, std::string_view fallback,
                std::string* out) const;
  // Every key must be one of `known`; the error lists the ones the protocol takes.
  Status check_known(std::string_view protocol, std::initializer_list<std::string_view> known) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace slotstream::protocol
