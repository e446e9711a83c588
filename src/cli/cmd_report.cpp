// tedsim report RESULT.json... --html FILE: one HTML report from saved results (the JSON that
// search, simulate, validate and scale write with --json, and profiles written by calibrate).
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.hpp"
#include "tedsim/core/error.hpp"
#include "tedsim/report/html_reports.hpp"

namespace tedsim::cli {
namespace {

struct ReportOptions {
  std::vector<std::string> files;
  std::string html;
};

nlohmann::json read_result(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read the file");
  std::ostringstream text;
  text << in.rdbuf();
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded()) throw InputError(path + ": not valid JSON (expected a result written with --json, or a profile)");
  if (report_kind(doc).empty())
    throw InputError(path + ": not a tedsim result: expected the JSON of search, simulate, validate or scale "
                     "(--json FILE) or a profile (tedsim calibrate)");
  return doc;
}

int run_report(const ReportOptions& o) {
  std::vector<nlohmann::json> docs;
  for (const std::string& f : o.files) docs.push_back(read_result(f));
  write_html_report(o.html, docs, o.files);
  std::cout << "report: " << o.html << " (" << docs.size() << (docs.size() == 1 ? " result" : " results")
            << "; open it in a browser; it fetches nothing)\n";
  return 0;
}

}  // namespace

void register_report(CLI::App& app, Action& action) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* cmd = app.add_subcommand("report", "build one HTML report from saved results (--json files, profiles)");
  cmd->add_option("RESULT", o->files, "JSON written by search/simulate/validate/scale --json, or a profile")->required();
  cmd->add_option("--html", o->html, "the HTML file to write")->required();
  cmd->callback([o, &action] { action = [o] { return run_report(*o); }; });
}

}  // namespace tedsim::cli
