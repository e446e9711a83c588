#pragma once
// Option values that are comma-separated lists of names, each a bit of a set (Megatron-Core's
// --recompute-modules, --cuda-graph-scope).
#include <cstdint>
#include <initializer_list>
#include <string>

namespace tedsim {

struct NameBit {
  const char* name;
  std::uint8_t bit;
};

// "a,b" -> the bits of a and b. Throws InputError "OPTION: unknown NOUN 'x' (expected EXPECTED)"
// for a name not in `names`, and "OPTION: expected EXPECTED, got ''" for an empty list.
std::uint8_t parse_name_bits(const std::string& list, std::initializer_list<NameBit> names, const std::string& option,
                             const std::string& noun, const std::string& expected);
// The names of the set bits, in `names`' order, comma-separated ("" for none).
std::string name_bits_text(std::uint8_t bits, std::initializer_list<NameBit> names);

}  // namespace tedsim
