#pragma once
// HTML reports of tedsim's results, built from the JSON documents the commands write with --json
// (so `tedsim report` can rebuild one later from saved files): search, simulate, validate, scale,
// and measured profiles. Each document becomes a section of one page (html_page.hpp).
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tedsim {

// What a document is: "search", "simulate", "validate", "scale" or "profile" (its "kind", or
// recognised by its keys for files written before kinds were recorded); "" when none.
std::string report_kind(const nlohmann::json& doc);

// Indices of the plans no other plan beats on both counts (more throughput at no more memory),
// ordered by memory: the Pareto front of (peak_memory[i], throughput[i]).
std::vector<std::size_t> pareto_front(const std::vector<double>& peak_memory, const std::vector<double>& throughput);

// The page for `docs`; `sources[i]` names where docs[i] came from (a file, or a command line).
// Throws InputError for a document of no known kind (naming its source) or when Vega is missing.
std::string html_report(const std::vector<nlohmann::json>& docs, const std::vector<std::string>& sources);

// Writes html_report(docs) to `path` atomically.
void write_html_report(const std::string& path, const std::vector<nlohmann::json>& docs,
                       const std::vector<std::string>& sources);

}  // namespace tedsim
