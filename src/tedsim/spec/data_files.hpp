#pragma once
// --model and --topology take a shipped name (models/NAME.yaml) or a path to a YAML file.
#include <string>
#include <vector>

namespace tedsim {

// Directory holding models/, topologies/ and configs/: $TEDSIM_DATA_DIR, else the source tree
// this binary was built from.
std::string data_dir();
// A path that exists is returned as is; otherwise `<data_dir>/<kind>/<name>.yaml`; otherwise an
// InputError listing the shipped names.
std::string resolve_data_file(const std::string& kind, const std::string& name_or_path);
std::vector<std::string> shipped_names(const std::string& kind);

}  // namespace tedsim
