#pragma once
// Errors carry their exit code: library code throws, only main() turns an error into a message and
// an exit status (2 for bad input the user can fix, 1 for a failure of the run itself).
#include <stdexcept>
#include <string>

namespace tedsim {

enum class ExitCode : int { ok = 0, failure = 1, bad_input = 2 };

class Error : public std::runtime_error {
 public:
  Error(const std::string& message, ExitCode code) : std::runtime_error(message), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Input the user can fix: a file, a key, a flag. Message names where and what was expected.
class InputError : public Error {
 public:
  explicit InputError(const std::string& message) : Error(message, ExitCode::bad_input) {}
};

// Something went wrong while running (a device, a collective, a file system).
class RunError : public Error {
 public:
  explicit RunError(const std::string& message) : Error(message, ExitCode::failure) {}
};

}  // namespace tedsim
