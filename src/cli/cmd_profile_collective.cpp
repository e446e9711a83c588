// tedsim profile collective: what the profile (analytic, or measured with --profile) says one
// collective on one group costs, size by size, beside the bandwidths nccl-tests and DeepEP report,
// so the link model can be held against published benchmark numbers.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "calibration_commands.hpp"
#include "tedsim/core/atomic_file.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/profile/collective_table.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/report/text_table.hpp"
#include "tedsim/spec/data_files.hpp"

namespace tedsim::cli {
namespace {

struct CollectiveQuery {
  std::string topology, profile, op, json;
  int ranks = 0, ranks_per_node = 0;
  std::vector<double> bytes;
};

std::string number(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

int run_collective(const CollectiveQuery& q) {
  const TopologySpec topology = load_topology(resolve_data_file("topologies", q.topology));
  const CollectiveOp op = parse_collective_op(q.op);
  if (q.ranks < 2) throw InputError("--ranks: a collective needs at least 2 ranks, got " + std::to_string(q.ranks));
  const int per_node = q.ranks_per_node > 0 ? q.ranks_per_node : topology.devices_per_node;
  if (per_node > topology.devices_per_node)
    throw InputError("--ranks-per-node " + std::to_string(per_node) + ": topology '" + topology.name + "' has " +
                     std::to_string(topology.devices_per_node) + " devices per node");
  std::unique_ptr<Profile> profile =
      q.profile.empty() ? std::make_unique<AnalyticProfile>(topology) : load_profile(q.profile, topology);
  // One group filling nodes in order: the group of a plan whose kind spans these ranks.
  GroupSpan span;
  span.ranks = q.ranks;
  span.max_ranks_per_node = std::min(q.ranks, per_node);
  span.nodes = (q.ranks + per_node - 1) / per_node;
  span.groups_per_node = 1;
  const double factor = bus_bandwidth_factor(op, q.ranks);
  // DeepEP's "bottleneck bandwidth" of an all-to-all: the bytes each GPU sends over its slowest
  // link level (the NIC across nodes, NVLink inside one) over the time.
  const double bottleneck_share = span.nodes > 1 ? double(q.ranks - span.max_ranks_per_node) / q.ranks
                                                 : double(span.max_ranks_per_node - 1) / q.ranks;
  TextTable table({"bytes", "time us", "algbw GB/s", "busbw GB/s", op == CollectiveOp::all_to_all ? "bottleneck GB/s" : ""});
  nlohmann::json rows = nlohmann::json::array();
  for (double bytes : q.bytes) {
    if (!(bytes > 0)) throw InputError("--bytes: expected positive sizes, got " + number(bytes, 0));
    // send_recv answers as the cost model asks it: the pipeline's p2p between a pair of ranks.
    const double t = op == CollectiveOp::send_recv ? profile->p2p_seconds(span, bytes)
                                                   : profile->collective_seconds(op, span, bytes);
    const double algbw = bytes / t / 1e9, busbw = algbw * factor, bottleneck = bytes * bottleneck_share / t / 1e9;
    table.add_row({number(bytes, 0), number(t * 1e6, 1), number(algbw, 2), number(busbw, 2),
                   op == CollectiveOp::all_to_all ? number(bottleneck, 2) : ""});
    rows.push_back({{"bytes", bytes}, {"seconds", t}, {"algbw_gbs", algbw}, {"busbw_gbs", busbw}, {"bottleneck_gbs", bottleneck}});
  }
  std::ostream& out = q.json == "-" ? std::cerr : std::cout;
  out << to_string(op) << " on " << q.ranks << " ranks over " << span.nodes << " node(s) of " << topology.name << " ("
      << span.max_ranks_per_node << " per node), " << profile->describe() << "\n";
  table.print(out);
  print_profile_warnings(out, *profile);
  if (!q.json.empty()) {
    const nlohmann::json doc = {{"kind", "collective"}, {"op", to_string(op)}, {"ranks", q.ranks}, {"nodes", span.nodes},
                                {"ranks_per_node", span.max_ranks_per_node}, {"topology", topology.name},
                                {"profile", profile->describe()}, {"sizes", rows}};
    if (q.json == "-") std::cout << doc.dump(1) << "\n";
    else write_file_atomically(q.json, doc.dump(1) + "\n");
  }
  return 0;
}

}  // namespace

void register_profile_collective(CLI::App& profile_cmd, Action& action) {
  auto q = std::make_shared<CollectiveQuery>();
  CLI::App* cmd = profile_cmd.add_subcommand(
      "collective", "what one collective on one group costs, size by size (time, algbw, busbw, all-to-all bottleneck)");
  cmd->add_option("--topology", q->topology, "shipped topology name or path to a topology YAML")->required();
  cmd->add_option("--profile", q->profile, "measured profile (default: the topology's analytic profile)");
  cmd->add_option("--op", q->op, "all_reduce, all_gather, reduce_scatter, all_to_all, all_to_all_v (dropless: the busiest rank's exchange) or send_recv (pipeline p2p)")->required();
  cmd->add_option("--ranks", q->ranks, "ranks in the group")->required();
  cmd->add_option("--ranks-per-node", q->ranks_per_node, "ranks on one node (default: the topology's devices per node)");
  cmd->add_option("--bytes", q->bytes, "sizes in nccl-tests' convention (per-rank buffer; all-to-all: the whole send buffer)")
      ->delimiter(',')
      ->required();
  cmd->add_option("--json", q->json, "write JSON to FILE, or - for stdout (the table then goes to stderr)");
  cmd->callback([q, &action] { action = [q] { return run_collective(*q); }; });
}

}  // namespace tedsim::cli
