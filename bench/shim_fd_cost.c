// What libslotstream_udp.so costs the calls it wraps on descriptors that are not its UDP sockets (and on one
// that is): nanoseconds per poll() on a readable pipe, TCP socket and UDP socket, and per write()+read() of one
// byte on a pipe. Run it with and without LD_PRELOAD; alternate the binaries in one run window (docs/benchmarks.md):
//   cc -O2 -o /tmp/shim_fd_cost bench/shim_fd_cost.c
//   /tmp/shim_fd_cost [N]; LD_PRELOAD=$PWD/build/libslotstream_udp.so /tmp/shim_fd_cost [N]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

static void need(int ok, const char* what) {
  if (!ok) {
    perror(what);
    exit(1);
  }
}

static double poll_ns(int fd, int n) {
  struct pollfd p = {fd, POLLIN, 0};
  const double t0 = now_ns();
  for (int i = 0; i < n; ++i) need(poll(&p, 1, 0) == 1, "poll: not readable");
  return (now_ns() - t0) / n;
}

static double pipe_rw_ns(int rd, int wr, int n) {
  char c;
  const double t0 = now_ns();
  for (int i = 0; i < n; ++i) need(write(wr, "y", 1) == 1 && read(rd, &c, 1) == 1, "pipe");
  return (now_ns() - t0) / n;
}

// A loopback pair of `type`; one byte (datagram) waits at *rx.
static void loopback(int type, int* rx, int* tx) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t len = sizeof a;
  int s = socket(AF_INET, type, 0);
  need(s >= 0 && bind(s, (struct sockaddr*)&a, sizeof a) == 0 && getsockname(s, (struct sockaddr*)&a, &len) == 0,
       "bind");
  *tx = socket(AF_INET, type, 0);
  if (type == SOCK_STREAM) {
    need(listen(s, 1) == 0 && connect(*tx, (struct sockaddr*)&a, sizeof a) == 0, "connect");
    *rx = accept(s, NULL, NULL);
    close(s);
  } else {
    need(connect(*tx, (struct sockaddr*)&a, sizeof a) == 0, "connect");
    *rx = s;
  }
  need(write(*tx, "x", 1) == 1, "write");
  usleep(10000);
}

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 200000;
  int p[2], tcp_rx, tcp_tx, udp_rx, udp_tx;
  need(pipe(p) == 0 && write(p[1], "x", 1) == 1, "pipe");
  loopback(SOCK_STREAM, &tcp_rx, &tcp_tx);
  loopback(SOCK_DGRAM, &udp_rx, &udp_tx);
  poll_ns(p[0], n / 10);  // warm up
  const double pipe_poll = poll_ns(p[0], n), tcp_poll = poll_ns(tcp_rx, n), udp_poll = poll_ns(udp_rx, n);
  char c;
  need(read(p[0], &c, 1) == 1, "read");
  const double pipe_rw = pipe_rw_ns(p[0], p[1], n);
  printf("poll_pipe_ns %.0f poll_tcp_ns %.0f poll_udp_ns %.0f write_read_pipe_ns %.0f\n", pipe_poll, tcp_poll, udp_poll,
         pipe_rw);
  return 0;
}
