#pragma once
// Which layers each pipeline stage and model chunk holds.
//
// P pipeline ranks each hold V model chunks (virtual stages); virtual stage i = v * P + p is chunk v
// of pipeline rank p, and layers run through the virtual stages in order (Megatron-Core's
// interleaving). The embedding sits on the first virtual stage, the final norm, LM head and loss
// on the last.
//
// The split is either explicit, Megatron-Core's --pipeline-model-parallel-layout string (one entry
// per virtual stage, separated by '|': E embedding, t a transformer layer, L the loss; `X*N` and
// `(...)*N` repeat; ',' and spaces are ignored), e.g. "Et|(tt|)*30tL" for 62 layers on P*V = 32,
// or even: L / (P*V) layers each. Megatron-Core refuses a layer count that P*V does not divide
// unless told the split; tedsim then gives the remainder one layer each to the middle virtual
// stages (the first holds the embedding, the last the LM head and loss), and says so.
#include <string>
#include <vector>

namespace tedsim {

struct ModelChunk {
  int first_layer = 0;
  int layers = 0;
  bool embedding = false;
  bool head = false;  // final norm, LM head, loss
  int mtp_layers = 0;  // multi-token-prediction modules, with the head (before it: 'm' in a layout)
};

struct StageMap {
  int pp = 1, vpp = 1;
  std::vector<ModelChunk> chunks;  // P * V, indexed by virtual stage v * P + p
  bool uneven = false;             // the even split did not divide the layers
  const ModelChunk& chunk(int stage, int v) const { return chunks[std::size_t(v) * pp + stage]; }
  int stage_layers(int stage) const;  // over the stage's V chunks
  std::string describe() const;       // "stage 0: layers 0-15 + embedding | ..."
};

// Expands a layout string into one entry per virtual stage ("Ett", "tt", ..., "tL"); throws
// InputError naming the position of a malformed part.
std::vector<std::string> expand_pipeline_layout(const std::string& layout);
// The first problem with `layout` for a model of `layers` transformer layers and `mtp_layers`
// multi-token-prediction modules on P x V virtual stages; empty if none.
std::string pipeline_layout_violation(const std::string& layout, int layers, int pp, int vpp, int mtp_layers = 0);
// Throws InputError if the layout is invalid (see pipeline_layout_violation). The MTP modules sit
// in the last virtual stage, before the loss (Megatron-Core places them there).
StageMap build_stage_map(int layers, int pp, int vpp, const std::string& layout = {}, int mtp_layers = 0);

}  // namespace tedsim
