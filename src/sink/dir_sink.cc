#include "sink/dir_sink.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace slotstream::sink {
namespace fs = std::filesystem;
namespace {

Status io_error(const std::string& what, int err) {
  std::string hint =
      err == ENOSPC ? " (disk full: free space; nothing is dropped, the data waits in the receiver)" : "";
  return {Code::kIoError, what + ": " + strerror(err) + hint};
}

// "0000000042.bin" (or .partial, .valid) -> 42; anything else -> -1.
int64_t parse_seq(const std::string& name) {
  if (name.size() < 11 || name[10] != '.') return -1;
  const std::string ext = name.substr(10);
  if (ext != ".bin" && ext != ".partial" && ext != ".valid") return -1;
  int64_t v = 0;
  for (int i = 0; i < 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

}  // namespace

DirSink::~DirSink() {
  for (auto& [d, dev] : devices_) {
    if (dev.fd >= 0) abort(d);
  }
}

std::string DirSink::file_name(uint64_t seq) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%010llu.bin", static_cast<unsigned long long>(seq));
  return buf;
}

uint64_t DirSink::next_seq_on_disk(const fs::path& device_dir) {
  uint64_t next = 0;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(device_dir, ec)) {
    int64_t seq = parse_seq(entry.path().filename().string());
    if (seq >= 0 && uint64_t(seq) + 1 > next) next = seq + 1;
  }
  return next;
}

fs::path DirSink::temp_path(const Device& d) const { return d.dir / ("." + file_name(d.next_seq) + ".part"); }

Status DirSink::open_device(uint16_t device, Device** out) {
  auto it = devices_.find(device);
  if (it != devices_.end()) {
    *out = &it->second;
    return Status::ok();
  }
  Device dev;
  dev.dir = dir_ / ("device-" + std::to_string(device));
  std::error_code ec;
  fs::create_directories(dev.dir, ec);
  if (ec) return {Code::kIoError, "cannot create " + dev.dir.string() + ": " + ec.message()};
  // Temp files of an earlier run that died mid-message are never complete messages.
  for (const auto& entry : fs::directory_iterator(dev.dir, ec)) {
    std::string name = entry.path().filename().string();
    if (name.size() > 5 && name[0] == '.' && name.ends_with(".part")) fs::remove(entry.path(), ec);
  }
  dev.numbered = first_.contains(device);
  dev.next_seq = dev.numbered ? first_.at(device) : next_seq_on_disk(dev.dir);
  *out = &devices_.emplace(device, std::move(dev)).first->second;
  return Status::ok();
}

Status DirSink::begin(uint16_t device) {
  Device* dev = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(open_device(device, &dev));
  if (dev->fd >= 0) abort(device);
  fs::path tmp = temp_path(*dev);
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {
    // The directory was removed under us (someone cleaned up the output): make it again
    // rather than refusing every message from now on.
    SLOTSTREAM_RETURN_IF_ERROR(recreate_dir(*dev));
    fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) return io_error("cannot create " + tmp.string(), errno);
  dev->fd = fd;
  dev->offset = 0;
  return Status::ok();
}

Status DirSink::recreate_dir(Device& dev) {
  std::error_code ec;
  fs::create_directories(dev.dir, ec);
  if (ec) return {Code::kIoError, "cannot create " + dev.dir.string() + ": " + ec.message()};
  ++recreated_;
  return Status::ok();
}

// The message's temp file was removed with its directory while the message was being written:
// its data lives on in the open (unlinked) file. Copies it into a new temp file in the recreated
// directory, so that the commit can link it in place.
Status DirSink::restore_temp(Device& dev) {
  fs::path tmp = temp_path(dev);
  if (::access(tmp.c_str(), F_OK) == 0 || errno != ENOENT) return Status::ok();
  SLOTSTREAM_RETURN_IF_ERROR(recreate_dir(dev));
  int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create " + tmp.string(), errno);
  std::vector<char> buf(1 << 20);
  for (uint64_t off = 0; off < dev.offset;) {
    const ssize_t n = ::pread(dev.fd, buf.data(), std::min<uint64_t>(buf.size(), dev.offset - off), off_t(off));
    if (n <= 0 || ::pwrite(fd, buf.data(), size_t(n), off_t(off)) != n) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("cannot restore " + tmp.string(), err);
    }
    off += uint64_t(n);
  }
  ::close(dev.fd);
  dev.fd = fd;
  return Status::ok();
}

Status DirSink::append(uint16_t device, std::span<const std::byte> data) {
  Device& dev = devices_.at(device);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::pwrite(dev.fd, data.data() + done, data.size() - done, off_t(dev.offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      // Undo a partial write so the retry starts from the same state.
      if (ftruncate(dev.fd, off_t(dev.offset)) != 0) { /* the retry overwrites it anyway */
      }
      return io_error("cannot write " + temp_path(dev).string(), err);
    }
    done += size_t(n);
  }
  dev.offset += data.size();
  return Status::ok();
}

Status DirSink::commit(uint16_t device) {
  Device& dev = devices_.at(device);
  SLOTSTREAM_RETURN_IF_ERROR(restore_temp(dev));
  fs::path tmp = temp_path(dev);
  fs::path final_path = dev.dir / file_name(dev.next_seq);
  if (::close(dev.fd) != 0 && errno != EINTR) {
    int err = errno;
    dev.fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
    return io_error("cannot close " + tmp.string(), err);
  }
  dev.fd = -1;
  SLOTSTREAM_RETURN_IF_ERROR(link_in_place(dev, tmp, final_path));
  dev.last = {dev.next_seq, dev.offset};
  ++dev.next_seq;
  return Status::ok();
}

Status DirSink::deliver(std::span<const Message> batch, size_t* stored) {
  for (*stored = 0; *stored < batch.size(); ++*stored) {
    const Message& m = batch[*stored];
    Device* dev = nullptr;
    SLOTSTREAM_RETURN_IF_ERROR(open_device(m.device, &dev));
    if (dev->fd >= 0) abort(m.device);  // a message spanning blocks that never ended
    SLOTSTREAM_RETURN_IF_ERROR(store_whole(*dev, m.data));
  }
  return Status::ok();
}

// begin + append + commit for a message that is all here, without the checks a message written
// piece by piece needs (its directory removed between pieces): a removed directory shows as
// ENOENT when the temp file is created, and is made again. A failure leaves nothing behind.
Status DirSink::store_whole(Device& dev, std::span<const std::byte> data) {
  const fs::path tmp = temp_path(dev);
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {
    SLOTSTREAM_RETURN_IF_ERROR(recreate_dir(dev));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) return io_error("cannot create " + tmp.string(), errno);
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::pwrite(fd, data.data() + done, data.size() - done, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("cannot write " + tmp.string(), err);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0 && errno != EINTR) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return io_error("cannot close " + tmp.string(), err);
  }
  dev.offset = data.size();
  if (Status st = link_in_place(dev, tmp, dev.dir / file_name(dev.next_seq)); !st.is_ok()) {
    if (dev.fd >= 0) ::close(dev.fd);  // link_in_place keeps a piecewise message open: not this one
    dev.fd = -1;
    ::unlink(tmp.c_str());
    return st;
  }
  dev.last = {dev.next_seq, data.size()};
  ++dev.next_seq;
  return Status::ok();
}

// Never overwrite: a file that appeared under our name since start-up stops us — unless the sender
// numbers its messages and the file has this message's length: then it was stored before (sent
// again after a receiver died before confirming it), and this copy is dropped.
Status DirSink::link_in_place(Device& dev, const fs::path& tmp, const fs::path& final_path) {
  if (::link(tmp.c_str(), final_path.c_str()) == 0) {
    ::unlink(tmp.c_str());
    return Status::ok();
  }
  const int err = errno;
  std::error_code ec;
  if (err == EEXIST && dev.numbered && fs::file_size(final_path, ec) == dev.offset && !ec) {
    ::unlink(tmp.c_str());
    ++dev.already_stored;
    return Status::ok();
  }
  dev.fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
  if (err == EEXIST) return {Code::kIoError, final_path.string() + " already exists; refusing to overwrite"};
  return io_error("cannot rename " + tmp.string(), err);
}

std::optional<MessageSink::Numbering> DirSink::numbering(uint16_t device) {
  if (auto it = devices_.find(device); it != devices_.end()) {
    return Numbering{it->second.next_seq, it->second.already_stored};
  }
  if (auto it = first_.find(device); it != first_.end()) return Numbering{it->second, 0};
  return Numbering{next_seq_on_disk(dir_ / ("device-" + std::to_string(device))), 0};
}

Status DirSink::next_seq(uint16_t device, uint64_t* out) {
  Device* dev = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(open_device(device, &dev));
  *out = dev->next_seq;
  return Status::ok();
}

Status DirSink::skip_to(uint16_t device, uint64_t seq) {
  Device* dev = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(open_device(device, &dev));
  if (dev->fd >= 0) return {Code::kInvalidArgument, "skip_to while a message is in progress"};
  if (seq < dev->next_seq) {
    return {Code::kInvalidArgument, "message " + std::to_string(seq) + " of device " + std::to_string(device) +
                                        " is behind the next one (" + std::to_string(dev->next_seq) + ")"};
  }
  dev->next_seq = seq;
  return Status::ok();
}

namespace {

// Writes `data` to a hidden temp file in dir and links it as `name` (never overwriting).
Status write_atomically(const fs::path& dir, const std::string& name, std::span<const std::byte> data) {
  const fs::path tmp = dir / ("." + name + ".part"), final_path = dir / name;
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return io_error("cannot create " + tmp.string(), errno);
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(tmp.c_str());
      return io_error("cannot write " + tmp.string(), err);
    }
    done += size_t(n);
  }
  if (::close(fd) != 0 && errno != EINTR) {
    int err = errno;
    ::unlink(tmp.c_str());
    return io_error("cannot close " + tmp.string(), err);
  }
  if (::link(tmp.c_str(), final_path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    if (err == EEXIST) return {Code::kIoError, final_path.string() + " already exists; refusing to overwrite"};
    return io_error("cannot rename " + tmp.string(), err);
  }
  ::unlink(tmp.c_str());
  return Status::ok();
}

}  // namespace

Status DirSink::store_partial(uint16_t device, std::span<const std::byte> data, std::string_view valid_json) {
  Device* dev = nullptr;
  SLOTSTREAM_RETURN_IF_ERROR(open_device(device, &dev));
  if (dev->fd >= 0) return {Code::kInvalidArgument, "store_partial while a message is in progress"};
  char stem[16];
  std::snprintf(stem, sizeof stem, "%010llu", static_cast<unsigned long long>(dev->next_seq));
  const std::string valid_name = std::string(stem) + ".valid", partial_name = std::string(stem) + ".partial";
  SLOTSTREAM_RETURN_IF_ERROR(write_atomically(
      dev->dir, valid_name, std::span(reinterpret_cast<const std::byte*>(valid_json.data()), valid_json.size())));
  if (Status st = write_atomically(dev->dir, partial_name, data); !st.is_ok()) {
    std::error_code ec;
    fs::remove(dev->dir / valid_name, ec);  // a retry writes both again
    return st;
  }
  dev->last = {dev->next_seq, data.size()};
  ++dev->next_seq;
  return Status::ok();
}

void DirSink::abort(uint16_t device) {
  auto it = devices_.find(device);
  if (it == devices_.end() || it->second.fd < 0) return;
  ::close(it->second.fd);
  it->second.fd = -1;
  std::error_code ec;
  fs::remove(temp_path(it->second), ec);
}

Status DirSink::deliver_datagram(const DatagramMessage& m) {
  auto it = datagram_base_.find(m.device);
  if (it == datagram_base_.end()) {
    uint64_t next = 0;
    SLOTSTREAM_RETURN_IF_ERROR(next_seq(m.device, &next));
    // The first message stored may not be message 0 (0 was lost): number from where 0 would be.
    it = datagram_base_.emplace(m.device, next).first;
  }
  SLOTSTREAM_RETURN_IF_ERROR(skip_to(m.device, it->second + m.number));
  if (m.partial) return store_partial(m.device, m.data, valid_json(m.valid));
  SLOTSTREAM_RETURN_IF_ERROR(begin(m.device));
  Status st = append(m.device, m.data);
  if (st.is_ok()) st = commit(m.device);
  if (!st.is_ok()) abort(m.device);
  return st;
}

std::string DirSink::valid_json(const std::vector<std::pair<uint64_t, uint64_t>>& ranges) {
  std::string s = "[";
  for (const auto& [offset, length] : ranges) {
    s += (s.size() > 1 ? ",[" : "[") + std::to_string(offset) + "," + std::to_string(length) + "]";
  }
  return s + "]";
}

}  // namespace slotstream::sink
