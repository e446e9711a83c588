// Topology YAML (topologies/*.yaml): the loader, then the analytic profile's lookups on it.
#include "fuzz_common.hpp"
#include "tedsim/profile/analytic_profile.hpp"
#include "tedsim/spec/topology_spec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tedsim;
  fuzz::expect_only_input_errors([&] {
    const TopologySpec t = topology_from_yaml_text(fuzz::text_of(data, size), "fuzz.yaml");
    const AnalyticProfile p(t);
    p.gemm_seconds(GemmShape{1024, 1024, 1024, 1, Dtype::fp32});
    p.kernel_seconds(KernelKind::layernorm, 1 << 20, Dtype::fp32);
    GroupSpan span;
    span.ranks = 2 * t.devices_per_node;
    span.nodes = 2;
    span.max_ranks_per_node = t.devices_per_node;
    p.collective_seconds(CollectiveOp::all_reduce, span, 1 << 24);
    p.collective_seconds(CollectiveOp::all_to_all, span, 1 << 20);
  });
  return 0;
}
