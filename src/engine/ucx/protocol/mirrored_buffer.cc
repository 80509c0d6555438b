#include "engine/ucx/protocol/mirrored_buffer.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace slotstream::protocol {
namespace {

Status os_error(const std::string& what) { return {Code::kIoError, what + ": " + std::strerror(errno)}; }

}  // namespace

Status MirroredBuffer::create(size_t min_size, std::unique_ptr<MirroredBuffer>* out) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  if (min_size == 0 || min_size > (size_t(1) << 46)) {
    return {Code::kInvalidArgument, "mirrored buffer of " + std::to_string(min_size) + " bytes"};
  }
  const size_t size = (min_size + page - 1) / page * page;
  const int fd = memfd_create("slotstream-mirror", MFD_CLOEXEC);
  if (fd < 0) return os_error("memfd_create (mirrored ring buffer)");
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    Status st = os_error("ftruncate (mirrored ring buffer of " + std::to_string(size) + " bytes)");
    close(fd);
    return st;
  }
  // Reserve both halves at once so that nothing else can be mapped in between, then put the
  // same file over each half.
  void* base = mmap(nullptr, 2 * size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) {
    Status st = os_error("mmap (reserving " + std::to_string(2 * size) + " bytes for a mirrored ring buffer)");
    close(fd);
    return st;
  }
  auto* b = static_cast<std::byte*>(base);
  for (std::byte* half : {b, b + size}) {
    if (mmap(half, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      Status st = os_error("mmap (mirroring a ring buffer)");
      munmap(base, 2 * size);
      close(fd);
      return st;
    }
  }
  close(fd);  // the mappings keep the memory
  out->reset(new MirroredBuffer(b, size));
  return Status::ok();
}

MirroredBuffer::~MirroredBuffer() { munmap(base_, 2 * size_); }

}  // namespace slotstream::protocol
