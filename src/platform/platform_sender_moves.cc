// PlatformSender::set_devices (include/slotstream/platform.h): a device moves onto or off the connection in
// place where it can (the leaving ones drained until stored, the reservation changed on the same receiver, the
// coming ones numbered with NUMBER), else by finishing with the receiver and reconnecting.
#include "platform/platform_sender_impl.h"

namespace slotstream {

// A move of one device, in place where it can be (see platform.h), else by reconnecting.
Status PlatformSender::set_devices(const std::vector<uint16_t>& devices, const std::map<uint16_t, uint64_t>& next,
                                   const PlatformNeed& need, std::map<uint16_t, uint64_t>* removed,
                                   const std::function<void()>& before_reconnect) {
  Impl& im = *impl_;
  std::lock_guard serial(im.moves);
  if (im.can_move_in_place(devices, next)) {
    Status st = im.move_in_place(devices, next, need, removed);
    if (st.is_ok()) return st;
    im.event("moving the devices by reconnecting: " + st.message());
  }
  if (before_reconnect) before_reconnect();
  std::unique_lock lock(im.gate);
  return im.reconnect(devices, next, need, removed);
}

bool PlatformSender::Impl::can_move_in_place(const std::vector<uint16_t>& set,
                                             const std::map<uint16_t, uint64_t>& next) {
  std::shared_lock lock(gate);
  if (!fatal.is_ok() || !sender || set.empty() || devices.empty() || connection_per_device(options.sender)) {
    return false;
  }
  for (uint16_t d : set) {
    const bool added = std::find(devices.begin(), devices.end(), d) == devices.end();
    if (added && (!sender->device(d) || !next.contains(d))) return false;  // not declared on this connection
  }
  return true;
}

// The devices that leave end their streams here once all of theirs is stored; the reservation
// changes on the same receiver; the devices that come start at their numbers. Shared gate: the
// others' sends go on; a receiver lost meanwhile fails this move, and the caller reconnects.
Status PlatformSender::Impl::move_in_place(const std::vector<uint16_t>& set, const std::map<uint16_t, uint64_t>& next,
                                           const PlatformNeed& need, std::map<uint16_t, uint64_t>* removed) {
  std::shared_lock lock(gate);
  if (!sender) return {Code::kPeerGone, "the connection went meanwhile"};
  std::vector<uint16_t> leaving, coming;
  for (uint16_t d : devices) {
    if (std::find(set.begin(), set.end(), d) == set.end()) leaving.push_back(d);
  }
  for (uint16_t d : set) {
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) coming.push_back(d);
  }
  std::map<uint16_t, uint64_t> gone;
  for (uint16_t d : leaving) {
    Status st = drain(d, &gone[d]);
    if (!st.is_ok()) {
      route_again(leaving);
      return st;
    }
  }
  platform::Request req;
  req.amount = {need.cpu, need.bandwidth, need.fps, receive_memory(options.sender, set.size())};
  req.devices = set;
  req.only = receiver;
  if (options.sender.transport != Transport::kAuto) req.transport = transport_name(options.sender.transport);
  platform::Placement p;
  Status st = lease->reserve(req, &p);
  for (uint16_t d : coming) {
    if (st.is_ok()) st = start(d, next.at(d));
  }
  if (!st.is_ok()) {
    route_again(leaving);
    return st;
  }
  {
    std::lock_guard dl(devices_mutex);
    devices = set;
  }
  options.need = need;
  std::string line;
  for (uint16_t d : coming)
    line += "; device " + std::to_string(d) + " now goes there from message " + std::to_string(next.at(d));
  for (auto [d, n] : gone) line += "; device " + std::to_string(d) + " ends there before message " + std::to_string(n);
  event("moved on the open connection to receiver " + receiver + line);
  *removed = std::move(gone);
  std::lock_guard sl(stats_mutex);
  ++stats.moves_in_place;
  return Status::ok();
}

// Device d leaves the connection: no send of it from now on, and once the receiver confirmed every
// message of it stored (STORED), *next_number is where its next one goes. Shared gate held.
Status PlatformSender::Impl::drain(uint16_t d, uint64_t* next_number) {
  Device& dev = *streams.at(d);
  const auto deadline = Clock::now() + kInPlaceWait;
  for (;;) {
    {
      std::lock_guard dl(dev.mutex);
      trim(d, dev);
      if (dev.log.pending().empty()) {
        dev.routed = false;
        if (!dev.log.first_unconfirmed_number()) {
          return {Code::kProtocolError,
                  "the receiver never said where device " + std::to_string(d) + "'s numbers start"};
        }
        *next_number = *dev.log.first_unconfirmed_number();
        return Status::ok();
      }
      dev.routed = false;  // a send() of it now is refused: its last messages are being confirmed
    }
    if (Clock::now() > deadline) {
      return {Code::kTimeout, "receiver " + receiver + " did not confirm device " + std::to_string(d) +
                                  "'s messages in " + std::to_string(kInPlaceWait.count()) + " ms"};
    }
    std::this_thread::sleep_for(kRoomPoll);
  }
}

void PlatformSender::Impl::route_again(const std::vector<uint16_t>& ds) {
  for (uint16_t d : ds) {
    Device& dev = *streams.at(d);
    std::lock_guard dl(dev.mutex);
    dev.routed = true;
  }
}

// Device d comes onto the connection: its next message is stored as `number` there (NUMBER), and
// the receiver's confirmations count from it. Shared gate held; no send of d until it returns.
Status PlatformSender::Impl::start(uint16_t d, uint64_t number) {
  Device* dev = stream(d);  // declared on the connection (can_move_in_place): made by connect_to
  if (!dev) return {Code::kInvalidArgument, "device " + std::to_string(d) + " is not declared"};
  std::lock_guard dl(dev->mutex);
  if (!dev->log.pending().empty())
    return {Code::kProtocolError, "device " + std::to_string(d) + " has unconfirmed messages"};
  SLOTSTREAM_RETURN_IF_ERROR(sender->continue_at(d, number, kInPlaceWait));
  dev->log.set_base(number - dev->log.next());
  dev->begin = dev->log.next();
  dev->routed = true;
  return Status::ok();
}

// Finishes with the current receiver (everything stored), then schedules the new set of devices
// (none: disconnect) and connects. Exclusive gate held.
Status PlatformSender::Impl::reconnect(const std::vector<uint16_t>& set, const std::map<uint16_t, uint64_t>& next,
                                       const PlatformNeed& need, std::map<uint16_t, uint64_t>* removed) {
  if (!fatal.is_ok()) return fatal;
  SLOTSTREAM_RETURN_IF_ERROR(finish_locked());  // everything sent so far is stored
  std::map<uint16_t, uint64_t> numbers;         // of every device sent so far: where it goes on
  for (uint16_t d : devices) {
    Device& dev = *streams.at(d);
    if (!dev.log.first_unconfirmed_number()) {
      return {Code::kProtocolError, "the receiver never said where device " + std::to_string(d) + "'s numbers start"};
    }
    numbers[d] = *dev.log.first_unconfirmed_number();
  }
  removed->clear();
  for (auto [d, n] : numbers) {
    if (std::find(set.begin(), set.end(), d) == set.end()) (*removed)[d] = n;
  }
  for (uint16_t d : set) {
    auto& dev = streams[d];
    if (!dev) dev = std::make_unique<Device>();
    if (auto it = next.find(d); it != next.end()) dev->log.set_base(it->second - dev->log.next());
  }
  {
    std::lock_guard dl(devices_mutex);
    devices = set;
  }
  set_routed(set);
  options.need = need;
  receiver.clear();
  {
    std::lock_guard sl(stats_mutex);
    stats.receiver.clear();
  }
  if (set.empty()) return lease->release();
  Status st = schedule({}, /*keep_asking=*/false);
  if (!st.is_ok()) {  // nothing is sent through the platform now: every device goes back
    {
      std::lock_guard dl(devices_mutex);
      devices.clear();
    }
    set_routed({});
    *removed = std::move(numbers);
    (void)lease->release();
  }
  return st;
}

}  // namespace slotstream
