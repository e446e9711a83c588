#include "tedsim/report/text_table.hpp"

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>

namespace tedsim {

void TextTable::print(std::ostream& out) const {
  std::vector<std::size_t> width(header_.size(), 0);
  for (std::size_t i = 0; i < header_.size(); ++i) width[i] = header_[i].size();
  for (const auto& row : rows_)
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], row[i].size());
  auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < width.size(); ++i) {
      const std::string& cell = i < cells.size() ? cells[i] : std::string();
      out << (i == 0 ? "" : "  ") << (i == 0 || all_left_ ? std::left : std::right) << std::setw(int(width[i])) << cell;
    }
    out << std::right << '\n';
  };
  line(header_);
  std::size_t total = 0;
  for (std::size_t w : width) total += w + 2;
  out << std::string(total > 2 ? total - 2 : 0, '-') << '\n';
  for (const auto& row : rows_) line(row);
}

std::string TextTable::csv() const {
  std::ostringstream out;
  auto line = [&](const std::vector<std::string>& cells) {
    for (std::size_t i = 0; i < cells.size(); ++i) out << (i ? "," : "") << cells[i];
    out << '\n';
  };
  line(header_);
  for (const auto& row : rows_) line(row);
  return out.str();
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string human_seconds(double s) {
  if (s >= 1.0) return fixed(s, 3) + " s";
  if (s >= 1e-3) return fixed(s * 1e3, 2) + " ms";
  return fixed(s * 1e6, 1) + " us";
}

}  // namespace tedsim
