// Measured profile JSON (written by calibrate): the strict reader, then lookups through it.
#include "fuzz_common.hpp"
#include "tedsim/profile/measured_profile.hpp"
#include "tedsim/spec/data_files.hpp"
#include "tedsim/spec/topology_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  static const TopologySpec topology = load_topology(resolve_data_file("topologies", "local-cpu"));
  fuzz::expect_only_input_errors([&] {
    ProfileData d = profile_from_json(fuzz::text_of(data, size), "profile.json");
    const MeasuredProfile p(std::move(d), topology, "profile.json");
    p.gemm_seconds(GemmShape{256, 256, 256, 1, Dtype::fp32});
    p.kernel_seconds(KernelKind::gating, 1 << 16, Dtype::fp32);
    GroupSpan span;
    span.ranks = 2;
    span.nodes = 1;
    span.max_ranks_per_node = 2;
    p.collective_seconds(CollectiveOp::all_to_all, span, 1 << 16);
    p.warnings();
  });
  return 0;
}
