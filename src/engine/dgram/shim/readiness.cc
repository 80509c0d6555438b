// Readiness through the shim: poll, ppoll, select, pselect, epoll_wait, epoll_pwait (and epoll_ctl, to know
// which registration is which socket) — so that a socket is reported readable exactly when a datagram for the
// application is there (patent: the socket interface delivers whole messages; a segment is not one).
//
// The design: the wrappers call the real function, then, for each UDP socket it reports readable, ask the
// socket layer (receive.cc, shim::readiness with drain) to take off the kernel's queue whatever precedes the
// first datagram for the application — segments of large datagrams (placed; one that completes its datagram
// leaves it readable in the shim's queue) and datagrams the shim drops. A socket left with nothing is no
// longer reported; when nothing at all is left to report and time remains, they wait again. Before waiting
// they look at the shim's own queues (a recombined datagram not yet read: readable at once, as the kernel
// cannot know) and bound the wait by the next partial-delivery timer. Level- and edge-triggered epoll both
// stay right: a socket drained to empty produces a new edge with its next datagram; an EPOLLONESHOT
// registration whose event was swallowed is re-armed.
//
// Limits: epoll registrations are told apart by their data (u64); two UDP sockets registered with the same
// data in one epoll set are not, and such events pass unfiltered. epoll_pwait2 and io_uring are not wrapped.
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/select.h>

#include <algorithm>
#include <climits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "clock.h"
#include "engine/dgram/shim/shim.h"

using slotstream::now_ns;
using slotstream::dgram::shim::any_held;
using slotstream::dgram::shim::next;
using slotstream::dgram::shim::readiness;

namespace {

struct Real {
  decltype(&::poll) poll = next<decltype(&::poll)>("poll");
  decltype(&::ppoll) ppoll = next<decltype(&::ppoll)>("ppoll");
  decltype(&::select) select = next<decltype(&::select)>("select");
  decltype(&::pselect) pselect = next<decltype(&::pselect)>("pselect");
  decltype(&::epoll_ctl) epoll_ctl = next<decltype(&::epoll_ctl)>("epoll_ctl");
  decltype(&::epoll_wait) epoll_wait = next<decltype(&::epoll_wait)>("epoll_wait");
  decltype(&::epoll_pwait) epoll_pwait = next<decltype(&::epoll_pwait)>("epoll_pwait");
};

Real& real() {
  static Real r;
  return r;
}

constexpr int64_t kForever = INT64_MAX;
constexpr short kPollIn = POLLIN | POLLRDNORM;
constexpr uint32_t kEpollIn = EPOLLIN | EPOLLRDNORM;

int64_t deadline_ms(int ms) { return ms < 0 ? kForever : now_ns() + int64_t(ms) * 1'000'000; }
int64_t deadline_ts(const timespec* t) {
  return t ? now_ns() + int64_t(t->tv_sec) * 1'000'000'000 + t->tv_nsec : kForever;
}
int64_t deadline_tv(const timeval* t) {
  return t ? now_ns() + int64_t(t->tv_sec) * 1'000'000'000 + t->tv_usec * 1000 : kForever;
}
bool passed(int64_t deadline) { return deadline != kForever && now_ns() >= deadline; }

// A timeout in milliseconds for poll/epoll_wait reaching `until` (rounded up; -1: forever).
int ms_to(int64_t until) {
  if (until == kForever) return -1;
  const int64_t left = until - now_ns();
  return left <= 0 ? 0 : int(std::min<int64_t>((left + 999'999) / 1'000'000, INT_MAX));
}
timespec ts_to(int64_t until) {
  const int64_t left = std::max<int64_t>(until - now_ns(), 0);
  return {time_t(left / 1'000'000'000), long(left % 1'000'000'000)};
}
timeval tv_to(int64_t until) {
  const int64_t left = std::max<int64_t>(until - now_ns(), 0);
  return {time_t(left / 1'000'000'000), suseconds_t((left % 1'000'000'000 + 999) / 1000)};
}

// Before waiting: whether one of the sockets `fds` yields (fd or -1) is readable in the shim's own queue, and
// the earliest partial-delivery timer; only asked while some socket holds recombination state.
template <class Fds>
int64_t look_before_waiting(int64_t deadline, Fds&& fds) {
  if (!any_held()) return deadline;
  int64_t until = deadline;
  fds([&](int fd) {
    const auto r = readiness(fd, false);
    if (r.readable) until = now_ns();
    until = std::min(until, r.wake_ns);
  });
  return until;
}

// After waiting: whether fd is readable, given whether the kernel said so.
bool readable_after(int fd, bool kernel_says) {
  if (kernel_says) {
    const auto r = readiness(fd, true);
    return !r.udp || r.readable;
  }
  return any_held() && readiness(fd, false).readable;
}

// ------------------------------------------------------------------ poll, ppoll

template <class Wait>
int poll_loop(pollfd* fds, nfds_t n, int64_t deadline, Wait&& wait) {
  for (;;) {
    const int64_t until = look_before_waiting(deadline, [&](auto&& each) {
      for (nfds_t i = 0; i < n; ++i)
        if (fds[i].fd >= 0 && (fds[i].events & kPollIn)) each(fds[i].fd);
    });
    const int rc = wait(until);
    if (rc < 0) return rc;
    int count = 0;
    for (nfds_t i = 0; i < n; ++i) {
      pollfd& p = fds[i];
      if (p.fd >= 0 && (p.events & kPollIn)) {
        const bool in = readable_after(p.fd, p.revents & kPollIn);
        p.revents = short(in ? (p.revents | (p.events & kPollIn)) : (p.revents & ~kPollIn));
      }
      count += p.revents != 0;
    }
    if (count > 0 || passed(deadline)) return count;
  }
}

// ------------------------------------------------------------------ select, pselect

template <class Wait>
int select_loop(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, int64_t deadline, Wait&& wait) {
  if (!rd) return wait(rd, wr, ex, deadline);
  const fd_set rd0 = *rd;
  const fd_set wr0 = wr ? *wr : fd_set{};
  const fd_set ex0 = ex ? *ex : fd_set{};
  for (;;) {
    *rd = rd0;
    if (wr) *wr = wr0;
    if (ex) *ex = ex0;
    const int64_t until = look_before_waiting(deadline, [&](auto&& each) {
      for (int fd = 0; fd < nfds; ++fd)
        if (FD_ISSET(fd, &rd0)) each(fd);
    });
    const int rc = wait(rd, wr, ex, until);
    if (rc < 0) return rc;
    int count = 0;
    for (int fd = 0; fd < nfds; ++fd) {
      if (FD_ISSET(fd, &rd0)) {
        if (readable_after(fd, FD_ISSET(fd, rd))) {
          FD_SET(fd, rd);
        } else {
          FD_CLR(fd, rd);
        }
      }
      count += FD_ISSET(fd, rd) + (wr && FD_ISSET(fd, wr)) + (ex && FD_ISSET(fd, ex));
    }
    if (count > 0 || passed(deadline)) return count;
  }
}

// ------------------------------------------------------------------ epoll

struct Registration {
  int fd;
  uint32_t events;
};

// epoll set -> registration data -> the UDP socket registered with it (sockets registered for input only).
std::mutex g_ep_mu;
std::unordered_map<int, std::unordered_map<uint64_t, Registration>> g_ep;

// A copy of epfd's registrations: asked only while some socket holds recombination state (any_held), since
// with thousands of sockets registered (SIPp, a socket per client) a copy per epoll_wait is what it costs.
std::vector<std::pair<uint64_t, Registration>> registrations(int epfd) {
  std::lock_guard lock(g_ep_mu);
  const auto it = g_ep.find(epfd);
  if (it == g_ep.end()) return {};
  return {it->second.begin(), it->second.end()};
}

bool has_registrations(int epfd) {
  std::lock_guard lock(g_ep_mu);
  return g_ep.contains(epfd);
}

// The UDP socket registered in epfd with this data, if any.
std::optional<Registration> registered(int epfd, uint64_t data) {
  std::lock_guard lock(g_ep_mu);
  const auto set = g_ep.find(epfd);
  if (set == g_ep.end()) return std::nullopt;
  const auto it = set->second.find(data);
  if (it == set->second.end()) return std::nullopt;
  return it->second;
}

void note(int epfd, int op, int fd, const epoll_event* ev) {
  const bool udp = op != EPOLL_CTL_DEL && ev && (ev->events & kEpollIn) && readiness(fd, false).udp;
  std::lock_guard lock(g_ep_mu);
  auto& m = g_ep[epfd];
  // Whatever this descriptor, or this data, named before (a descriptor closed without EPOLL_CTL_DEL leaves
  // the kernel's set by itself, and its number or data may come back for another file).
  std::erase_if(m, [&](const auto& kv) { return kv.second.fd == fd || (ev && kv.first == ev->data.u64); });
  if (udp) m[ev->data.u64] = {fd, ev->events};
  if (m.empty()) g_ep.erase(epfd);
}

template <class Wait>
int epoll_loop(int epfd, epoll_event* evs, int max, int64_t deadline, Wait&& wait) {
  // Each event is looked up by its data, and the whole set only walked while the shim holds datagrams: the
  // cost of a call does not grow with the sockets registered (10,000 in `bench sipscale`).
  if (max <= 0 || !has_registrations(epfd)) return wait(deadline);
  for (;;) {
    const int64_t until = look_before_waiting(deadline, [&](auto&& each) {
      for (const auto& [_, r] : registrations(epfd)) each(r.fd);
    });
    const int rc = wait(until);
    if (rc < 0) return rc;
    int out = 0;
    for (int k = 0; k < rc; ++k) {
      epoll_event ev = evs[k];
      const auto r = registered(epfd, ev.data.u64);
      if (r && (ev.events & kEpollIn) && !readable_after(r->fd, true)) {
        ev.events &= ~kEpollIn;
        if (r->events & EPOLLONESHOT) {  // the kernel disarmed it for an event the application never saw
          epoll_event again{r->events, {.u64 = ev.data.u64}};
          real().epoll_ctl(epfd, EPOLL_CTL_MOD, r->fd, &again);
        }
      }
      if (ev.events) evs[out++] = ev;
    }
    // Datagrams waiting in the shim's queues: readable although the kernel has nothing.
    for (const auto& [data, r] : any_held() ? registrations(epfd) : decltype(registrations(epfd)){}) {
      if (out >= max || !any_held()) break;
      const bool listed = std::any_of(evs, evs + out, [&](const epoll_event& e) { return e.data.u64 == data; });
      if (!listed && readiness(r.fd, false).readable) evs[out++] = {EPOLLIN | (r.events & EPOLLRDNORM), {.u64 = data}};
    }
    if (out > 0 || passed(deadline)) return out;
  }
}

}  // namespace

extern "C" {

int poll(pollfd* fds, nfds_t n, int timeout) {
  return poll_loop(fds, n, deadline_ms(timeout), [&](int64_t until) { return real().poll(fds, n, ms_to(until)); });
}

int ppoll(pollfd* fds, nfds_t n, const timespec* timeout, const sigset_t* mask) {
  return poll_loop(fds, n, deadline_ts(timeout), [&](int64_t until) {
    const timespec t = ts_to(until);
    return real().ppoll(fds, n, until == kForever ? nullptr : &t, mask);
  });
}

int select(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, timeval* timeout) {
  return select_loop(nfds, rd, wr, ex, deadline_tv(timeout), [&](fd_set* r, fd_set* w, fd_set* e, int64_t until) {
    timeval t = tv_to(until);
    return real().select(nfds, r, w, e, until == kForever ? nullptr : &t);
  });
}

int pselect(int nfds, fd_set* rd, fd_set* wr, fd_set* ex, const timespec* timeout, const sigset_t* mask) {
  return select_loop(nfds, rd, wr, ex, deadline_ts(timeout), [&](fd_set* r, fd_set* w, fd_set* e, int64_t until) {
    const timespec t = ts_to(until);
    return real().pselect(nfds, r, w, e, until == kForever ? nullptr : &t, mask);
  });
}

int epoll_ctl(int epfd, int op, int fd, epoll_event* ev) {
  const int rc = real().epoll_ctl(epfd, op, fd, ev);
  if (rc == 0) note(epfd, op, fd, ev);
  return rc;
}

int epoll_wait(int epfd, epoll_event* evs, int max, int timeout) {
  return epoll_loop(epfd, evs, max, deadline_ms(timeout),
                    [&](int64_t until) { return real().epoll_wait(epfd, evs, max, ms_to(until)); });
}

int epoll_pwait(int epfd, epoll_event* evs, int max, int timeout, const sigset_t* mask) {
  return epoll_loop(epfd, evs, max, deadline_ms(timeout),
                    [&](int64_t until) { return real().epoll_pwait(epfd, evs, max, ms_to(until), mask); });
}

}  // extern "C"
