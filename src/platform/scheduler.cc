#include "platform/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <tuple>

namespace slotstream::platform {

namespace {

struct Dimension {
  const char* name;
  double Amount::*field;
  std::optional<double> Capacity::*limit;
  double scale;  // for messages
  const char* unit;
};
constexpr Dimension kDimensions[] = {
    {"cpu", &Amount::cpu, &Capacity::cpu, 1, ""},
    {"bandwidth", &Amount::bandwidth, &Capacity::bandwidth, 1e6, " MB/s"},
    {"fps", &Amount::fps, &Capacity::fps, 1, " fps"},
    {"receive memory", &Amount::memory, &Capacity::memory, 1048576.0, " MiB"},
};
// Sums of doubles: a reservation that exactly fills a receiver must fit.
constexpr double kSlack = 1e-9;

// The most used limited dimension after adding `need` (0 when nothing is limited).
double utilisation_after(const ReceiverView& v, const Amount& need) {
  double worst = 0;
  for (const auto& d : kDimensions) {
    const auto& cap = v.record.capacity.*d.limit;
    if (!cap || *cap <= 0) continue;
    worst = std::max(worst, (v.reserved.*d.field + need.*d.field) / *cap);
  }
  return worst;
}

bool serves(const ReceiverRecord& r, const std::string& transport) {
  return transport.empty() || std::find(r.transports.begin(), r.transports.end(), transport) != r.transports.end();
}

std::string format_amount(double value, const Dimension& d) {
  char buf[64];
  std::snprintf(buf, sizeof buf, d.scale == 1 && d.unit[0] == '\0' ? "%.2f%s" : "%.1f%s", value / d.scale, d.unit);
  return buf;
}

}  // namespace

std::string shortfall(const ReceiverView& v, const Amount& need) {
  std::string out;
  auto add = [&out](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  for (const auto& d : kDimensions) {
    const auto& cap = v.record.capacity.*d.limit;
    if (!cap) continue;
    const double missing = v.reserved.*d.field + need.*d.field - *cap;
    if (missing > kSlack * std::max(1.0, *cap)) add(std::string(d.name) + " " + format_amount(missing, d) + " short");
  }
  if (need.memory > double(v.record.free_receive_memory)) {
    add("receive memory free now " + format_amount(double(v.record.free_receive_memory), kDimensions[3]) + " < " +
        format_amount(need.memory, kDimensions[3]));
  }
  return out;
}

Decision choose(const std::vector<ReceiverView>& receivers, const Amount& need, const std::set<std::string>& exclude,
                const std::string& transport) {
  std::vector<const ReceiverView*> fit;
  std::string refusals;
  size_t considered = 0;
  for (const auto& v : receivers) {
    if (exclude.contains(v.record.name) || !serves(v.record, transport)) continue;
    ++considered;
    const std::string lack = shortfall(v, need);
    if (lack.empty()) {
      fit.push_back(&v);
    } else {
      refusals += "\n  " + v.record.name + ": " + lack;
    }
  }
  Decision d;
  if (fit.empty()) {
    d.why = considered == 0 ? "no receiver is registered" + std::string(transport.empty() ? "" : " for " + transport) +
                                  (exclude.empty() ? "" : " besides the one just lost")
                            : "no receiver has room for " + describe(need) + ":" + refusals;
    return d;
  }
  auto key = [&need](const ReceiverView* v) {
    return std::make_tuple(utilisation_after(*v, need), -v->record.free_cpu, v->record.senders, v->record.name);
  };
  std::sort(fit.begin(), fit.end(), [&](const ReceiverView* a, const ReceiverView* b) { return key(a) < key(b); });
  const ReceiverView& best = *fit.front();
  char line[256];
  std::snprintf(line, sizeof line, "%s at %s: %.0f%% of its most used capacity after this reservation",
                best.record.name.c_str(), best.record.address.c_str(), 100 * utilisation_after(best, need));
  d.ok = true;
  d.receiver = best.record.name;
  d.why = line;
  if (fit.size() > 1) {
    d.why += ", the least of " + std::to_string(fit.size()) + " with room (";
    for (size_t i = 1; i < fit.size(); ++i) {
      std::snprintf(line, sizeof line, "%s%s %.0f%%", i > 1 ? ", " : "", fit[i]->record.name.c_str(),
                    100 * utilisation_after(*fit[i], need));
      d.why += line;
    }
    d.why += ")";
  }
  if (!refusals.empty()) d.why += "; without room:" + refusals;
  return d;
}

std::vector<ReceiverView> build_views(const std::vector<ReceiverRecord>& records,
                                      const std::vector<Reservation>& reservations, const std::string& leave_out) {
  std::vector<ReceiverView> views;
  std::map<std::string, size_t> index;
  for (const auto& r : records) {
    index[r.name] = views.size();
    views.push_back({r, {}, 0});
  }
  for (const auto& res : reservations) {
    auto it = index.find(res.receiver);
    if (it == index.end() || res.sender == leave_out) continue;  // a dead receiver's, or our own
    views[it->second].reserved += res.amount;
    ++views[it->second].reservations;
  }
  return views;
}

}  // namespace slotstream::platform
