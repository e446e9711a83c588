#include "tedsim/comm/fault_injection.hpp"

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "tedsim/core/error.hpp"

namespace tedsim {

namespace {

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  throw InputError("--inject-fault '" + text + "': " + why +
                   " (expected hang:RANK[:STEP] or exit:RANK[:STEP], RANK >= 0, STEP >= 1)");
}

int whole_number(const std::string& text, const std::string& part, const char* what) {
  if (part.empty()) bad(text, std::string("the ") + what + " is missing");
  for (char c : part)
    if (c < '0' || c > '9') bad(text, std::string("the ") + what + " '" + part + "' is not a whole number");
  errno = 0;
  const long v = std::strtol(part.c_str(), nullptr, 10);
  if (errno == ERANGE || v > INT_MAX) bad(text, std::string("the ") + what + " '" + part + "' is too large");
  return int(v);
}

}  // namespace

FaultInjection parse_fault_injection(const std::string& text) {
  FaultInjection f;
  const auto colon = text.find(':');
  if (colon == std::string::npos) bad(text, "no rank given");
  const std::string kind = text.substr(0, colon);
  if (kind == "hang") f.kind = FaultInjection::Kind::hang;
  else if (kind == "exit") f.kind = FaultInjection::Kind::exit;
  else bad(text, "unknown fault '" + kind + "'");
  const std::string rest = text.substr(colon + 1);
  const auto second = rest.find(':');
  f.rank = whole_number(text, rest.substr(0, second), "rank");
  if (second != std::string::npos) {
    f.step = whole_number(text, rest.substr(second + 1), "step");
    if (f.step < 1) bad(text, "steps count from 1");
  }
  return f;
}

std::string to_string(const FaultInjection& f) {
  if (!f.active()) return "none";
  return std::string(f.kind == FaultInjection::Kind::hang ? "hang:" : "exit:") + std::to_string(f.rank) + ":" +
         std::to_string(f.step);
}

}  // namespace tedsim
