#pragma once
// What every fuzz target shares: the input as text, and the rule that bad input may only end in
// an InputError (exit 2 in the CLI). Any other exception, a crash, a leak or undefined behaviour
// (the targets build with ASan and UBSan) is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tedsim/core/error.hpp"

namespace tedsim::fuzz {

inline std::string text_of(const std::uint8_t* data, std::size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

template <typename F>
void expect_only_input_errors(F&& f) {
  try {
    f();
  } catch (const InputError&) {
    // The clear answer bad input gets.
  }
}

}  // namespace tedsim::fuzz
