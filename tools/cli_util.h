// What the CLI adds to CLI11 so that it has no traps: sizes with units wherever a size is taken,
// `recv|send --config FILE` (TOML, the command line wins), and a suggestion for a mistyped flag.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "slotstream/options.h"
#include "slotstream/slotstream.h"

namespace slotstream::tools {

// Every size option's one parser: turns "4096", "64K", "64KB", "64KiB", "1M", "4G" or "1T" into the
// number of bytes (slotstream::parse_size: K/KB/KiB alike = 2^10, M = 2^20, G = 2^30, T = 2^40; a
// decimal 1MB is 1 MiB, as the help and docs/cli-contract.md say), and refuses a value outside
// [min, max] in units ("--block-size: 64 GiB is above the most, 64 MiB"); anything else is refused
// with an example.
CLI::Validator size_value(uint64_t min = 0, uint64_t max = UINT64_MAX);
// The option schema's check of option `name` (slotstream/options.h: its range, and the one message
// for a value outside it, the same as Python's and GStreamer's): a size option also takes units, as
// size_value(); a count must be an integer; a duration is checked after duration_value() made it a
// number of the spec's unit.
CLI::Validator schema_value(std::string_view name);
// What size options accept, for help texts and footers (kept in one place).
inline constexpr const char* kSizeUnits =
    "SIZE: bytes, or with K, M, G, T (KB/KiB, MB/MiB ... alike: powers of 1024, so 1MB = 1M = 1048576)";
// slotstream::format_size (slotstream/options.h).
using slotstream::format_size;

// Turns "90", "90s", "500ms", "2m" or "1h" into a number of `unit`s ("s" or "ms"; a bare number is
// already in `unit`), before any range check; anything else, or a negative time, is refused with an
// example. Every duration option of the CLI takes it, as every size option takes size_value().
CLI::Validator duration_value(const std::string& unit);

// Reads a --token-file (slotstream::read_token_file) and logs a warning (log.h) when any user of the host
// may read it (mode o+r): the secret then protects nothing. Group-readable is fine (the Helm chart's
// 0440 token for the receiver's group).
Status read_token(const std::string& path, std::string* token);

// `--config FILE` on `app`, read as the options of whichever of `commands` was given: a flat TOML
// file whose keys are the command's long options without dashes (`listen = "0.0.0.0:7000"`,
// `block-size = "1M"`, `file = ["0=a.raw", "0=b.raw"]`, `json = true`). An option given on the
// command line wins over the file (a list replaces the file's list); an unknown key is an error.
// The commands must let unknown options fall through to `app` (they do after this call).
void add_config_option(CLI::App& app, const std::vector<CLI::App*>& commands);

// After a successful parse: sets the variables of flags that came from the config file. CLI11 2.1
// records such a flag but runs its callback only if the command's own callbacks have not run yet,
// and a command with a parse_complete_callback (recv, send) has run them before the file is read.
void apply_config_flags(const std::vector<CLI::App*>& commands);

// The closest of `candidates` to `word` when it is close enough to be a typo ("" otherwise).
std::string closest_match(const std::string& word, const std::vector<std::string>& candidates);

// For a parse error about unexpected arguments: "did you mean --X?" lines for each mistyped flag of
// the command given (`argv` as passed to main), "" when none is close.
std::string suggest_flags(const CLI::App& app, const std::vector<std::string>& argv, const CLI::ParseError& e);

// For an unknown key in --config FILE (CLI11: "INI was not able to parse send.blok-size"): "unknown
// key 'blok-size' in FILE (did you mean 'block-size'?)"; "" for any other error.
std::string unknown_config_key(const CLI::App& app, const std::vector<std::string>& argv, const CLI::ParseError& e);

// A percentage "0".."100" (an optional trailing '%') as a fraction: --inject-loss 5 -> 0.05. nullopt if
// it is not one.
std::optional<double> parse_percent(const std::string& text);

}  // namespace slotstream::tools
