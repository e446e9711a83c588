#pragma once
// A plain aligned text table: the same rows feed the terminal and the CSV file.
#include <ostream>
#include <string>
#include <vector>

namespace tedsim {

class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header) : header_(std::move(header)) {}
  void add_row(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  // Numbers align right by default; prose tables align every column left.
  void align_left() { all_left_ = true; }
  void print(std::ostream& out) const;
  std::string csv() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  bool all_left_ = false;
};

std::string fixed(double value, int decimals);
std::string human_seconds(double seconds);  // "312.4 ms", "2.15 s", "48 us"

}  // namespace tedsim
