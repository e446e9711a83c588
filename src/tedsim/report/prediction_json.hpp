#pragma once
// The JSON shape of predictions, shared by simulate, search and (later) validate.
#include <nlohmann/json.hpp>

#include "tedsim/search/evaluator.hpp"
#include "tedsim/search/search.hpp"
#include "tedsim/sim/trace.hpp"

namespace tedsim {

nlohmann::json config_json(const ParallelConfig& c, const ModelSpec& m);
nlohmann::json phase_times_json(const PhaseTimes& t);
nlohmann::json prediction_json(const Prediction& p, const ModelSpec& m);
// The ranking (a plan predicting exactly what an earlier row does carries "folded_into_rank", that
// row's rank, as the folded table shows it); with every feasible point recorded (run_search's `every_point`), "points" holds one
// compact entry per feasible configuration (its knobs, throughput and peak memory).
nlohmann::json search_json(const SearchResult& r, const ModelSpec& m);
// The simulated timeline as [{lane, name, phase, start_s, duration_s, where}], lane "stage S stream".
nlohmann::json timeline_json(const TraceRecorder& trace);
// "-" writes to stdout, anything else atomically to a file.
void write_json(const std::string& path, const nlohmann::json& doc);

}  // namespace tedsim
