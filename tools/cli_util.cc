#include "cli_util.h"
#include "log.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <sstream>

namespace slotstream::tools {

CLI::Validator size_value(uint64_t min, uint64_t max) {
  return CLI::Validator(
      [min, max](std::string& text) -> std::string {
        auto bytes = parse_size(text);
        if (!bytes) {
          return "expects a size such as 4096, 64K, 1M or 4G (K/M/G/T = 2^10/2^20/2^30/2^40; KB, KiB alike), got '" +
                 text + "'";
        }
        if (*bytes > max) return format_size(*bytes) + " is above the most, " + format_size(max);
        if (*bytes < min) return format_size(*bytes) + " is below the least, " + format_size(min);
        text = std::to_string(*bytes);
        return "";
      },
      "SIZE", "size");
}

namespace {

// How --help shows a schema option's range: "1..4096" for a count, SIZE for a size (the text says
// the range in units), nothing for a duration (its text says it with its units).
std::string range_text(const OptionSpec& s) {
  if (s.kind == OptionKind::kSize) return "SIZE";
  if (s.kind == OptionKind::kDuration) return "";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f..%.0f", s.min, s.max);
  return buf;
}

}  // namespace

CLI::Validator schema_value(std::string_view name) {
  const OptionSpec* spec = find_option(name);
  if (!spec) throw std::logic_error("no option '" + std::string(name) + "' in the schema");
  return CLI::Validator(
      [spec](std::string& text) -> std::string {
        double value = 0;
        if (spec->kind == OptionKind::kSize && !text.starts_with("-")) {
          auto bytes = parse_size(text);
          if (!bytes) {
            return "expects a size such as 4096, 64K, 1M or 4G (K/M/G/T = 2^10/2^20/2^30/2^40; KB, KiB alike), got '" +
                   text + "'";
          }
          value = double(*bytes);
          if (!out_of_range(*spec, value)) text = std::to_string(*bytes);
        } else {
          size_t used = 0;
          try {
            value = std::stod(text, &used);
          } catch (const std::exception&) {
            used = 0;
          }
          if (used == 0 || used != text.size() || (spec->kind == OptionKind::kCount && value != std::floor(value))) {
            return std::string(spec->kind == OptionKind::kCount ? "expects an integer" : "expects a number") +
                   ", got '" + text + "'";
          }
        }
        if (auto why = out_of_range(*spec, value)) return *why;
        return "";
      },
      range_text(*spec), std::string(name));
}

CLI::Validator duration_value(const std::string& unit) {
  return CLI::Validator(
      [unit](std::string& text) -> std::string {
        static const std::pair<const char*, double> kUnits[] = {{"ms", 1e-3}, {"s", 1}, {"m", 60}, {"h", 3600}};
        double value = 0;
        size_t used = 0;
        try {
          value = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        const std::string suffix = used ? text.substr(used) : "";
        double seconds_per = unit == "ms" ? 1e-3 : 1;  // a bare number is in the option's unit
        bool known = suffix.empty();
        for (auto [name, secs] : kUnits) {
          if (suffix == name) {
            seconds_per = secs;
            known = true;
          }
        }
        if (!used || !known || !std::isfinite(value) || value < 0)
          return "expects a duration such as 90 (" + unit + "), 500ms, 30s, 2m or 1h, got '" + text + "'";
        std::ostringstream out;
        out.precision(17);
        out << value * seconds_per / (unit == "ms" ? 1e-3 : 1);
        text = out.str();
        return "";
      },
      "DURATION", "duration");
}

Status read_token(const std::string& path, std::string* token) {
  Status st = read_token_file(path, token);
  struct stat info {};
  if (st.is_ok() && ::stat(path.c_str(), &info) == 0 && (info.st_mode & S_IROTH)) {
    log_warning("token file '" + path + "' is readable by every user of this host: chmod o-r it (e.g. chmod 600)");
  }
  return st;
}

namespace {

// A flat TOML file as the options of the command that was given (see add_config_option).
class CommandConfig : public CLI::ConfigTOML {
 public:
  explicit CommandConfig(std::vector<CLI::App*> commands) : commands_(std::move(commands)) {}
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    auto items = CLI::ConfigTOML::from_config(input);
    for (CLI::App* c : commands_) {
      if (!c->parsed()) continue;
      for (auto& item : items) item.parents.insert(item.parents.begin(), c->get_name());
    }
    return items;
  }

 private:
  std::vector<CLI::App*> commands_;
};

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The subcommand named in argv (the first argument naming one), or the app itself.
const CLI::App* command_in(const CLI::App& app, const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    for (const CLI::App* sub : app.get_subcommands({})) {
      if (sub->get_name() == a) return sub;
    }
  }
  return &app;
}

}  // namespace

void add_config_option(CLI::App& app, const std::vector<CLI::App*>& commands) {
  app.set_config("--config", "",
                 "FILE: TOML with any of the command's options (key = long option without dashes); "
                 "options on the command line win. Example: docs/config.md");
  app.config_formatter(std::make_shared<CommandConfig>(commands));
  app.allow_config_extras(CLI::config_extras_mode::error);
  for (CLI::App* c : commands) c->fallthrough();
}

void apply_config_flags(const std::vector<CLI::App*>& commands) {
  for (CLI::App* c : commands) {
    if (!c->parsed()) continue;
    for (CLI::Option* o : c->get_options()) {
      if (o->get_expected_min() == 0 && o->count() > 0) o->run_callback();
    }
  }
}

std::string closest_match(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_distance = std::string::npos;
  for (const std::string& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_distance) {
      best = c;
      best_distance = d;
    }
  }
  // A typo: a few edits, fewer than a third of the word (so "--x" does not become "--to").
  const size_t allowed = std::max<size_t>(1, std::min<size_t>(3, word.size() / 3));
  return best_distance <= allowed ? best : "";
}

namespace {

// For `slotstream recieve ...`: CLI11 says only "A subcommand is required"; name the word it did not
// know, the closest command and the commands there are.
std::string unknown_command(const CLI::App& app, const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0].starts_with("-") || command_in(app, argv) != &app) return "";
  std::vector<std::string> names, shown;
  for (const CLI::App* sub : app.get_subcommands({})) {
    names.push_back(sub->get_name());
    if (!sub->get_group().empty()) shown.push_back(sub->get_name());
  }
  std::string out = "unknown command '" + argv[0] + "'";
  if (std::string m = closest_match(argv[0], names); !m.empty()) out += "; did you mean " + m + "?";
  out += "\ncommands:";
  for (const std::string& n : shown) out += " " + n;
  return out + " (`slotstream COMMAND --help`)\n";
}

}  // namespace

std::string suggest_flags(const CLI::App& app, const std::vector<std::string>& argv, const CLI::ParseError& e) {
  if (e.get_name() == "RequiredError") return unknown_command(app, argv);
  const CLI::App* cmd = command_in(app, argv);
  std::vector<std::string> names;
  for (const CLI::App* owner : {cmd, &app}) {
    for (const CLI::Option* o : owner->get_options()) {
      for (const std::string& l : o->get_lnames()) names.push_back("--" + l);
    }
  }
  std::string out;
  const std::string what = e.what();
  for (const std::string& a : argv) {
    std::string flag = a.substr(0, a.find('='));
    if (!flag.starts_with("--") || std::find(names.begin(), names.end(), flag) != names.end()) continue;
    if (what.find(flag) == std::string::npos) continue;  // not what the error is about
    if (std::string m = closest_match(flag, names); !m.empty())
      out += "did you mean " + m + " instead of " + flag + "?\n";
  }
  return out;
}

std::string unknown_config_key(const CLI::App& app, const std::vector<std::string>& argv, const CLI::ParseError& e) {
  static const std::string kPrefix = "INI was not able to parse ";
  const std::string what = e.what();
  if (e.get_name() != "ConfigError" || !what.starts_with(kPrefix)) return "";
  const CLI::App* cmd = command_in(app, argv);
  // The file's keys come prefixed with the command they are read for (CommandConfig): send.blok-size.
  std::string key = what.substr(kPrefix.size());
  if (cmd != &app && key.starts_with(cmd->get_name() + ".")) key = key.substr(cmd->get_name().size() + 1);
  std::string file = "the config file";
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == "--config" && i + 1 < argv.size()) file = argv[i + 1];
    if (argv[i].starts_with("--config=")) file = argv[i].substr(9);
  }
  std::vector<std::string> keys;
  for (const CLI::Option* o : cmd->get_options()) {
    for (const std::string& l : o->get_lnames()) {
      if (l != "help" && l != "config") keys.push_back(l);
    }
  }
  // CLI11 reads a "[name]" line as the key "name.++" (a section opened) and its end as "name.--".
  if (key.ends_with("++") || key.ends_with("--")) {
    const std::string section = key.substr(0, key.size() < 3 ? 0 : key.size() - 3);
    return "'[" + section + "]' in " + file +
           ": the file is flat, with no sections (the command says what it is for): " +
           "remove that line and keep its keys (docs/config.md)";
  }
  std::string out = "unknown key '" + key + "' in " + file;
  if (std::string m = closest_match(key, keys); !m.empty()) return out + " (did you mean '" + m + "'?)";
  return out + " (a key is one of `slotstream " + (cmd == &app ? std::string("COMMAND") : cmd->get_name()) +
         " --help`'s long options without its dashes)";
}

}  // namespace slotstream::tools
