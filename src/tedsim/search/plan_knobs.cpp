#include "tedsim/search/plan_knobs.hpp"

namespace tedsim {

const char* knob_name(Knob k) {
  switch (k) {
    case Knob::pipeline: return "pipeline stages";
    case Knob::interleaving: return "interleaved chunks";
    case Knob::sequence_parallel: return "sequence parallelism";
    case Knob::dtd: return "DTD";
    case Knob::cac: return "CAC";
    case Knob::full_recompute: return "full recompute";
    case Knob::selective_recompute: return "selective recompute";
    case Knob::sharded_optimizer: return "ZeRO (sharded optimizer)";
    case Knob::zero3: return "ZeRO-3";
    case Knob::expert_tp: return "expert TP";
    case Knob::tiled_optimizer: return "the tiled optimizer";
    case Knob::data_before_expert: return "the data-before-expert layout";
    case Knob::a2a_overlap: return "expert all-to-all overlap";
    case Knob::context_parallel: return "context parallelism";
    case Knob::folding: return "MoE parallel folding";
    case Knob::count: break;
  }
  return "?";
}

bool knob_on(const ParallelConfig& c, Knob k, bool moe_model) {
  switch (k) {
    case Knob::pipeline: return c.pp > 1;
    case Knob::interleaving: return c.vpp > 1;
    case Knob::sequence_parallel: return c.sequence_parallel;
    case Knob::dtd: return moe_model && c.dtd && c.tp > 1 && !c.sequence_parallel;
    case Knob::cac: return c.cac;
    case Knob::full_recompute: return c.recompute == Recompute::full;
    case Knob::selective_recompute: return c.recompute == Recompute::selective;
    case Knob::sharded_optimizer: return c.zero >= 1;
    case Knob::zero3: return c.zero >= 3;
    case Knob::expert_tp: return moe_model && c.expert_tp && c.tp > 1;
    case Knob::tiled_optimizer: return moe_model && c.tiled_optimizer;
    case Knob::data_before_expert: return c.layout == RankLayout::data_before_expert;
    case Knob::a2a_overlap: return c.moe_a2a_overlap;
    case Knob::context_parallel: return c.cp > 1;
    case Knob::folding: return c.layout == RankLayout::folded;
    case Knob::count: break;
  }
  return false;
}

}  // namespace tedsim
