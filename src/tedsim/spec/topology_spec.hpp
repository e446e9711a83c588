#pragma once
// A cluster of identical nodes, as read from topologies/*.yaml: the device, how devices connect
// inside a node and across nodes, and the efficiency curves the analytic profile applies to the
// datasheet peaks (efficiency is data, not code).
#include <string>
#include <utility>
#include <vector>

#include "tedsim/core/units.hpp"

namespace tedsim {

using Curve = std::vector<std::pair<double, double>>;  // (x, y) points, x strictly increasing

struct DeviceSpec {
  std::string kind;               // "gpu" or "cpu"
  std::string name;
  double memory_gib = 0;          // per device (per rank on CPU)
  double reserved_gib = 0;        // runtime context, allocator slack: not available to tedsim's model
  double peak_tflops[kDtypeCount] = {0, 0, 0, 0};  // indexed by Dtype; 0 = unsupported
  double memory_bandwidth_gbs = 0;
  double kernel_launch_us = 0;    // fixed cost of every kernel
  // How FP8 training scales its tensors on this device, as Transformer Engine runs it: per-tensor
  // current scaling (Hopper) or MXFP8 block scaling (Blackwell). It sets the bytes of the
  // quantization kernels around each FP8 GEMM (Profile::fp8_quantize).
  Fp8Recipe fp8_recipe = Fp8Recipe::tensor;
  // Streaming multiprocessors (optional; 0: not given): what a kernel that holds some of them
  // leaves to the compute it overlaps (the expert all-to-all overlap, sim/overlapped_pair.hpp).
  int sms = 0;
  double peak_tflops_of(Dtype d) const { return peak_tflops[int(d)]; }
};

struct LinkSpec {
  double bandwidth_gbs = 0;       // intra: per device, one direction; inter: per node, all NICs
  double latency_us = 0;
  double efficiency = 1.0;        // fraction of bandwidth collectives achieve (bus bandwidth)
};

// How the analytic profile of this machine did against the published measurements of it
// (scripts/published-results.sh, which checks these numbers against its report): the throughput
// error (predicted - published) / published over its rows, lowest and highest.
struct PublishedError {
  int rows = 0;  // 0: no published measurement of this machine is re-simulated
  double min = 0, max = 0;
};

// Measured throughput of the attention core on this device (optional): TFLOP/s by sequence
// length, causal, bf16/fp16, as FlashAttention's benchmark counts FLOPs (forward 4 b s^2 heads d,
// halved for causal masks; backward 2.5x, forward + backward 3.5x the forward's), for head
// dimensions 64 and 128 ([0] and [1]; an empty curve where no measurement exists).
struct AttentionRates {
  static constexpr int kHeadDims[2] = {64, 128};
  Curve flash_forward[2], flash_backward[2];  // fused (FlashAttention / cuDNN)
  Curve unfused[2];                           // unfused (batched GEMM, softmax, batched GEMM), forward + backward
  Curve fp8_forward[2], fp8_backward[2];      // the fused kernel in FP8 (optional)
  bool has_flash() const { return !flash_forward[0].empty() || !flash_forward[1].empty(); }
  bool has_fp8() const { return !fp8_forward[0].empty() || !fp8_forward[1].empty(); }
  bool has_unfused() const { return !unfused[0].empty() || !unfused[1].empty(); }
};

// The host CPU that drives each GPU (optional): how long the training framework (PyTorch with
// Transformer Engine, eager) spends on the host per call that launches device work. A stream the
// host cannot keep fed waits on it (model/host_launch.hpp). 0: launches are free on the host.
struct HostSpec {
  std::string cpu;
  double framework_op_us = 0;
};

struct TopologySpec {
  std::string name;
  std::string source;
  DeviceSpec device;
  int devices_per_node = 1;
  LinkSpec intra;
  int island_size = 0;            // devices directly linked to each other (Summit: triads of 3)
  double cross_island_bandwidth_gbs = 0;
  LinkSpec inter;
  Curve gemm_efficiency_by_flops;     // fraction of peak vs FLOPs of one GEMM
  Curve gemm_efficiency_by_min_dim;   // multiplier vs the smallest of m, n, k
  Curve memory_efficiency_by_bytes;   // fraction of memory bandwidth vs bytes moved
  // Optional: FP8 GEMMs' efficiency (of the FP8 peak) over the bf16 curve's (of the bf16 peak), vs
  // FLOPs of one GEMM; empty: FP8 at the bf16 curve.
  Curve fp8_gemm_scale_by_flops;
  // Optional: a grouped FP8 GEMM (a MoE layer's local experts in one block-scaled grouped kernel)
  // reaches this fraction of what one GEMM of a group's shape does; 1: the same.
  double fp8_grouped_gemm_scale = 1.0;
  // Optional, with device.fp8_recipe mxfp8: a block-scaled MXFP8 GEMM's rate over a per-tensor
  // FP8 GEMM's of the same shape (the curve above), every FP8 GEMM; 1: the same.
  double mxfp8_gemm_scale = 1.0;
  AttentionRates attention;           // optional `efficiency.attention` block
  PublishedError published;           // optional `published_error` block
  HostSpec host;                      // optional `host` block (GPU topologies)

  bool is_gpu() const { return device.kind == "gpu"; }
};

TopologySpec load_topology(const std::string& path);
TopologySpec topology_from_yaml_text(const std::string& text, const std::string& name);  // `name` in messages
class YamlMap;
TopologySpec topology_from_yaml(const YamlMap& root, const std::string& path);

}  // namespace tedsim
