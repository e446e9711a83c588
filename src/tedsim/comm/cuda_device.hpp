#pragma once
// CUDA device discovery and selection, kept apart so the factory can ask "is there a device?"
// without touching the CUDA runtime itself (only the .cu behind this header does).
#include <string>

namespace tedsim {

// Selects device (local_rank modulo device count) for this process and returns its index.
// Throws RunError("<where>: no CUDA device: <reason>") when none is usable.
int select_cuda_device(int local_rank, const std::string& where);

}  // namespace tedsim
