#include "engine/ucx/stream/send_ring.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "wire/block_header.h"

namespace slotstream::stream {
namespace {

using std::chrono::microseconds;
using wire::kBlockHeaderSize;

// Local memory for a ring of `blocks` x `block_size`, filled with garbage (a block's earlier use
// leaves bytes behind: nothing may take them for a record that was written).
struct Memory {
  Memory(uint32_t blocks, uint32_t block_size) : bytes(blocks * SendRing::block_stride(block_size), std::byte{0xA7}) {}
  std::vector<std::byte> bytes;
};

// Writes a whole message (device, packet, payload of `length` bytes of `fill`) into a reservation.
void write(SendRing& ring, const SendRing::Reservation& r, uint16_t device, uint32_t packet, uint32_t length,
           uint8_t fill) {
  std::memset(r.record + kBlockHeaderSize, fill, length);
  wire::encode_block_header({wire::kFirstFragment | wire::kLastFragment, device, packet, length},
                            std::span<std::byte, kBlockHeaderSize>(r.record, kBlockHeaderSize));
  ring.publish(r);
}

SendRing::Reservation reserve(SendRing& ring, uint32_t payload) {
  SendRing::Reservation r;
  EXPECT_TRUE(ring.reserve(uint32_t(wire::packed_record_size(payload)), &r).is_ok());
  return r;
}

struct Got {
  uint16_t device;
  uint32_t packet;
  uint32_t length;
};
std::vector<Got> records_of(const SendRing::Unit& u) {
  std::vector<Got> out;
  wire::UnitReader reader({u.data, u.length});
  for (wire::UnitReader::Item it; reader.next(&it);)
    out.push_back({it.header.device, it.header.packet, uint32_t(it.payload.size())});
  EXPECT_FALSE(reader.bad()) << wire::header_error_name(reader.error());
  return out;
}

// Takes the unit at the cursor (sealing the open block if the cursor reached it) and frees it.
SendRing::Unit take(SendRing& ring) {
  SendRing::Unit u;
  EXPECT_TRUE(ring.next_unit(&u, /*seal_open=*/true));
  ring.advance();
  return u;
}

TEST(SendRing, ALoneMessageLeavesAtOnceAsAPlainRecord) {
  Memory m(4, 4096);
  SendRing ring(m.bytes.data(), 4, 4096);
  SendRing::Reservation r = reserve(ring, 100);
  EXPECT_TRUE(r.lane_idle) << "no one holds the token: the filler must transmit it itself";
  write(ring, r, 3, 0, 100, 0x11);
  ASSERT_TRUE(ring.has_work());
  ASSERT_TRUE(ring.try_take_token());
  SendRing::Unit u = take(ring);
  EXPECT_FALSE(u.packed) << "one record: no packed header, the version-1 block of before";
  EXPECT_EQ(u.length, kBlockHeaderSize + 100);
  EXPECT_EQ(std::to_integer<uint8_t>(u.data[0]), wire::kBlockHeaderVersion);
  EXPECT_EQ(u.records, 1u);
  auto got = records_of(u);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].device, 3);
  ring.release(u.ticket);
  EXPECT_FALSE(ring.give_token()) << "nothing left";
  EXPECT_TRUE(ring.drained());
}

TEST(SendRing, RecordsReservedWhileTheLaneIsBusyLeaveTogether) {
  Memory m(4, 4096);
  SendRing ring(m.bytes.data(), 4, 4096);
  ASSERT_TRUE(ring.try_take_token());  // the lane is busy: a holder is transmitting
  for (uint32_t i = 0; i < 5; ++i) {
    SendRing::Reservation r = reserve(ring, 10 + i);
    EXPECT_FALSE(r.lane_idle) << "the holder sees it: no filler transmits";
    write(ring, r, uint16_t(i % 2), i / 2, 10 + i, uint8_t(i));
  }
  SendRing::Unit u = take(ring);
  EXPECT_TRUE(u.packed);
  EXPECT_EQ(u.records, 5u);
  auto got = records_of(u);
  ASSERT_EQ(got.size(), 5u);
  for (uint32_t i = 0; i < 5; ++i) {
    EXPECT_EQ(got[i].device, i % 2);
    EXPECT_EQ(got[i].packet, i / 2);
    EXPECT_EQ(got[i].length, 10 + i);
  }
  auto h = wire::decode_packed_header(std::span<const std::byte, wire::kPackedHeaderSize>(u.data, 16), 4096);
  ASSERT_TRUE(h);
  EXPECT_EQ(h->length, u.length);
  ring.release(u.ticket);
  EXPECT_FALSE(ring.give_token());
}

TEST(SendRing, ARecordThatDoesNotFitSealsTheBlockAndGoesIntoTheNext) {
  // 128-byte blocks: records of 48 bytes (32-byte payloads); two fit after the 16-byte packed
  // header (16 + 96 = 112), the third does not.
  Memory m(3, 128);
  SendRing ring(m.bytes.data(), 3, 128);
  ASSERT_TRUE(ring.try_take_token());
  for (uint32_t i = 0; i < 3; ++i) write(ring, reserve(ring, 32), 0, i, 32, uint8_t(i));
  SendRing::Unit first = take(ring);
  EXPECT_TRUE(first.packed);
  EXPECT_EQ(first.records, 2u);
  EXPECT_EQ(first.length, 16u + 2 * 48);
  EXPECT_EQ(records_of(first).back().packet, 1u);
  SendRing::Unit second = take(ring);  // the open block, sealed now that the cursor reached it
  EXPECT_EQ(second.ticket, first.ticket + 1);
  auto got = records_of(second);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].packet, 2u);
  ring.release(first.ticket);
  ring.release(second.ticket);
  EXPECT_FALSE(ring.give_token());
}

TEST(SendRing, AMessageThatExactlyFillsABlockIsSentAloneAndTheNextOneOpensABlock) {
  Memory m(2, 256);
  SendRing ring(m.bytes.data(), 2, 256);
  // The packed area is the block after its 16-byte header: 240 bytes = a 224-byte payload record.
  ASSERT_EQ(ring.max_packed(), 240u);
  ASSERT_TRUE(ring.try_take_token());
  write(ring, reserve(ring, 224), 1, 0, 224, 0x5A);
  write(ring, reserve(ring, 8), 1, 1, 8, 0x5B);
  SendRing::Unit u = take(ring);
  EXPECT_FALSE(u.packed);
  EXPECT_EQ(u.length, kBlockHeaderSize + 224);
  EXPECT_EQ(std::to_integer<uint8_t>(u.data[kBlockHeaderSize + 223]), 0x5A);
  SendRing::Unit v = take(ring);
  EXPECT_EQ(records_of(v).at(0).packet, 1u);
  ring.release(u.ticket);
  ring.release(v.ticket);
}

TEST(SendRing, AWholeBlockBetweenPackedRecordsKeepsTheOrder) {
  // A fragment of a large message takes a block of its own; the small records before it leave
  // first (their block is sealed), those after it follow it.
  Memory m(4, 512);
  SendRing ring(m.bytes.data(), 4, 512);
  ASSERT_TRUE(ring.try_take_token());
  write(ring, reserve(ring, 20), 0, 0, 20, 1);
  write(ring, reserve(ring, 20), 1, 0, 20, 2);
  SendRing::Slot slot;
  ASSERT_TRUE(ring.claim(&slot).is_ok());
  EXPECT_EQ(slot.ticket, 1u) << "block 0 was sealed with the two records";
  EXPECT_EQ(slot.block.size(), 512u);
  write(ring, reserve(ring, 20), 0, 2, 20, 3);  // after the whole block
  wire::encode_block_header({wire::kFirstFragment, 0, 1, 100}, slot.block.first<kBlockHeaderSize>());
  ring.commit(slot, kBlockHeaderSize + 100);
  std::vector<uint32_t> packets;
  for (int k = 0; k < 3; ++k) {
    SendRing::Unit u = take(ring);
    for (const Got& g : records_of(u)) {
      if (g.device == 0) packets.push_back(g.packet);
    }
    ring.release(u.ticket);
  }
  EXPECT_EQ(packets, (std::vector<uint32_t>{0, 1, 2}));
  EXPECT_FALSE(ring.give_token());
  EXPECT_TRUE(ring.drained());
}

TEST(SendRing, AnEmptyOpenBlockIsTakenWholeAndPackingOffTakesEveryBlockWhole) {
  Memory m(2, 256);
  SendRing off(m.bytes.data(), 2, 256, /*pack=*/false);
  EXPECT_EQ(off.max_packed(), 0u);
  for (uint64_t t = 0; t < 2; ++t) {
    SendRing::Slot s;
    ASSERT_TRUE(off.claim(&s).is_ok());
    EXPECT_EQ(s.ticket, t);
    off.commit(s, 16);
  }
  ASSERT_TRUE(off.try_take_token());
  SendRing::Unit u = take(off);
  EXPECT_EQ(u.length, 16u);
  EXPECT_FALSE(u.packed);
}

TEST(SendRing, OnlyACommittedWholeBlockAtTheCursorIsWhole) {
  // What a filler asks before it waits for receiver room itself (a whole block) or hands the lane
  // to the sending thread (packed records, which more may join meanwhile).
  Memory m(4, 512);
  SendRing ring(m.bytes.data(), 4, 512);
  ASSERT_TRUE(ring.try_take_token());
  EXPECT_FALSE(ring.whole_at_cursor()) << "nothing yet";
  write(ring, reserve(ring, 20), 0, 0, 20, 1);
  EXPECT_FALSE(ring.whole_at_cursor()) << "an open block of packed records";
  SendRing::Slot slot;
  ASSERT_TRUE(ring.claim(&slot).is_ok());  // seals block 0
  EXPECT_FALSE(ring.whole_at_cursor()) << "the sealed packed block is at the cursor";
  ring.release(take(ring).ticket);
  EXPECT_FALSE(ring.whole_at_cursor()) << "the whole block is not committed yet";
  wire::encode_block_header({wire::kFirstFragment | wire::kLastFragment, 0, 1, 100},
                            slot.block.first<kBlockHeaderSize>());
  ring.commit(slot, kBlockHeaderSize + 100);
  EXPECT_TRUE(ring.whole_at_cursor());
  SendRing::Unit u = take(ring);
  EXPECT_FALSE(u.packed);
  ring.release(u.ticket);
  EXPECT_FALSE(ring.whole_at_cursor()) << "the cursor moved past it";
  EXPECT_FALSE(ring.give_token());
}

TEST(SendRing, ABlockNotYetCommittedStopsTheCursorAndItsCommitterIsTold) {
  Memory m(4, 256);
  SendRing ring(m.bytes.data(), 4, 256);
  SendRing::Slot s;
  ASSERT_TRUE(ring.claim(&s).is_ok());
  ASSERT_TRUE(ring.try_take_token());
  SendRing::Unit u;
  EXPECT_FALSE(ring.next_unit(&u, true)) << "the whole block is still being filled";
  EXPECT_FALSE(ring.give_token());
  // Committed while the token is held by someone else: the holder sees it when it gives it back.
  ASSERT_TRUE(ring.try_take_token());
  ring.commit(s, 16);
  EXPECT_FALSE(ring.try_take_token());
  EXPECT_TRUE(ring.give_token()) << "work that relied on the holder";
}

TEST(SendRing, TheTransmitterWaitsForARecordStillBeingWritten) {
  // Stale bytes of the block's earlier use (0xA7 everywhere) must not pass for a written record.
  Memory m(2, 1024);
  SendRing ring(m.bytes.data(), 2, 1024);
  ASSERT_TRUE(ring.try_take_token());
  SendRing::Reservation a = reserve(ring, 40);
  SendRing::Reservation b = reserve(ring, 40);
  write(ring, b, 2, 0, 40, 0xBB);  // the later record is written first
  std::atomic<bool> written{false};
  std::thread filler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    written = true;
    write(ring, a, 1, 0, 40, 0xAA);
  });
  SendRing::Unit u = take(ring);
  EXPECT_TRUE(written) << "the unit was built before its first record was written";
  filler.join();
  auto got = records_of(u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].device, 1);
  EXPECT_EQ(got[1].device, 2);
  ring.release(u.ticket);
}

TEST(SendRing, AFullRingMakesAFillerWaitUntilABlockIsReleasedAndAbortFailsIt) {
  Memory m(2, 128);
  SendRing ring(m.bytes.data(), 2, 128);
  ASSERT_TRUE(ring.try_take_token());
  // Fill both blocks (two 48-byte records each), the fifth record waits for a free block.
  for (uint32_t i = 0; i < 4; ++i) write(ring, reserve(ring, 32), 0, i, 32, 0);
  SendRing::Unit first = take(ring);  // block 0, sealed by the overflow
  EXPECT_EQ(first.records, 2u);
  Status result;
  std::atomic<bool> done{false};
  std::thread filler([&] {
    SendRing::Reservation r;
    result = ring.reserve(48, &r);
    if (result.is_ok()) write(ring, r, 0, 4, 32, 0);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_FALSE(done) << "the fifth record has no block until one is released";
  ring.release(first.ticket);
  filler.join();
  EXPECT_TRUE(result.is_ok()) << result.to_string();
  // Now nothing is released: the block of record 4 fills up, the next record waits, and abort()
  // fails it.
  write(ring, reserve(ring, 32), 0, 5, 32, 0);
  std::thread stuck([&] {
    SendRing::Reservation r;
    result = ring.reserve(48, &r);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ring.abort();
  stuck.join();
  EXPECT_EQ(result.code(), Code::kCancelled);
}

// A filler whose receiver stalls for good (stopped, hung) looks again less and less often — sleeps of
// 1, 2, 4, then 8 ms — instead of spinning again after every 1 ms sleep (two such fillers made a
// sender with a stopped receiver cost 10 % of a core), and it still takes the block freed next.
TEST(SendRing, AFillerThatWaitsLongSleepsLongerAndStillTakesTheNextFreeBlock) {
  Memory m(2, 128);
  SendRing ring(m.bytes.data(), 2, 128);
  std::atomic<int> looks{0};
  ring.set_helper([&] { ++looks; });
  SendRing::Slot s;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ring.claim(&s).is_ok());
    ring.commit(s, 7);
  }
  ASSERT_TRUE(ring.try_take_token());
  SendRing::Unit first = take(ring);
  std::atomic<bool> done{false};
  std::thread filler([&] {
    SendRing::Slot slot;
    EXPECT_TRUE(ring.claim(&slot).is_ok());
    done = true;
    ring.commit(slot, 7);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done) << "no block is free";
  // 64 spins with a look every 8, then a look per sleep: ~45 in 300 ms. A 1 ms sleep followed by
  // 32 spins each time made ~1,500.
  EXPECT_LT(looks.load(), 150);
  const auto freed = std::chrono::steady_clock::now();
  ring.release(first.ticket);
  filler.join();
  // release() wakes it; its sleeps end by themselves within 8 ms in any case (100 ms: a loaded host).
  EXPECT_LT(std::chrono::steady_clock::now() - freed, std::chrono::milliseconds(100));
}

TEST(SendRing, HandingTheLaneToTheSendingThreadWakesItOnceAndKeepsTheToken) {
  Memory m(4, 1024);
  SendRing ring(m.bytes.data(), 4, 1024);
  ASSERT_TRUE(ring.try_take_token());
  const auto t0 = std::chrono::steady_clock::now();
  std::thread filler([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ring.hand_to_sender();
  });
  EXPECT_TRUE(ring.wait_work(microseconds(0), std::chrono::seconds(10)));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  filler.join();
  EXPECT_TRUE(ring.take_handoff());
  EXPECT_FALSE(ring.take_handoff()) << "taken once";
  EXPECT_FALSE(ring.try_take_token()) << "the token stayed held for the sending thread";
  SendRing::Reservation r = reserve(ring, 8);
  EXPECT_FALSE(r.lane_idle) << "fillers keep packing: the lane is busy";
}

TEST(SendRing, ANapWhileAFillerHoldsTheTokenEndsWhenItIsGivenBackOrHandedOver) {
  Memory m(4, 256);
  SendRing ring(m.bytes.data(), 4, 256);
  auto t0 = std::chrono::steady_clock::now();
  ring.nap(std::chrono::seconds(10));  // free token: nothing to wait for
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  ASSERT_TRUE(ring.try_take_token());
  t0 = std::chrono::steady_clock::now();
  std::thread holder([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ring.hand_to_sender();
  });
  ring.nap(std::chrono::seconds(10));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  holder.join();
  ASSERT_TRUE(ring.take_handoff());
  t0 = std::chrono::steady_clock::now();
  ring.nap(std::chrono::milliseconds(30));  // held, and nobody wakes it: the nap lasts its time
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
}

TEST(SendRing, ASleepingHolderIsWokenByAFillerThatLeavesItWork) {
  Memory m(4, 256);
  SendRing ring(m.bytes.data(), 4, 256);
  ASSERT_TRUE(ring.try_take_token());
  ASSERT_TRUE(ring.begin_sleep());
  SendRing::Reservation r = reserve(ring, 8);
  EXPECT_TRUE(r.wake) << "the holder sleeps in its worker: the filler must wake it";
  write(ring, r, 0, 0, 8, 0);
  ring.end_sleep();
  EXPECT_FALSE(ring.begin_sleep()) << "work is waiting: no sleep";
}

// Many fillers, packed records and whole blocks mixed, one transmitter: every record arrives
// once, each device's in order — the ring's whole contract under contention (and TSan).
TEST(SendRing, ConcurrentFillersAndOneTransmitterKeepEveryDevicesOrder) {
  constexpr uint32_t kBlocks = 4, kBlockSize = 256, kDevices = 6, kPerDevice = 3000;
  Memory m(kBlocks, kBlockSize);
  SendRing ring(m.bytes.data(), kBlocks, kBlockSize);
  std::atomic<int> fillers_left{kDevices};
  std::vector<std::thread> fillers;
  for (uint16_t d = 0; d < kDevices; ++d) {
    fillers.emplace_back([&, d] {
      for (uint32_t i = 0; i < kPerDevice; ++i) {
        const uint32_t length = (i * 7 + d) % 60;
        if (d == 0 && i % 50 == 7) {  // now and then a whole block (a fragment)
          SendRing::Slot s;
          ASSERT_TRUE(ring.claim(&s).is_ok());
          std::memset(s.block.data() + kBlockHeaderSize, int(i & 0xFF), length);
          wire::encode_block_header({wire::kFirstFragment | wire::kLastFragment, d, i, length},
                                    s.block.first<kBlockHeaderSize>());
          ring.commit(s, kBlockHeaderSize + length);
          continue;
        }
        SendRing::Reservation r;
        ASSERT_TRUE(ring.reserve(uint32_t(wire::packed_record_size(length)), &r).is_ok());
        write(ring, r, d, i, length, uint8_t(i));
      }
      --fillers_left;
    });
  }
  std::vector<uint32_t> next(kDevices, 0);
  uint64_t units = 0, packed = 0;
  // One transmitter: takes the token for good (fillers only ever leave their records to it).
  while (!ring.try_take_token()) std::this_thread::yield();
  while (fillers_left > 0 || !ring.drained()) {
    SendRing::Unit u;
    if (!ring.next_unit(&u, true)) {
      std::this_thread::yield();
      continue;
    }
    ring.advance();
    ++units;
    packed += u.packed;
    for (const Got& g : records_of(u)) {
      ASSERT_LT(g.device, kDevices);
      ASSERT_EQ(g.packet, next[g.device]) << "device " << g.device;
      ++next[g.device];
    }
    ring.release(u.ticket);
  }
  for (auto& t : fillers) t.join();
  for (uint16_t d = 0; d < kDevices; ++d) EXPECT_EQ(next[d], kPerDevice) << "device " << d;
  EXPECT_GT(packed, 0u) << "a busy lane packs";
  EXPECT_LT(units, uint64_t(kDevices) * kPerDevice);
}

// A filler with a deadline (a Python send() that returns to check for Ctrl-C) that finds no block
// free takes no ticket: nothing is left behind.
TEST(SendRing, AClaimOrReserveThatTimesOutBeforeABlockIsFreeTakesNothing) {
  Memory m(2, 128);
  SendRing ring(m.bytes.data(), 2, 128);
  SendRing::Slot s;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(ring.claim(&s).is_ok());
    ring.commit(s, 7);
  }
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(ring.claim(&s, t0 + std::chrono::milliseconds(30)).code(), Code::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(30));
  SendRing::Reservation r;
  EXPECT_EQ(ring.reserve(uint32_t(wire::packed_record_size(8)), &r, std::chrono::steady_clock::now()).code(),
            Code::kTimeout);
  ASSERT_TRUE(ring.try_take_token());
  for (uint64_t t = 0; t < 2; ++t) {
    SendRing::Unit u = take(ring);
    EXPECT_EQ(u.ticket, t);
    ring.release(u.ticket);
  }
  EXPECT_FALSE(ring.has_work()) << "the timed-out calls left nothing";
  ASSERT_TRUE(ring.claim(&s, std::chrono::steady_clock::now()).is_ok()) << "a free block: no wait";
  EXPECT_EQ(s.ticket, 2u);
}

// Ring of 2: ticket 1 in flight, records in the open block 2. A whole-block claim seals block 2
// and takes ticket 3, whose block (that of ticket 1) is not free: when it times out, ticket 3 is
// given up and committed empty the moment ticket 1 is released — the cursor never waits for it.
struct SealedThenWaiting {
  Memory m{2, 128};
  SendRing ring{m.bytes.data(), 2, 128};
  SealedThenWaiting() {
    SendRing::Slot s;
    for (int i = 0; i < 2; ++i) {
      EXPECT_TRUE(ring.claim(&s).is_ok());
      ring.commit(s, 7);
    }
    EXPECT_TRUE(ring.try_take_token());
    EXPECT_EQ(take(ring).ticket, 0u);
    ring.release(0);
    EXPECT_EQ(take(ring).ticket, 1u);              // in flight: not released yet
    write(ring, reserve(ring, 8), 5, 0, 8, 0x55);  // opens block 0 as ticket 2
  }
};

TEST(SendRing, AClaimThatTimesOutAfterSealingLeavesAnEmptyBlockAndTheCursorGoesOn) {
  SealedThenWaiting f;
  SendRing::Slot s;
  EXPECT_EQ(f.ring.claim(&s, std::chrono::steady_clock::now() + std::chrono::milliseconds(20)).code(), Code::kTimeout);
  f.ring.release(1);  // ticket 3's block is free: it is committed empty at once
  SendRing::Unit u = take(f.ring);
  EXPECT_EQ(u.ticket, 2u);
  ASSERT_EQ(records_of(u).size(), 1u);
  f.ring.release(2);
  u = take(f.ring);
  EXPECT_EQ(u.ticket, 3u);
  EXPECT_EQ(u.length, 0u) << "nothing to send from a ticket its filler gave up";
  f.ring.release(3);
  EXPECT_FALSE(f.ring.has_work());
  ASSERT_TRUE(f.ring.claim(&s, std::chrono::steady_clock::now()).is_ok());
  EXPECT_EQ(s.ticket, 4u);
}

// The block may become free between the timeout and the give-up: then it is committed empty once.
TEST(SendRing, ATicketFreedJustAsItsFillerGivesUpIsCommittedEmptyOnce) {
  SealedThenWaiting f;
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    f.ring.release(1);
  });
  SendRing::Slot s;
  Status st = f.ring.claim(&s, std::chrono::steady_clock::now() + std::chrono::milliseconds(20));
  releaser.join();
  if (st.is_ok()) f.ring.commit(s, 0);  // won the race: gives it back itself, as send_blocks does on error
  EXPECT_EQ(take(f.ring).ticket, 2u);
  f.ring.release(2);
  SendRing::Unit u = take(f.ring);
  EXPECT_EQ(u.ticket, 3u);
  EXPECT_EQ(u.length, 0u);
  f.ring.release(3);
  EXPECT_FALSE(f.ring.has_work()) << "ticket 3 was filled exactly once";
}

}  // namespace
}  // namespace slotstream::stream
