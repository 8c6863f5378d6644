#pragma once
// Names for the shared-memory regions of shm endpoints, and reclaiming the regions of dead
// processes. The shm provider names a region after the process id by default and unlinks it
// only on a clean close, so a killed rank leaves its region (16 MiB) in /dev/shm, and a later
// process that is handed the same pid fails fi_enable with EBUSY. Our names add the pid
// namespace and the process start time, so they never collide, and let the next endpoint
// created on the host remove regions whose owner is gone.
#include <sys/types.h>

#include <optional>
#include <string>

namespace ddp::detail::fabric {

struct RegionOwner {
  std::string pid_namespace;
  pid_t pid = 0;
  unsigned long long start_time = 0;  // clock ticks after boot, /proc/<pid>/stat field 22
};

// A name unique to this process and endpoint: "ddp-<pidns>-<pid>-<start>-<serial>".
std::string shm_region_name(int serial);

// The owner encoded in a region name, or nullopt for names not made by shm_region_name.
std::optional<RegionOwner> parse_region_owner(const std::string& name);

// The start time of a running process, or nullopt if it does not exist.
std::optional<unsigned long long> process_start_time(pid_t pid);

// What one shm endpoint's region may grow to (libfabric 1.17 creates 16 MiB files).
inline constexpr unsigned long long kShmRegionBytes = 16ull << 20;

// Free bytes in the filesystem holding the regions, or nullopt if it cannot be read.
std::optional<unsigned long long> shm_bytes_available(const std::string& directory = "/dev/shm");

// Removes /dev/shm regions named by this library whose owner (in this pid namespace) no longer
// runs. Returns how many were removed.
int reclaim_dead_shm_regions(const std::string& directory = "/dev/shm");

}  // namespace ddp::detail::fabric
