#include "tedsim/report/vega_library.hpp"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "tedsim/core/error.hpp"

#ifndef TEDSIM_VEGA_DIR
#define TEDSIM_VEGA_DIR "/usr/share/javascript/vega"
#endif

namespace tedsim {
namespace {

// The modules a Vega spec of axes, scales, legends, data transforms and SVG marks needs, each after
// the ones it requires. (file, module name its dependants ask for)
const std::vector<std::pair<const char*, const char*>>& modules() {
  static const std::vector<std::pair<const char*, const char*>> list = {
      {"vega-util", "vega-util"},
      {"vega-time", "vega-time"},
      {"vega-format", "vega-format"},
      {"vega-loader", "vega-loader"},
      {"vega-dataflow", "vega-dataflow"},
      {"vega-scale", "vega-scale"},
      {"vega-canvas", "vega-canvas"},
      {"vega-scenegraph", "vega-scenegraph"},
      {"vega-statistics", "vega-statistics"},
      {"vega-expression", "vega-expression"},
      {"vega-selection", "vega-selections"},  // the package is vega-selections, the file vega-selection
      {"vega-event-selector", "vega-event-selector"},
      {"vega-functions", "vega-functions"},
      {"vega-runtime", "vega-runtime"},
      {"vega-view", "vega-view"},
      {"vega-parser", "vega-parser"},
      {"vega-transforms", "vega-transforms"},
      {"vega-view-transforms", "vega-view-transforms"},
      {"vega-encode", "vega-encode"},
  };
  return list;
}

std::string read_module(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InputError("--html needs Vega: cannot read " + path +
                     " (Debian package libjs-vega, installed by scripts/install-deps.sh; or set TEDSIM_VEGA_DIR to a "
                     "folder holding Vega 5's module builds)");
  std::ostringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  // A literal "</script" inside a script would end the element early.
  for (std::size_t at = 0; (at = text.find("</script", at)) != std::string::npos; at += 9) text.replace(at, 8, "<\\/script");
  return text;
}

}  // namespace

std::string vega_directory() {
  if (const char* dir = std::getenv("TEDSIM_VEGA_DIR"); dir && *dir) return dir;
  return TEDSIM_VEGA_DIR;
}

std::string inline_vega_scripts() {
  const std::string dir = vega_directory();
  std::string out =
      "<script>(function(){const loaded={};window.__tedsimVegaModules=loaded;window.__tedsimVegaName=null;\n"
      "window.define=function(deps,factory){const exports={};\n"
      "  factory.apply(null,deps.map(d=>{if(d==='exports')return exports;if(!(d in loaded))throw Error('Vega module '+d+' "
      "is not loaded');return loaded[d];}));\n"
      "  loaded[window.__tedsimVegaName]=exports;};\n"
      "window.define.amd=true;})();</script>\n";
  for (const auto& [file, name] : modules()) {
    out += "<script>window.__tedsimVegaName='" + std::string(name) + "';</script>\n<script>";
    out += read_module(dir + "/" + file + ".min.js");
    out += "</script>\n";
  }
  out +=
      "<script>(function(){const loaded=window.__tedsimVegaModules;const vega={};\n"
      "for(const name in loaded)Object.assign(vega,loaded[name]);\n"
      "vega.extend(vega.transforms,loaded['vega-transforms'],loaded['vega-view-transforms'],loaded['vega-encode']);\n"
      "window.vega=vega;delete window.define;delete window.__tedsimVegaModules;delete window.__tedsimVegaName;})();"
      "</script>\n";
  return out;
}

}  // namespace tedsim
