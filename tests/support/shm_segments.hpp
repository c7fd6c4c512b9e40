#pragma once
// Which shared-memory segments of dtrain's a job maps, read from its processes' /proc/<pid>/maps
// ("/dev/shm/dtrain-... (deleted)" once unlinked), and whether a name is still in /dev/shm. Tests
// look at their own job's segments this way: other tests beside them make segments of their own.

#include <dirent.h>
#include <sys/types.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace dtrain::testing {

struct mapped_segment {
  std::string name;  // "dtrain-..."
  bool unlinked = false;
};

inline std::vector<mapped_segment> segments_mapped_by(const std::vector<pid_t>& pids) {
  std::vector<mapped_segment> found;
  for (pid_t pid : pids) {
    std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
    for (std::string line; std::getline(maps, line);) {
      const auto at = line.find("/dev/shm/dtrain-");
      if (at == std::string::npos) continue;
      const auto rest = line.substr(at + 9);  // "dtrain-..." and perhaps " (deleted)"
      mapped_segment s{rest.substr(0, rest.find(' ')), rest.find("(deleted)") != std::string::npos};
      const bool seen = std::any_of(found.begin(), found.end(), [&](const auto& f) { return f.name == s.name; });
      if (!seen) found.push_back(s);
    }
  }
  return found;
}

inline bool listed_in_dev_shm(const std::string& name) {
  bool found = false;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) found = found || name == e->d_name;
    ::closedir(d);
  }
  return found;
}

}  // namespace dtrain::testing
