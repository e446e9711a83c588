#pragma once
// One self-contained HTML page: headings, text, sortable tables and Vega plots, with Vega inlined
// (vega_library.hpp) so the file opens offline and fetches nothing. Every page carries a small
// self-check: once each plot has rendered it records, on <html data-tedsim-status>, how many marks
// each plot drew and any error or console message, which the browser test reads.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tedsim {

std::string html_escape(const std::string& text);

class HtmlPage {
 public:
  explicit HtmlPage(std::string title);
  void heading(const std::string& text, int level = 2);
  void paragraph(const std::string& text);     // escaped
  void preformatted(const std::string& text);  // escaped, monospace
  // Click a header to sort by it (numerically where every cell of the column is a number).
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
             const std::string& caption);
  // `spec` is a complete Vega spec; `caption` says in one line what the plot shows.
  void plot(const nlohmann::json& spec, const std::string& caption);
  int plots() const { return plots_; }
  // The whole document; throws InputError when Vega cannot be read.
  std::string render() const;

 private:
  std::string title_;
  std::string body_;
  std::string specs_;
  int plots_ = 0;
  int tables_ = 0;
};

}  // namespace tedsim
