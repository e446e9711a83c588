#pragma once
// A pipeline stage (one rank's share of the model along the pipeline): the model chunks it holds
// (spec/pipeline_layout.hpp), with the embedding on the first stage and the final norm, LM head
// and loss on the last, and the micro-batches in flight between their forward and backward
// passes. run() drives its passes: every micro-batch through the whole model on a one-stage step
// (stage.cpp), the schedule's order of passes otherwise (schedule.cpp).
#include <array>
#include <map>
#include <memory>
#include <vector>

#include "tedsim/runtime/data.hpp"
#include "tedsim/runtime/layers/embedding.hpp"
#include "tedsim/runtime/layers/lm_head.hpp"
#include "tedsim/runtime/layers/mtp.hpp"
#include "tedsim/runtime/optimizer/param_sync.hpp"
#include "tedsim/runtime/pipeline/micro_batch.hpp"
#include "tedsim/runtime/pipeline/p2p.hpp"
#include "tedsim/spec/pipeline_layout.hpp"

namespace tedsim::runtime {

class Stage {
 public:
  // Makes the stage's modules and registers their parameters (the store is finalized after).
  Stage(StepContext& c, ParamSync& sync, const TokenSource& data, int stage, ParamRegistrar& reg, int expert_rank,
        const InitScales& init);

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  // The embedding table (first stage) and the LM head's weight (last stage); -1 where not held.
  int embedding_table() const { return first() ? embedding_.table() : -1; }
  int head_weight() const { return last() ? head_.weight() : -1; }
  // A last stage's copy of the embedding (P > 1: the tied LM head, or multi-token prediction's
  // lookup table), kept equal to the first stage's by the Trainer; -1 where there is none.
  int embedding_copy() const;

  // Every pass of this stage's micro-batches of iteration `it` (forward only without `backward`).
  // Returns the sums over them of (loss, cross-entropy, aux loss) / global micro-batches; a stage
  // holds the cross-entropy only if last, and its own MoE layers' aux loss.
  std::array<double, 3> run(std::int64_t it, bool backward);

 private:
  bool holds_layer(int l) const;
  void load(MicroBatch& mb, std::int64_t it, int j) const;
  void embed(MicroBatch& mb);
  // The loss of a micro-batch on the last stage, with the gradient the backward starts from:
  // returns {the mean cross-entropy, the multi-token-prediction loss as weighted into the loss}.
  std::array<double, 2> head(MicroBatch& mb, bool backward);
  void embed_backward(MicroBatch& mb);
  // The layers of `chunk`, forward (recording CAC's stash where a recompute will follow) and
  // backward (recomputing each layer first under full recompute).
  void chunk_forward(const ModelChunk& chunk, MicroBatch& mb, bool backward_follows);
  void chunk_backward(const ModelChunk& chunk, MicroBatch& mb);
  std::array<double, 3> run_one_stage(std::int64_t it, bool backward);
  std::array<double, 3> run_pipeline(std::int64_t it, bool backward);
  MicroBatch& in_flight(std::int64_t it, int mb);

  StepContext& c_;
  ParamSync& sync_;
  const TokenSource& data_;
  int stage_, stages_, chunks_;
  StageMap map_;
  Embedding embedding_;
  LmHead head_;
  // Multi-token prediction on the last stage (mtp.hpp): the modules, their lookup table, their
  // activations (a micro-batch's forward and backward run back to back inside head()).
  std::vector<std::unique_ptr<MtpModule>> mtp_;
  Embedding mtp_embedding_;
  std::vector<MtpActs> mtp_acts_;
  Tensor grad_normed_;
  std::vector<std::unique_ptr<TransformerLayer>> layers_;  // by global layer index; null where not held
  StageLinks links_;
  std::unique_ptr<MicroBatch> current_;              // a one-stage step's micro-batch, reused
  std::map<int, std::unique_ptr<MicroBatch>> in_flight_;  // a pipeline's, by micro-batch
};

}  // namespace tedsim::runtime
