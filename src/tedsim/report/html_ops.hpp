#pragma once
// The op-by-op part of a simulate report (simulate --ops / --html; JSON key "ops"): how a
// micro-batch's time on one rank splits over each layer kind and op kind, and every op's time,
// FLOPs or bytes, rate and shape in a sortable table.
#include <nlohmann/json.hpp>

#include "tedsim/report/html_page.hpp"

namespace tedsim {

void ops_section(HtmlPage& page, const nlohmann::json& ops);

}  // namespace tedsim
