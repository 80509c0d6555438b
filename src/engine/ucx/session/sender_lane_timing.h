// SenderLane's timing (timeouts, idle periods, spins and naps), shared by sender_lane.cc (connection,
// handshake, fabric set-up) and sender_lane_send.cc (the data path: draining the ring, the sending thread,
// liveness, FIN). Private to src/engine/ucx/session.
#pragma once

#include <chrono>

#include "net/control_socket.h"

namespace slotstream::session {

using Clock = std::chrono::steady_clock;
using net::Millis;

namespace {
constexpr Millis kHandshakeTimeout{10000};
// The first answer to HELLO (CHALLENGE, ACCEPT or REFUSE): a receiver sends it once its blocks are
// set up; nothing by then means nothing that speaks slotstream listens there (docs/cli-contract.md).
constexpr Millis kFirstAnswerTimeout{5000};
constexpr Millis kConnectTimeout{5000};
constexpr auto kLivenessInterval = Millis(1);
// After FIN_ACK: how long a sender whose memory the receiver reads waits for it to let go.
constexpr auto kLetGoTimeout = Millis(2000);
// After a transport error, how long the receiver's reason (REFUSE) may lag it on the control connection.
constexpr auto kRefusalWait = Millis(200);
// How long the sending thread waits for a filled block before calling the protocol's idle_st():
// normally ~1 ms; while the protocol holds records back (SenderProtocol::holding_st) much sooner.
constexpr auto kIdlePeriod = std::chrono::microseconds(1000);
// Once nothing was transmitted for kLongIdle, every kLongIdlePeriod: the sending thread's idle
// turns are all an idle connection costs (fillers transmit themselves; finish() wakes it).
constexpr auto kLongIdle = std::chrono::milliseconds(100);
constexpr auto kLongIdlePeriod = std::chrono::milliseconds(20);
constexpr auto kHoldingIdlePeriod = std::chrono::microseconds(50);
constexpr auto kInFlightPeriod = std::chrono::microseconds(20);
// How long the sending thread spins for the next block before it sleeps: long while it moves
// data itself (a sleep would cost a futex wake per block), short once fillers transmit or the
// lane is idle — an idle sending thread then costs ~nothing.
constexpr auto kBusySpin = std::chrono::microseconds(50);
constexpr auto kIdleSpin = std::chrono::microseconds(2);
// The sending thread found the token taken (a filler transmits, maybe waiting for a free block):
// it naps, twice as long each time it finds it taken again, up to kMaxTokenTakenNap — a filler
// that waits for a stalled receiver keeps the token for as long as the stall lasts, and a 20 µs
// poll of it cost a sixth of a core, and naps of up to 1 ms ~2 % of one on an idle host. The holder
// wakes the nap when it leaves work behind (or hands the lane over).
constexpr auto kTokenTakenNap = std::chrono::microseconds(20);
constexpr auto kMaxTokenTakenNap = std::chrono::microseconds(8000);
}  // namespace

}  // namespace slotstream::session
