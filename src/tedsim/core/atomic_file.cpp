#include "tedsim/core/atomic_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tedsim/core/error.hpp"

namespace tedsim {

void write_file_atomically(const std::string& path, const std::string& contents) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw RunError(path + ": cannot write (" + std::strerror(errno) + ")");
    out << contents;
    out.flush();
    if (!out) throw RunError(path + ": write failed (" + std::strerror(errno) + ")");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw RunError(path + ": cannot rename temporary file into place (" + why + ")");
  }
}

}  // namespace tedsim
