#pragma once
// How a dropless router spreads its tokens over the experts, as calibration measured it
// (calibration/expert_shares_measure.hpp): the step's own model, freshly initialised as the step
// initialises it, routing the step's own synthetic tokens. Each pass is one MoE layer's routing of
// one micro-batch over the whole world; its row holds every expert's share of the pass's rows.
//
// What it sets: with experts over `ep` ranks (rank r owns a contiguous block, as the step and
// Megatron-Core place them) the busiest rank's rows over the mean rank's, which paces every rank
// of the expert group (model/workload.hpp busiest_rank_load). A pass's shares mix the router's
// systematic preference (some experts score higher for most tokens) with the sampling noise of a
// micro-batch; the load of a rank is taken per pass, then averaged: the step waits for each
// pass's busiest rank, whichever it is.
#include <cstdint>
#include <string>
#include <vector>

namespace tedsim {

struct ExpertShares {
  std::string model;                        // the model whose router was measured (its name)
  std::vector<std::vector<double>> passes;  // per pass, each expert's share (the row sums to 1)
  std::int64_t rows_per_pass = 0;           // expert rows (tokens x top-k) each pass routed, over the world
  bool empty() const { return passes.empty(); }
  int experts() const { return passes.empty() ? 0 : int(passes.front().size()); }
  // Mean over passes of the busiest of `ep` contiguous expert blocks' share times ep (1: even).
  double busiest_rank_load(int ep) const;
  // Mean over passes of the busiest expert's share times the expert count.
  double imbalance() const;
};

// The shares of one pass from its per-expert row counts; empty when no row was routed.
std::vector<double> shares_of(const std::vector<std::int64_t>& rows);

// Why `shares` cannot describe a model of `experts` routed experts ("" when it can): the rows'
// lengths, negative or non-finite shares, rows that do not sum to 1.
std::string expert_shares_problem(const ExpertShares& shares, int experts);

}  // namespace tedsim
