// tedsim profile show FILE / tedsim profile diff A B: read measured profiles (cost model only).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "calibration_commands.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/profile/collective_table.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/report/html_reports.hpp"
#include "tedsim/report/text_table.hpp"

namespace tedsim::cli {
namespace {

std::string fixed2(double v, int prec) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", prec, v);
  return buf;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out.empty() ? "-" : out;
}

// The calibration's arguments as "key=value ..." (the JSON the resume check compares).
std::string calibration_arguments(const std::string& calibration_json) {
  if (calibration_json.empty()) return "-";
  const nlohmann::json j = nlohmann::json::parse(calibration_json, nullptr, false);
  if (j.is_discarded() || !j.contains("arguments")) return calibration_json;
  std::string text;
  for (const auto& [key, value] : j["arguments"].items())
    text += (text.empty() ? "" : " ") + key + "=" + (value.is_string() ? value.get<std::string>() : value.dump());
  return text;
}

int run_show(const std::string& path, const std::string& html) {
  const ProfileData d = load_profile_data(path);
  const Provenance& p = d.provenance;
  std::ostream& out = std::cout;
  TextTable prov({"provenance", ""});
  prov.align_left();
  prov.add_row({"file", path + (d.complete ? "" : " (INCOMPLETE: a partial calibration)")});
  prov.add_row({"hosts", join(p.hosts)});
  prov.add_row({"devices", join(p.devices)});
  prov.add_row({"backend", p.backend + ", " + std::to_string(p.ranks) + " ranks, " + std::to_string(p.ranks_per_node) + " per host"});
  prov.add_row({"cpu", p.cpu_model.empty() ? "-" : p.cpu_model});
  prov.add_row({"driver / cuda / cublas", (p.driver.empty() ? "-" : p.driver) + " / " + (p.cuda.empty() ? "-" : p.cuda) +
                                              " / " + (p.cublas.empty() ? "-" : p.cublas)});
  prov.add_row({"nccl / mpi", (p.nccl.empty() ? "-" : p.nccl) + " / " + (p.mpi.empty() ? "-" : p.mpi)});
  prov.add_row({"date", p.date});
  prov.add_row({"tedsim", p.tedsim_version + " (" + p.build_flags + ")"});
  prov.print(out);
  out << "calibrated with: " << calibration_arguments(d.calibration_json) << "\n\n";

  TextTable g({"m", "n", "k", "batch", "dtype", "median us", "min us", "max us", "TFLOP/s"});
  for (const GemmPoint& x : d.gemms)
    g.add_row({std::to_string(x.shape.m), std::to_string(x.shape.n), std::to_string(x.shape.k),
               std::to_string(x.shape.batch) + (x.shape.grouped ? " grouped" : ""), to_string(x.shape.dtype), fixed2(x.seconds.median_s * 1e6, 1), fixed2(x.seconds.min_s * 1e6, 1),
               fixed2(x.seconds.max_s * 1e6, 1), fixed2(x.shape.flops() / x.seconds.median_s / 1e12, 4)});
  out << "# GEMMs: " << d.gemms.size() << " points\n";
  g.print(out);
  out << '\n';
  TextTable k({"kernel", "dtype", "bytes", "median us", "min us", "max us", "GB/s"});
  for (const KernelPoint& x : d.kernels)
    k.add_row({to_string(x.kind), to_string(x.dtype), fixed2(x.bytes, 0), fixed2(x.seconds.median_s * 1e6, 1),
               fixed2(x.seconds.min_s * 1e6, 1), fixed2(x.seconds.max_s * 1e6, 1), fixed2(x.bytes / x.seconds.median_s / 1e9, 2)});
  out << "# kernels: " << d.kernels.size() << " points\n";
  k.print(out);
  out << '\n';
  TextTable c({"op", "group", "dtype", "size", "time us", "min us", "max us", "algbw GB/s", "busbw GB/s"});
  for (const CollectivePoint& x : d.collectives)
    c.add_row({to_string(x.op), describe_span(x.span), to_string(x.dtype), fixed2(x.bytes, 0),
               fixed2(x.seconds.median_s * 1e6, 2), fixed2(x.seconds.min_s * 1e6, 2), fixed2(x.seconds.max_s * 1e6, 2),
               fixed2(x.bytes / x.seconds.median_s / 1e9, 3), fixed2(x.busbw_gbs, 3)});
  out << "# collectives: " << d.collectives.size() << " points\n";
  c.print(out);
  if (!d.expert_shares.empty()) {
    // What predictions for this model take the busiest expert rank's load from, by expert degree.
    const ExpertShares& x = d.expert_shares;
    out << "\n# routing of the step's tokens by model '" << x.model << "': " << x.passes.size()
        << " MoE layer passes of " << x.rows_per_pass << " rows; busiest expert " << fixed2(x.imbalance(), 3)
        << "x the mean (mean over passes)\n";
    TextTable r({"expert ranks", "busiest rank / mean rank"});
    for (int ep = 2; ep <= x.experts(); ep *= 2)
      if (x.experts() % ep == 0) r.add_row({std::to_string(ep), fixed2(x.busiest_rank_load(ep), 3)});
    r.print(out);
  }
  if (!html.empty()) {  // the file parsed above, so it is valid JSON
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    write_html_report(html, {nlohmann::json::parse(text.str())}, {path});
    out << "report: " << html << " (open it in a browser; it fetches nothing)\n";
  }
  return 0;
}

int run_diff(const std::string& a_path, const std::string& b_path) {
  const ProfileData a = load_profile_data(a_path), b = load_profile_data(b_path);
  const auto index = [](const ProfileData& d) {
    std::map<std::string, std::pair<std::string, double>> m;  // key -> (category, median)
    for (const auto& x : d.gemms) m[point_key(x)] = {"gemm", x.seconds.median_s};
    for (const auto& x : d.kernels) m[point_key(x)] = {"kernel", x.seconds.median_s};
    for (const auto& x : d.collectives) m[point_key(x)] = {"collective", x.seconds.median_s};
    return m;
  };
  const auto ia = index(a), ib = index(b);
  TextTable t({"point", "A us", "B us", "B/A"});
  t.align_left();
  struct Summary {
    int n = 0;
    double log_sum = 0, lo = 1e300, hi = 0;
  };
  std::map<std::string, Summary> summary;
  int only_a = 0, only_b = 0;
  for (const auto& [key, va] : ia) {
    auto it = ib.find(key);
    if (it == ib.end()) {
      ++only_a;
      continue;
    }
    const double r = va.second > 0 ? it->second.second / va.second : 0;
    t.add_row({key, fixed2(va.second * 1e6, 2), fixed2(it->second.second * 1e6, 2), fixed2(r, 3)});
    Summary& s = summary[va.first];
    ++s.n;
    if (r > 0) s.log_sum += std::log(r);
    s.lo = std::min(s.lo, r);
    s.hi = std::max(s.hi, r);
  }
  for (const auto& [key, vb] : ib) only_b += !ia.count(key);
  std::cout << "A: " << a_path << " (" << join(a.provenance.hosts) << ", " << a.provenance.date << ")\n"
            << "B: " << b_path << " (" << join(b.provenance.hosts) << ", " << b.provenance.date << ")\n\n";
  t.print(std::cout);
  std::cout << '\n';
  TextTable s({"category", "common points", "geomean B/A", "min B/A", "max B/A"});
  for (const auto& [cat, x] : summary)
    s.add_row({cat, std::to_string(x.n), fixed2(std::exp(x.log_sum / std::max(1, x.n)), 3), fixed2(x.lo, 3), fixed2(x.hi, 3)});
  s.print(std::cout);
  std::cout << only_a << " points only in A, " << only_b << " only in B\n";
  return 0;
}

}  // namespace

void register_profile(CLI::App& app, Action& action) {
  CLI::App* cmd = app.add_subcommand("profile", "inspect measured profiles (written by tedsim calibrate) and what a profile says a collective costs");
  cmd->require_subcommand(1);
  auto file = std::make_shared<std::string>();
  CLI::App* show = cmd->add_subcommand("show", "provenance and every measured point of a profile");
  auto html = std::make_shared<std::string>();
  show->add_option("FILE", *file, "profile file")->required();
  show->add_option("--html", *html, "also write the profile's plots as a self-contained HTML report");
  show->callback([file, html, &action] { action = [file, html] { return run_show(*file, *html); }; });
  auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>();
  CLI::App* diff = cmd->add_subcommand("diff", "ratio B/A of every point two profiles share, and a summary");
  diff->add_option("A", *a, "first profile")->required();
  diff->add_option("B", *b, "second profile")->required();
  diff->callback([a, b, &action] { action = [a, b] { return run_diff(*a, *b); }; });
  register_profile_collective(*cmd, action);
}

}  // namespace tedsim::cli
