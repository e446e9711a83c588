#include "tedsim/spec/data_files.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>

#include "tedsim/core/build_info.hpp"
#include "tedsim/core/error.hpp"

namespace tedsim {
namespace fs = std::filesystem;

std::string data_dir() {
  if (const char* env = std::getenv("TEDSIM_DATA_DIR"); env && *env) return env;
  return build_info::data_dir;
}

std::vector<std::string> shipped_names(const std::string& kind) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(fs::path(data_dir()) / kind, ec))
    if (entry.path().extension() == ".yaml") names.push_back(entry.path().stem().string());
  // Shipped Hugging Face configs: models/hf/NAME/config.json, named hf/NAME.
  for (const auto& entry : fs::directory_iterator(fs::path(data_dir()) / kind / "hf", ec))
    if (fs::is_regular_file(entry.path() / "config.json", ec)) names.push_back("hf/" + entry.path().filename().string());
  // The models of published measurements (scripts/published-results.sh): models/published/NAME.yaml.
  for (const auto& entry : fs::directory_iterator(fs::path(data_dir()) / kind / "published", ec))
    if (entry.path().extension() == ".yaml") names.push_back("published/" + entry.path().stem().string());
  std::sort(names.begin(), names.end());
  return names;
}

std::string resolve_data_file(const std::string& kind, const std::string& name_or_path) {
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return name_or_path;
  if (kind == "models" && fs::is_directory(name_or_path, ec)) return name_or_path;  // a folder with config.json
  if (name_or_path.rfind("hf/", 0) == 0) {
    const fs::path hf = fs::path(data_dir()) / kind / name_or_path / "config.json";
    if (fs::is_regular_file(hf, ec)) return hf.string();
  }
  const fs::path shipped = fs::path(data_dir()) / kind / (name_or_path + ".yaml");
  const bool plain_name = name_or_path.find('/') == std::string::npos;
  const bool published = name_or_path.rfind("published/", 0) == 0 && name_or_path.find('/', 10) == std::string::npos &&
                         name_or_path.find("..") == std::string::npos;
  if ((plain_name || published) && fs::is_regular_file(shipped, ec)) return shipped.string();
  std::string known;
  for (const auto& n : shipped_names(kind)) known += (known.empty() ? "" : ", ") + n;
  std::string singular = kind.substr(0, kind.size() - 1);
  throw InputError(name_or_path + ": no such file, and no shipped " + singular + " of that name (shipped: " +
                   (known.empty() ? "none found under " + data_dir() : known) + ")");
}

}  // namespace tedsim
