#include "engine/ucx/fabric/shm_dir.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <mutex>

#include <spdlog/spdlog.h>

extern char** environ;

namespace slotstream::fabric {
namespace fs = std::filesystem;

namespace {

constexpr const char* kShm = "/dev/shm";
constexpr std::string_view kPrefix = "slotstream-";
// The watcher: reads its stdin (the pipe) until end of file, then removes the directory ($0).
constexpr const char* kWatcher = "while read -r _; do :; done; rm -rf -- \"$0\"";

bool process_exists(int pid) { return ::kill(pid, 0) == 0 || errno == EPERM; }

// Directories of processes gone before their watcher could remove them.
void remove_stale_dirs() {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(kShm, ec)) {
    const int owner = segment_dir_owner(entry.path().filename().string());
    if (owner > 0 && owner != ::getpid() && !process_exists(owner) && entry.is_directory(ec)) {
      fs::remove_all(entry.path(), ec);
      spdlog::info("removed {} (shared memory of process {}, which no longer exists)", entry.path().string(), owner);
    }
  }
}

// Starts the watcher of `dir`; false if it cannot run (the directory is then not used).
bool start_watcher(const std::string& dir) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return false;
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], 0);  // as its stdin, without close-on-exec
  posix_spawnattr_init(&attr);
  sigset_t none;
  sigemptyset(&none);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK);
  const char* argv[] = {"sh", "-c", kWatcher, dir.c_str(), nullptr};
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, "/bin/sh", &actions, &attr, const_cast<char**>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    return false;
  }
  (void)fds[1];  // held until this process ends: its end of file is the watcher's signal
  return true;
}

std::string make_dir() {
  if (getenv("UCX_POSIX_DIR") != nullptr || getenv("UCX_POSIX_USE_PROC_LINK") != nullptr) return "";
  std::error_code ec;
  if (!fs::is_directory(kShm, ec)) return "";
  remove_stale_dirs();
  const std::string dir = std::string(kShm) + "/" + std::string(kPrefix) + std::to_string(::getpid());
  fs::remove_all(dir, ec);  // a dead process's, whose pid this one now has
  if (::mkdir(dir.c_str(), 0700) != 0 || !start_watcher(dir)) {
    fs::remove_all(dir, ec);
    spdlog::warn("cannot keep shared memory in a directory of this process's own ({}); UCX's default is used",
                 std::strerror(errno));
    return "";
  }
  return dir;
}

}  // namespace

int segment_dir_owner(std::string_view name) {
  if (!name.starts_with(kPrefix)) return 0;
  name.remove_prefix(kPrefix.size());
  int pid = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), pid);
  return ec == std::errc() && end == name.data() + name.size() && pid > 0 ? pid : 0;
}

const std::string& posix_segment_dir() {
  static std::once_flag once;
  static std::string dir;
  std::call_once(once, [] { dir = make_dir(); });
  return dir;
}

}  // namespace slotstream::fabric
