#pragma once
// Rounded copies of the weights a step's GEMMs read, made once per version of the parameters.
//
// The CUDA step multiplies bf16 operands into fp32 (kernels/cuda/step_kernels.hpp). Rounding a
// weight on every GEMM that reads it costs a full read and write of the weight twice per
// micro-batch (forward and data gradient): for gpu-moe's experts, whose 8192 x 2048 weights meet
// about 128 tokens each, that rounding took most of the GEMM's time (reports/device/, run 4).
// Megatron keeps bf16 weights beside fp32 master weights for the same reason; here the copies are
// made on first use after each change of the parameters.
//
// A copy is keyed by the block it copies: address, rows, columns, leading dimension. Every copy
// goes stale at invalidate(): the trainer calls it (StepOps::parameters_changed) before each
// step's micro-batches, since the optimizer, ZeRO's gathers and anything a caller does through
// Trainer::params() write parameters only between steps. Copies are counted as live step memory
// (MemoryCounter): 2 bytes a parameter on the device, as Megatron's bf16 weights are.
#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

#include "tedsim/runtime/tensor.hpp"

namespace tedsim::runtime {

class WeightCopies {
 public:
  struct Copy {
    void* data = nullptr;
    std::uint64_t version = 0;  // the parameters' version it was made from
  };
  // `space`: where the copies live; elem_bytes: the bytes of one copied element.
  WeightCopies(MemorySpace& space, std::size_t elem_bytes) : space_(space), elem_bytes_(elem_bytes) {}
  ~WeightCopies();
  WeightCopies(const WeightCopies&) = delete;
  WeightCopies& operator=(const WeightCopies&) = delete;

  // The copy of the rows x cols block at `w` (leading dimension ld), allocated on first use.
  // `stale` is set when the caller must (re)fill it; the copy then counts as current.
  void* find(const float* w, int rows, int cols, int ld, bool& stale);
  void invalidate() { ++version_; }

  std::size_t fills() const { return fills_; }  // copies made or remade
  std::size_t reuses() const { return reuses_; }
  std::size_t bytes() const { return bytes_; }

 private:
  using Key = std::tuple<const float*, int, int, int>;
  MemorySpace& space_;
  std::size_t elem_bytes_;
  std::map<Key, Copy> copies_;
  std::uint64_t version_ = 1;
  std::size_t fills_ = 0, reuses_ = 0, bytes_ = 0;
};

}  // namespace tedsim::runtime
