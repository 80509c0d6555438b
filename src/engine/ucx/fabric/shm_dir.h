// Nothing left in /dev/shm, however a process ends.
//
// UCX 1.13's POSIX shared memory (src/uct/sm/mm/posix/mm_posix.c) creates a segment with
// shm_open("/ucx_shm_posix_<random>", O_CREAT | O_EXCL), writes its whole length to check that
// /dev/shm has room, and only then unlinks it (UCX_POSIX_USE_PROC_LINK=y, the default: peers open
// it through /proc/<pid>/fd/<fd>). A process killed between the two — while a sender's 256 MiB
// ring was being written, or one of the few MiB of a worker's receive FIFO — leaves the file
// behind, named after nothing that tells whose it was: 24 GB in one test, and the machine's memory
// with it. Nothing in UCX can be asked to do otherwise, and no handler runs on SIGKILL.
//
// So the segments of this process are put in a directory of its own, /dev/shm/slotstream-<pid>
// (UCX_POSIX_DIR: UCX then creates them with open() there, and still unlinks them once mapped),
// and a watcher process — /bin/sh, in a session of its own so that a signal to our process group
// does not reach it — waits for the end of a pipe only this process holds, which the kernel closes
// however the process ends, and removes the directory. At start, directories of processes that no
// longer exist (their watcher was killed too) are removed.
//
// Left alone when the user configured UCX's POSIX transport (UCX_POSIX_DIR or
// UCX_POSIX_USE_PROC_LINK set: without the /proc link a peer opens a segment by its name in its
// own configured directory), and where /dev/shm or /bin/sh is missing (then UCX's default).
#pragma once

#include <string>
#include <string_view>

namespace slotstream::fabric {

// The directory for this process's POSIX segments, made (and its watcher started) on the first
// call; "" when UCX's default is to be kept. Any thread.
const std::string& posix_segment_dir();

// The pid a directory name "slotstream-<pid>" names, or 0 for any other name. Pure.
int segment_dir_owner(std::string_view name);

}  // namespace slotstream::fabric
