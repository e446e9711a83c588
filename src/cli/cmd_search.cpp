// tedsim search: rank every valid configuration.
#include <cmath>
#include <iostream>
#include <optional>
#include <thread>
#include <memory>

#include "commands.hpp"
#include "inputs.hpp"
#include "progress_bar.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/core/atomic_file.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/report/text_table.hpp"
#include "tedsim/search/search.hpp"

namespace tedsim::cli {
namespace {

struct SearchOptions {
  InputOptions in;
  int top = 10;
  int threads = 0;  // 0: every core
  int max_pp = 0;
  int max_cp = 1;
  std::string moe_dispatcher = "alltoall";
  std::string adam_moments = "fp32";
  std::string cuda_graph_scope = "none";
  bool fused_grouped_mlp = false;
  bool fp8_attention = false;
  std::string moe_a2a_overlap = "off";
  int moe_a2a_overlap_sms = 20;
  int emit_rank = 1;
  bool all = false;
  std::string csv;
  std::vector<std::string> emit;
};

// The ranking; with `fold`, a plan predicting exactly what the row above it does is folded into a
// note (`notes`) instead of a row of its own.
TextTable ranking_table(const SearchResult& r, bool fold, std::vector<std::string>* notes) {
  TextTable table({"rank", "p", "v", "t", "c", "e", "d", "d_e", "b", "ga", "sp", "recomp", "dtd", "cac", "zero", "etp",
                   "tiled", "layout", "a2ao", "iter_s", "tokens/s", "TFLOP/s/dev", "MFU%", "peak_GiB"});
  auto yn = [](bool b) { return std::string(b ? "on" : "off"); };
  std::size_t shown = 0;
  for (std::size_t i = 0; i < r.top.size(); ++i) {
    const Prediction& p = r.top[i];
    const ParallelConfig& c = p.config;
    if (fold && i > 0 && predicts_the_same(r.top[shown], p)) {
      if (notes)
        notes->push_back("rank " + std::to_string(i + 1) + " (" + c.describe() + ") predicts exactly what rank " +
                         std::to_string(shown + 1) + " does");
      continue;
    }
    shown = i;
    const std::string recompute = c.recompute == Recompute::full ? "full" : c.recompute == Recompute::none ? "none" : "sel";
    table.add_row({std::to_string(i + 1), std::to_string(c.pp), std::to_string(c.vpp), std::to_string(c.tp),
                   std::to_string(c.cp), std::to_string(c.ep), std::to_string(c.dp()), std::to_string(c.dp_expert()),
                   std::to_string(c.micro_batch), std::to_string(c.grad_accum()), yn(c.sequence_parallel), recompute,
                   yn(c.dtd), yn(c.cac), std::to_string(c.zero), yn(c.expert_tp && c.tp > 1),
                   yn(c.tiled_optimizer),
                   c.layout == RankLayout::ted ? "ted" : c.layout == RankLayout::data_before_expert ? "dbe" : "fold",
                   yn(c.moe_a2a_overlap),
                   fixed(p.sim.iteration_s, 4),
                   fixed(p.tokens_per_s, 0), fixed(p.tflops_per_gpu, 1), fixed(100 * p.mfu, 1),
                   fixed(p.memory.peak / kGiB, 2)});
  }
  return table;
}

// For each choice the best plan turns on: what the best plan without it costs. The first line is
// the heading.
std::vector<std::string> why_this_plan(const SearchResult& r, bool moe_model) {
  std::vector<std::string> lines;
  if (r.top.empty()) return lines;
  const Prediction& best = r.top.front();
  lines.push_back("why this plan (" + best.config.describe() + ", " + human_seconds(best.sim.iteration_s) +
                  " per iteration):");
  for (int k = 0; k < kKnobCount; ++k) {
    if (!knob_on(best.config, Knob(k), moe_model)) continue;
    const std::optional<Prediction>& w = r.without[std::size_t(k)];
    std::string line = "  " + std::string(knob_name(Knob(k))) + ": ";
    if (!w) {
      lines.push_back(line + "without it no configuration fits in memory");
      continue;
    }
    const double dt = w->sim.iteration_s - best.sim.iteration_s;
    if (std::fabs(dt) <= 1e-9 * best.sim.iteration_s)
      line += "no difference in time (a tie broken by rank order)";
    else
      line += (dt >= 0 ? "saves " : "costs ") + human_seconds(std::fabs(dt)) + " per iteration (" +
              fixed(100 * std::fabs(dt) / w->sim.iteration_s, 1) + "%)";
    line += "; the best plan without it: " + w->config.describe() + ", " + human_seconds(w->sim.iteration_s) + ", peak " +
            fixed(w->memory.peak / kGiB, 2) + " GiB (this plan " + fixed(best.memory.peak / kGiB, 2) + ")";
    lines.push_back(line);
  }
  if (lines.size() == 1) lines.push_back("  it turns on none of the options; each would make it slower or not fit");
  return lines;
}

int run_search_command(const SearchOptions& o) {
  if (o.top <= 0) throw InputError("--top: expected a positive count, got " + std::to_string(o.top));
  if (!o.emit.empty() && o.emit[0] != "megatron" && o.emit[0] != "deepspeed")
    throw InputError("--emit: expected megatron or deepspeed, got '" + o.emit[0] + "'");
  if (o.emit_rank <= 0) throw InputError("--rank: expected a positive rank, got " + std::to_string(o.emit_rank));
  Inputs in = load_inputs(o.in);
  std::ostream& out = human_stream(o.in);
  print_startup_table(out, in, o.in);
  const Evaluator evaluator(in.model, in.topology, *in.profile);
  SearchSpace space;
  space.gpus = o.in.gpus;
  space.global_batch = o.in.global_batch;
  space.seq_len = o.in.seq_len;
  space.max_pp = o.max_pp;
  if (o.max_cp < 1) throw InputError("--max-cp: expected a positive degree (1: no context parallelism), got " + std::to_string(o.max_cp));
  space.max_cp = o.max_cp;
  space.moe_dispatcher = parse_moe_dispatcher(o.moe_dispatcher);
  space.adam_moments = parse_adam_moments(o.adam_moments);
  space.cuda_graph_scopes = parse_cuda_graph_scopes(o.cuda_graph_scope);
  space.fused_grouped_mlp = o.fused_grouped_mlp;
  check_fused_grouped_mlp(o.fused_grouped_mlp, in.topology);
  space.fp8_attention = o.fp8_attention;
  check_fp8_attention(o.fp8_attention, in.topology);
  if (o.moe_a2a_overlap == "off")
    space.a2a_overlap = {false};
  else if (o.moe_a2a_overlap == "on")
    space.a2a_overlap = {true};
  else if (o.moe_a2a_overlap == "both")
    space.a2a_overlap = {false, true};
  else
    throw InputError("--moe-a2a-overlap: expected off, on or both, got '" + o.moe_a2a_overlap + "'");
  if (o.moe_a2a_overlap_sms <= 0)
    throw InputError("--moe-a2a-overlap-sms: expected a positive SM count, got " + std::to_string(o.moe_a2a_overlap_sms));
  space.a2a_overlap_sms = o.moe_a2a_overlap_sms;
  if (o.threads < 0) throw InputError("--threads: expected a positive count (0: every core), got " + std::to_string(o.threads));
  if (o.max_pp < 0) throw InputError("--max-pp: expected a positive degree (0: every divisor), got " + std::to_string(o.max_pp));
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  // Divisibility, not memory, empties a space: say which rule, and the batches that would work.
  const std::string why = explain_no_valid_configuration(in.model, space);
  if (!why.empty()) throw InputError(why);
  SearchResult r;
  {
    ProgressBar bar("search");
    // The HTML report plots every feasible configuration, so each is evaluated in full.
    r = run_search(
        evaluator, space, o.top, [&bar](long long done, long long total) { bar.update(done, total); }, threads,
        !o.in.html.empty());
  }
  std::vector<std::string> folded;
  const TextTable table = ranking_table(r, !o.all, &folded);
  table.print(out);
  for (const std::string& note : folded) out << "  " << note << " (--all shows it)\n";
  print_profile_warnings(out, *in.profile);
  std::optional<std::pair<double, double>> spread;
  if (!r.top.empty()) {
    print_far_lookup_share(out, in, r.top.front().config, r.top.front().sim.iteration_s);
    spread = print_prediction_range(out, in, r.top.front().config, r.top.front().sim.iteration_s);
  }
  print_profile_mismatches(out, in, o.in, JobIdentity{});
  out << "evaluated " << r.evaluated << ", feasible " << r.feasible << ", "
      << fixed(r.seconds > 0 ? r.evaluated / r.seconds : 0.0, 0) << " evaluations/s, " << fixed(r.seconds, 3) << " s\n";
  const std::vector<std::string> why_lines = why_this_plan(r, in.model.is_moe());
  for (const std::string& line : why_lines) out << line << "\n";
  if (r.feasible == 0 && r.smallest_peak > 0)
    out << "no configuration fits in device memory: the smallest peak is " << fixed(r.smallest_peak / kGiB, 2)
        << " GiB against " << fixed(r.capacity / kGiB, 2)
        << " GiB usable; try more devices, a smaller global batch or fewer experts\n";
  if (!o.emit.empty()) {
    if (o.emit_rank > int(r.top.size()))
      throw InputError("--rank " + std::to_string(o.emit_rank) + ": the search ranked only " + std::to_string(r.top.size()) +
                       " configurations (raise --top)");
    write_launch_files(o.emit, in, r.top[std::size_t(o.emit_rank - 1)], out);
  }
  if (!o.csv.empty()) write_file_atomically(o.csv, ranking_table(r, false, nullptr).csv());
  if (!o.in.json.empty() || !o.in.html.empty()) {
    nlohmann::json doc = search_json(r, in.model);
    doc["why"] = why_lines;
    if (spread) doc["best_iteration_time_s_range"] = {spread->first, spread->second};
    write_results(o.in, doc, in, out);
  }
  return 0;
}

}  // namespace

void register_search(CLI::App& app, Action& action) {
  auto o = std::make_shared<SearchOptions>();
  CLI::App* cmd = app.add_subcommand("search", "rank every valid configuration by predicted throughput");
  add_input_options(*cmd, o->in);
  cmd->add_option("--top", o->top, "configurations to show")->capture_default_str();
  cmd->add_option("--csv", o->csv, "write the ranking table as CSV");
  cmd->add_option("--threads", o->threads, "threads sharing the search (default: every core; same result for any count)");
  cmd->add_option("--max-pp", o->max_pp, "largest pipeline degree to consider (default: every divisor of --gpus)");
  cmd->add_option("--max-cp", o->max_cp,
                  "largest context degree to consider: each sequence split over up to this many ranks (Megatron-Core's "
                  "--context-parallel-size; default 1: none)")
      ->capture_default_str();
  cmd->add_option("--moe-dispatcher", o->moe_dispatcher,
                  "how every plan's tokens reach their experts: alltoall (every token-expert pair) or flex "
                  "(DeepEP/HybridEP: once per destination GPU and node)")
      ->capture_default_str();
  cmd->add_option("--adam-moments", o->adam_moments, "every plan's Adam moments: fp32 or bf16 (master weights stay fp32)")
      ->capture_default_str();
  cmd->add_option("--cuda-graph-scope", o->cuda_graph_scope,
                  "every plan's CUDA-graph scopes: none, full_iteration, or a list of attn, mlp, moe_router, "
                  "moe_preprocess")
      ->capture_default_str();
  cmd->add_flag("--fused-grouped-mlp", o->fused_grouped_mlp,
                "every plan's experts as Transformer Engine's fused grouped MLP (MXFP8 on Blackwell; plans with expert "
                "TP are left out)");
  cmd->add_flag("--fp8-attention", o->fp8_attention,
                "every plan's fused attention core in FP8 (Megatron-Core's --fp8-dot-product-attention), from the "
                "topology's measured flash_fp8_* tables");
  cmd->add_option("--moe-a2a-overlap", o->moe_a2a_overlap,
                  "expert all-to-all overlap (Megatron-Core's --overlap-moe-expert-parallel-comm): off, on (every plan "
                  "Megatron-Core allows it in: ep > 1, vpp > 1 with pipelines, no full recompute) or both")
      ->capture_default_str();
  cmd->add_option("--moe-a2a-overlap-sms", o->moe_a2a_overlap_sms,
                  "SMs the overlapped all-to-all kernels hold (Megatron-Core's --moe-deepep-num-sms)")
      ->capture_default_str();
  add_emit_option(*cmd, o->emit);
  cmd->add_option("--rank", o->emit_rank, "with --emit: the plan of this rank of the table")->capture_default_str();
  cmd->add_flag("--all", o->all, "show plans that predict exactly what the row above does (folded by default)");
  cmd->callback([o, &action] { action = [o] { return run_search_command(*o); }; });
}

}  // namespace tedsim::cli
