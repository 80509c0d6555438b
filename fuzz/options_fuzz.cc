// Protocol options (engine/ucx/protocol/options.h) and byte sizes (parse_size) on arbitrary text: what a
// user types after `--protocol NAME:` and what a peer sends in HELLO. Invariants:
//   - parse either fails with kInvalidArgument and a message, or yields options whose canonical
//     text() parses again to the same text (the receiver rebuilds what the sender meant);
//   - every typed read of every key either succeeds or names the key, never throws;
//   - parse_spec splits at the first ':' and agrees with parse on the rest;
//   - parse_size accepts only digits with an optional K/M/G/T unit and never overflows.
#include <cstdint>
#include <string>
#include <string_view>

#include "check.h"
#include "engine/ucx/protocol/options.h"
#include "slotstream/slotstream.h"

using slotstream::Code;
using slotstream::Status;
using slotstream::protocol::Options;

namespace {

void check_sizes(std::string_view text) {
  auto v = slotstream::parse_size(text);
  if (!v) return;
  FUZZ_CHECK(!text.empty() && text[0] >= '0' && text[0] <= '9');
  // Digits only: the value is the number itself.
  if (text.find_first_not_of("0123456789") == std::string_view::npos)
    FUZZ_CHECK(std::to_string(*v) == text || text[0] == '0');
}

void check_options(const Options& o) {
  Options again;
  FUZZ_CHECK(Options::parse(o.text(), &again).is_ok());
  FUZZ_CHECK(again.text() == o.text());
  FUZZ_CHECK(o.empty() == o.text().empty());
  // Every key, read every typed way.
  const std::string text = o.text();
  std::string_view rest = text;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view item = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    std::string_view key = item.substr(0, item.find('='));
    FUZZ_CHECK(o.has(key));
    uint64_t n = 0;
    bool b = false;
    for (Status st : {o.size(key, 1, &n), o.number(key, 1, &n), o.flag(key, false, &b)}) {
      if (!st.is_ok()) {
        FUZZ_CHECK(st.code() == Code::kInvalidArgument);
        FUZZ_CHECK(st.message().find(std::string(key)) != std::string::npos);
      }
    }
  }
  Status known = o.check_known("fuzz", {"budget", "window"});
  FUZZ_CHECK(known.is_ok() || known.code() == Code::kInvalidArgument);
  uint64_t n = 7;
  FUZZ_CHECK(o.number("absent_key_", 7, &n).is_ok() || o.has("absent_key_"));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return -1;  // longer than any HELLO options field (str16) is worth exploring
  std::string_view text(reinterpret_cast<const char*>(data), size);
  check_sizes(text);

  Options o;
  Status st = Options::parse(text, &o);
  if (st.is_ok()) {
    check_options(o);
  } else {
    FUZZ_CHECK(st.code() == Code::kInvalidArgument && !st.message().empty());
  }

  std::string name;
  Options spec;
  Status sst = Options::parse_spec(text, &name, &spec);
  const size_t colon = text.find(':');
  FUZZ_CHECK(name == text.substr(0, colon));
  if (colon == std::string_view::npos) {
    FUZZ_CHECK(sst.is_ok() && spec.empty());
  } else if (colon + 1 < text.size()) {
    Options direct;
    const bool direct_ok = Options::parse(text.substr(colon + 1), &direct).is_ok();
    FUZZ_CHECK(sst.is_ok() == direct_ok);
    if (direct_ok) FUZZ_CHECK(spec.text() == direct.text());
  } else {
    FUZZ_CHECK(!sst.is_ok());
  }
  return 0;
}
