#include "tedsim/spec/name_bits.hpp"

#include <sstream>

#include "tedsim/core/error.hpp"

namespace tedsim {

std::uint8_t parse_name_bits(const std::string& list, std::initializer_list<NameBit> names, const std::string& option,
                             const std::string& noun, const std::string& expected) {
  std::uint8_t bits = 0;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    bool known = false;
    for (const NameBit& n : names) {
      if (item == n.name) {
        bits |= n.bit;
        known = true;
      }
    }
    if (!known) throw InputError(option + ": unknown " + noun + " '" + item + "' (expected " + expected + ")");
  }
  if (bits == 0) throw InputError(option + ": expected " + expected + ", got '" + list + "'");
  return bits;
}

std::string name_bits_text(std::uint8_t bits, std::initializer_list<NameBit> names) {
  std::string text;
  for (const NameBit& n : names)
    if (bits & n.bit) text += (text.empty() ? "" : ",") + std::string(n.name);
  return text;
}

}  // namespace tedsim
