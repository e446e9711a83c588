#pragma once
// The Vega specs the HTML reports draw, each built from plain rows of data. Every chart has axis
// titles (with units) and a legend where colour means something; the caption lives in the page.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tedsim {

// Horizontal stacked bars. rows: [{bar, part, value}] in drawing order (parts stack in order).
// With `limit` > 0, a vertical rule marks it (e.g. the device's memory capacity) labelled `limit_label`.
struct StackedBars {
  std::string value_title, bar_title, part_title;
  double limit = 0;
  std::string limit_label;
  // Every part in a fixed order, so a part keeps its colour from chart to chart (e.g. the phases);
  // empty: the parts present, as they come.
  std::vector<std::string> colour_domain;
};
nlohmann::json stacked_bars_chart(const nlohmann::json& rows, const StackedBars& options);

// Vertical bars grouped by category, one bar per series: rows [{category, series, value}].
struct GroupedBars {
  std::string category_title, value_title, series_title;
};
nlohmann::json grouped_bars_chart(const nlohmann::json& rows, const GroupedBars& options);

// Points coloured by one of `colour_fields` (a menu under the plot picks which), with a step line
// through `front` (e.g. a Pareto front). points: [{x, y, label, <colour fields>...}]; front: [{x, y}].
struct Scatter {
  std::string x_title, y_title;
  std::vector<std::string> colour_fields;
  std::string front_title;
};
nlohmann::json scatter_chart(const nlohmann::json& points, const nlohmann::json& front, const Scatter& options);

// Lines with points, one per series: points [{x, y, series, label}], x ascending within a series.
// `references`: horizontal rules [{y, label}].
struct Lines {
  std::string x_title, y_title, series_title;
  bool x_log = false, y_log = false;
  bool y_zero = false;     // a linear y axis from zero (else fitted to the data)
  bool x_integer = false;  // x counts something (iterations): whole-number ticks only
  nlohmann::json references = nlohmann::json::array();
};
nlohmann::json line_chart(const nlohmann::json& points, const Lines& options);

// A timeline: one lane per row, each event a bar from start to end: [{lane, start, end, name, colour}].
struct Timeline {
  std::string time_title, lane_title, colour_title;
  std::vector<std::string> colour_domain;  // as StackedBars::colour_domain
};
nlohmann::json timeline_chart(const nlohmann::json& events, const Timeline& options);

}  // namespace tedsim
