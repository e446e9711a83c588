// tedsim scale --gpus 32,64,128,256: the best plan the search finds at each cluster size, with the
// same model, topology, profile and global batch (strong scaling of one job).
#include <iostream>
#include <memory>
#include <thread>

#include "commands.hpp"
#include "inputs.hpp"
#include "progress_bar.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/report/prediction_json.hpp"
#include "tedsim/report/text_table.hpp"
#include "tedsim/search/search.hpp"

namespace tedsim::cli {
namespace {

struct ScaleOptions {
  InputOptions in;
  std::vector<int> sizes = {32, 64, 128, 256};
  int threads = 0;
  int max_pp = 0;
  int max_cp = 1;
};

int run_scale(const ScaleOptions& o) {
  if (o.sizes.empty()) throw InputError("--gpus: expected a list of cluster sizes, e.g. 32,64,128");
  for (int g : o.sizes)
    if (g <= 0) throw InputError("--gpus: expected positive cluster sizes, got " + std::to_string(g));
  if (o.threads < 0) throw InputError("--threads: expected a positive count (0: every core), got " + std::to_string(o.threads));
  if (o.max_cp < 1) throw InputError("--max-cp: expected a positive degree (1: no context parallelism), got " + std::to_string(o.max_cp));
  InputOptions first = o.in;
  first.gpus = o.sizes.front();
  Inputs in = load_inputs(first);
  std::ostream& out = human_stream(o.in);
  print_startup_table(out, in, first);
  const Evaluator evaluator(in.model, in.topology, *in.profile);
  const int threads = o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  TextTable table({"devices", "best plan", "iter_s", "tokens/s", "tokens/s/dev", "TFLOP/s/dev", "MFU%", "peak_GiB",
                   "evaluated", "feasible"});
  nlohmann::json sizes = nlohmann::json::array();
  for (int g : o.sizes) {
    SearchSpace space;
    space.gpus = g;
    space.global_batch = o.in.global_batch;
    space.seq_len = o.in.seq_len;
    space.max_pp = o.max_pp;
    space.max_cp = o.max_cp;
    nlohmann::json entry = {{"gpus", g}};
    const std::string why = explain_no_valid_configuration(in.model, space);
    if (!why.empty()) {
      table.add_row({std::to_string(g), "no valid configuration", "", "", "", "", "", "", "0", "0"});
      entry["best"] = nullptr;
      entry["why_none"] = why;
      sizes.push_back(entry);
      continue;
    }
    SearchResult r;
    {
      ProgressBar bar("scale: " + std::to_string(g) + " devices");
      r = run_search(evaluator, space, 1, [&bar](long long done, long long total) { bar.update(done, total); }, threads);
    }
    entry["evaluated"] = r.evaluated;
    entry["feasible"] = r.feasible;
    if (r.top.empty()) {
      table.add_row({std::to_string(g), "none fits in memory", "", "", "", "", "", "", std::to_string(r.evaluated), "0"});
      entry["best"] = nullptr;
    } else {
      const Prediction& p = r.top.front();
      table.add_row({std::to_string(g), p.config.describe(), fixed(p.sim.iteration_s, 4), fixed(p.tokens_per_s, 0),
                     fixed(p.tokens_per_s / g, 1), fixed(p.tflops_per_gpu, 1), fixed(100 * p.mfu, 1),
                     fixed(p.memory.peak / kGiB, 2), std::to_string(r.evaluated), std::to_string(r.feasible)});
      entry["best"] = prediction_json(p, in.model);
    }
    sizes.push_back(entry);
  }
  table.print(out);
  out << "global batch " << o.in.global_batch << " sequences at every size (strong scaling)\n";
  if (!o.in.json.empty() || !o.in.html.empty())
    write_results(o.in, {{"kind", "scale"}, {"global_batch", o.in.global_batch}, {"sizes", sizes}}, in, out);
  return 0;
}

}  // namespace

void register_scale(CLI::App& app, Action& action) {
  auto o = std::make_shared<ScaleOptions>();
  CLI::App* cmd = app.add_subcommand("scale", "the best plan at each cluster size (one search per size)");
  add_input_options(*cmd, o->in);
  cmd->remove_option(cmd->get_option("--gpus"));
  cmd->add_option("--gpus", o->sizes, "cluster sizes, comma-separated")->delimiter(',')->capture_default_str();
  cmd->add_option("--threads", o->threads, "threads sharing each search (default: every core)");
  cmd->add_option("--max-pp", o->max_pp, "largest pipeline degree to consider (default: every divisor)");
  cmd->add_option("--max-cp", o->max_cp, "largest context degree to consider (default 1: none)")->capture_default_str();
  cmd->callback([o, &action] { action = [o] { return run_scale(*o); }; });
}

}  // namespace tedsim::cli
