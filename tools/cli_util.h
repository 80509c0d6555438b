// What the CLI adds to CLI11 so that it has no traps: sizes with units wherever a size is taken,
// `recv|send --config FILE` (TOML, the command line wins), and a suggestion for a mistyped flag.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace slotstream::tools {

// Turns "64K", "1M", "1MiB", "4G" or "1048576" into the number of bytes (slotstream::parse_size),
// before any range check; anything else is refused with an example.
CLI::Validator size_value();

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

// For a parse error about unexpected arguments or unknown config keys: "did you mean --X?" lines
// for each mistyped flag of the command given (`argv` as passed to main), "" when none is close.
std::string suggest_flags(const CLI::App& app, const std::vector<std::string>& argv, const CLI::ParseError& e);

}  // namespace slotstream::tools
