// Every shipped topology loads under the strict reader, and every efficiency curve in it carries
// its source: the comment right above the curve's key says where its points come from.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_helpers.hpp"

namespace tedsim {
namespace {

std::vector<std::filesystem::path> shipped_topologies() {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(TEDSIM_SOURCE_DIR) / "topologies"))
    if (entry.path().extension() == ".yaml") files.push_back(entry.path());
  return files;
}

TEST(ShippedTopologies, EveryOneLoadsAndEveryCurveNamesItsSource) {
  const std::vector<std::filesystem::path> files = shipped_topologies();
  ASSERT_GE(files.size(), 10u);
  bool saw_nvl72 = false;
  for (const auto& file : files) {
    const TopologySpec t = load_topology(file.string());
    EXPECT_GE(t.devices_per_node, 1) << file;
    saw_nvl72 |= t.name == "gb200-nvl72";
    std::ifstream in(file);
    std::string line, previous;
    int curves = 0;
    while (std::getline(in, line)) {
      const auto key = line.find_first_not_of(' ');
      for (const char* curve : {"gemm_by_flops:", "gemm_by_min_dim:", "memory_by_bytes:"})
        if (key != std::string::npos && line.compare(key, std::string(curve).size(), curve) == 0) {
          ++curves;
          const auto hash = previous.find_first_not_of(' ');
          EXPECT_TRUE(hash != std::string::npos && previous[hash] == '#')
              << file.filename() << ": " << curve << " has no source comment above it";
        }
      if (line.find_first_not_of(' ') != std::string::npos) previous = line;
    }
    if (t.is_gpu()) EXPECT_EQ(curves, 3) << file.filename() << ": a GPU topology fits all three curves";
  }
  EXPECT_TRUE(saw_nvl72);
}

// The rack-sized NVLink domain: 72 GPUs are one node, so EP64 stays on NVLink and 144 GPUs are
// two racks joined by the network.
TEST(ShippedTopologies, Gb200Nvl72KeepsSeventyTwoGpusOnNvlink) {
  test::Bench bench(test::model("gpt-oss-120b"), "gb200-nvl72");
  EXPECT_EQ(bench.topo.devices_per_node, 72);
  EXPECT_DOUBLE_EQ(bench.topo.intra.bandwidth_gbs, 900.0);
  EXPECT_DOUBLE_EQ(bench.topo.inter.bandwidth_gbs, 72 * 50.0);
}

}  // namespace
}  // namespace tedsim
