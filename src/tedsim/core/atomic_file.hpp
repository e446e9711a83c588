#pragma once
// Files are written to a temporary name beside the target and renamed into place, so a reader (or
// a resumed run) never sees half a file.
#include <string>

namespace tedsim {

// Throws RunError naming the path if it cannot be written.
void write_file_atomically(const std::string& path, const std::string& contents);

}  // namespace tedsim
