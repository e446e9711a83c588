#include "tedsim/spec/topology_spec.hpp"

#include "tedsim/core/error.hpp"
#include "tedsim/core/yaml_reader.hpp"

namespace tedsim {
namespace {

LinkSpec read_link(const YamlMap& map) {
  LinkSpec link;
  link.bandwidth_gbs = map.positive_number("bandwidth_gbs");
  link.latency_us = map.nonnegative_number("latency_us", 0.0);
  link.efficiency = map.number("efficiency", 1.0);
  if (link.efficiency <= 0 || link.efficiency > 1) map.fail("efficiency", "expected a fraction in (0, 1]");
  return link;
}

void check_fraction_curve(const YamlMap& map, const std::string& key, const Curve& curve) {
  for (const auto& [x, y] : curve) {
    if (x <= 0) map.fail(key, "expected positive x values (they are interpolated on a log scale)");
    if (y > 1.0) map.fail(key, "expected efficiencies in (0, 1]");
  }
}

// `efficiency.attention`: curves of TFLOP/s over sequence length, named by kernel and head dim.
AttentionRates read_attention(const YamlMap& map) {
  AttentionRates r;
  const auto read = [&](const std::string& prefix, Curve* curves) {
    for (int i = 0; i < 2; ++i) {
      const std::string key = prefix + "_d" + std::to_string(AttentionRates::kHeadDims[i]);
      if (!map.has(key)) continue;
      curves[i] = map.curve(key);
      for (const auto& [seq, tflops] : curves[i]) {
        if (seq < 1) map.fail(key, "expected sequence lengths >= 1");
        if (tflops <= 0) map.fail(key, "expected positive TFLOP/s");
      }
    }
  };
  read("flash_forward", r.flash_forward);
  read("flash_backward", r.flash_backward);
  read("unfused", r.unfused);
  read("flash_fp8_forward", r.fp8_forward);
  read("flash_fp8_backward", r.fp8_backward);
  for (int i = 0; i < 2; ++i) {
    if (r.flash_forward[i].empty() != r.flash_backward[i].empty())
      map.fail("flash_backward_d" + std::to_string(AttentionRates::kHeadDims[i]),
               "flash_forward and flash_backward are given together, for the same head dimensions");
    if (r.fp8_forward[i].empty() != r.fp8_backward[i].empty())
      map.fail("flash_fp8_backward_d" + std::to_string(AttentionRates::kHeadDims[i]),
               "flash_fp8_forward and flash_fp8_backward are given together, for the same head dimensions");
  }
  if (r.has_fp8() && !r.has_flash())
    map.fail("flash_fp8_forward_d128", "FP8 attention tables need the bf16 ones (flash_forward_*) beside them");
  map.reject_unknown_keys();
  if (!r.has_flash() && !r.has_unfused())
    map.fail("flash_forward_d128", "expected at least one table (flash_forward_d64/_d128 with flash_backward_*, "
                                   "or unfused_d64/_d128)");
  return r;
}

}  // namespace

TopologySpec load_topology(const std::string& path) { return topology_from_yaml(YamlMap::load_file(path), path); }

TopologySpec topology_from_yaml_text(const std::string& text, const std::string& name) {
  return topology_from_yaml(YamlMap::from_string(text, name), name);
}

TopologySpec topology_from_yaml(const YamlMap& root, const std::string& path) {
  TopologySpec t;
  t.name = root.text("name");
  t.source = root.text("source", "");

  const YamlMap device = root.child("device");
  t.device.kind = device.text("kind");
  if (t.device.kind != "gpu" && t.device.kind != "cpu") device.fail("kind", "expected gpu or cpu, got '" + t.device.kind + "'");
  t.device.name = device.text("name");
  t.device.memory_gib = device.positive_number("memory_gib");
  t.device.reserved_gib = device.nonnegative_number("reserved_gib", 0.0);
  if (t.device.reserved_gib >= t.device.memory_gib) device.fail("reserved_gib", "must be less than memory_gib");
  const YamlMap peaks = device.child("peak_tflops");
  for (Dtype d : {Dtype::fp32, Dtype::fp16, Dtype::bf16, Dtype::fp8})
    t.device.peak_tflops[int(d)] = peaks.nonnegative_number(to_string(d), 0.0);
  peaks.reject_unknown_keys();
  if (t.device.peak_tflops_of(Dtype::fp32) <= 0) peaks.fail("fp32", "required: a positive fp32 peak");
  t.device.memory_bandwidth_gbs = device.positive_number("memory_bandwidth_gbs");
  t.device.kernel_launch_us = device.nonnegative_number("kernel_launch_us", 0.0);
  const std::string recipe = device.text("fp8_recipe", "tensor");
  if (recipe == "mxfp8")
    t.device.fp8_recipe = Fp8Recipe::mxfp8;
  else if (recipe != "tensor")
    device.fail("fp8_recipe", "expected tensor (per-tensor current scaling) or mxfp8 (block scaling), got '" + recipe + "'");
  if (device.has("sms")) {
    if (t.device.kind != "gpu") device.fail("sms", "streaming multiprocessors describe a GPU; this device is a CPU");
    t.device.sms = int(device.positive_integer("sms"));
  }
  device.reject_unknown_keys();

  t.devices_per_node = int(root.positive_integer("devices_per_node"));
  const YamlMap intra = root.child("intra_node");
  t.intra = read_link(intra);
  t.island_size = int(intra.positive_integer("island_size", t.devices_per_node));
  if (t.devices_per_node % t.island_size != 0) intra.fail("island_size", "must divide devices_per_node");
  if (t.island_size < t.devices_per_node)
    t.cross_island_bandwidth_gbs = intra.positive_number("cross_island_bandwidth_gbs");
  else
    t.cross_island_bandwidth_gbs = intra.number("cross_island_bandwidth_gbs", t.intra.bandwidth_gbs);
  intra.reject_unknown_keys();
  const YamlMap inter = root.child("inter_node");
  t.inter = read_link(inter);
  inter.reject_unknown_keys();

  const YamlMap eff = root.child("efficiency");
  t.gemm_efficiency_by_flops = eff.curve("gemm_by_flops");
  check_fraction_curve(eff, "gemm_by_flops", t.gemm_efficiency_by_flops);
  t.gemm_efficiency_by_min_dim = eff.curve("gemm_by_min_dim");
  check_fraction_curve(eff, "gemm_by_min_dim", t.gemm_efficiency_by_min_dim);
  t.memory_efficiency_by_bytes = eff.curve("memory_by_bytes");
  check_fraction_curve(eff, "memory_by_bytes", t.memory_efficiency_by_bytes);
  if (eff.has("fp8_gemm_scale_by_flops")) {
    t.fp8_gemm_scale_by_flops = eff.curve("fp8_gemm_scale_by_flops");
    for (const auto& [flops, scale] : t.fp8_gemm_scale_by_flops)
      if (flops <= 0 || scale <= 0 || scale > 1.0)
        eff.fail("fp8_gemm_scale_by_flops", "expected positive FLOPs and scales in (0, 1]");
    if (t.device.peak_tflops_of(Dtype::fp8) <= 0)
      eff.fail("fp8_gemm_scale_by_flops", "the device has no fp8 peak (device.peak_tflops.fp8)");
  }
  if (eff.has("fp8_grouped_gemm_scale")) {
    t.fp8_grouped_gemm_scale = eff.number("fp8_grouped_gemm_scale");
    if (t.fp8_grouped_gemm_scale <= 0 || t.fp8_grouped_gemm_scale > 1.0)
      eff.fail("fp8_grouped_gemm_scale", "expected a fraction in (0, 1]");
    if (t.fp8_gemm_scale_by_flops.empty())
      eff.fail("fp8_grouped_gemm_scale", "it scales the FP8 curve: give fp8_gemm_scale_by_flops too");
  }
  if (eff.has("mxfp8_gemm_scale")) {
    t.mxfp8_gemm_scale = eff.number("mxfp8_gemm_scale");
    if (t.mxfp8_gemm_scale <= 0 || t.mxfp8_gemm_scale > 1.0) eff.fail("mxfp8_gemm_scale", "expected a fraction in (0, 1]");
    if (t.device.fp8_recipe != Fp8Recipe::mxfp8)
      eff.fail("mxfp8_gemm_scale", "scales block-scaled MXFP8 GEMMs: the device's fp8_recipe must be mxfp8");
    if (t.fp8_gemm_scale_by_flops.empty())
      eff.fail("mxfp8_gemm_scale", "it scales the FP8 curve: give fp8_gemm_scale_by_flops too");
  }
  if (eff.has("attention")) t.attention = read_attention(eff.child("attention"));
  eff.reject_unknown_keys();
  if (root.has("host")) {
    const YamlMap host = root.child("host");
    if (!t.is_gpu()) host.fail("cpu", "a host section describes the CPU that launches a GPU's kernels; this device is a CPU");
    t.host.cpu = host.text("cpu");
    t.host.framework_op_us = host.positive_number("framework_op_us");
    host.reject_unknown_keys();
  }
  if (root.has("published_error")) {
    const YamlMap pub = root.child("published_error");
    t.published.rows = int(pub.positive_integer("rows"));
    t.published.min = pub.number("min");
    t.published.max = pub.number("max");
    if (t.published.min > t.published.max) pub.fail("max", "expected max >= min");
    if (t.published.min <= -1) pub.fail("min", "expected an error above -1 (a throughput ratio minus 1)");
    pub.reject_unknown_keys();
  }
  root.reject_unknown_keys();
  return t;
}

}  // namespace tedsim
