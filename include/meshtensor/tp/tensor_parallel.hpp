#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/mesh/spec.hpp>
#include <meshtensor/nn/loss.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::tp {

/// One collective a tensor-parallel module ran (or one local step of its plan), as CommDebugMode
/// would list it.
struct CommEvent {
  std::string module;      ///< the module's path, e.g. "blocks.0.attn.proj"
  std::string phase;       ///< "forward" or "backward"
  std::string what;        ///< e.g. "output Partial -> Shard(1)"
  std::string collective;  ///< all_reduce, reduce_scatter, all_gather, all_to_all, ...
  std::int64_t bytes = 0;  ///< bytes this rank sent
};

/// The collectives of the tensor-parallel modules of one rank, in issue order, while enabled.
class CommLog {
 public:
  /// Starts (true) or stops recording.
  void enable(bool on) { enabled_ = on; }
  /// Whether recording.
  bool enabled() const { return enabled_; }
  /// Appends an event (when enabled).
  void add(CommEvent event);
  /// The events recorded.
  const std::vector<CommEvent>& events() const { return events_; }
  /// Forgets the events.
  void clear() { events_.clear(); }
  /// Number of recorded events of `collective` in `phase` ("" for any phase).
  std::int64_t count(const std::string& collective, const std::string& phase = {}) const;
  /// One line per event.
  std::string to_text() const;

 private:
  bool enabled_ = false;
  std::vector<CommEvent> events_;
};

/// The tensor-parallel group of this rank and how its collectives run: activations move between
/// placements on the 1-D mesh of the group with the planner's plans, reductions follow `mode`.
class TensorParallel {
 public:
  /// Over `group`, the ranks of one tensor-parallel group in their tp order.
  TensorParallel(std::shared_ptr<comm::Communicator> group, comm::ReductionMode mode,
                 bool sequence_parallel);
  TensorParallel(const TensorParallel&) = delete;
  TensorParallel& operator=(const TensorParallel&) = delete;

  /// Ranks in the group (the tp degree).
  int size() const { return group_->size(); }
  /// This rank's position in the group.
  int rank() const { return group_->rank(); }
  /// The reduction mode of every sum it completes.
  comm::ReductionMode mode() const { return mode_; }
  /// Whether activations outside the tensor-parallel layers are split along the sequence.
  bool sequence_parallel() const { return sequence_parallel_; }
  /// The group's communicator.
  comm::Communicator& group() { return *group_; }
  /// The group as a 1-D mesh named "tp".
  const DeviceMesh& mesh() const { return groups_.mesh(); }
  /// The collectives run, when enabled.
  CommLog& log() { return log_; }

  /// Moves `local`, this rank's block of a tensor of `global_shape` placed by `from` on the
  /// group's 1-D mesh, to its block under `to` with the planner's plan (logged as `module`,
  /// `phase`, `what`).
  Tensor redistribute(const Tensor& local, const Shape& global_shape, const Placement& from,
                      const Placement& to, const std::string& module, const std::string& phase,
                      const std::string& what);
  /// Completes exact partial sums of a tensor of `shape` over the group: the binned sums of every
  /// member merged and rounded once; `to` is Replicate (the whole tensor) or Shard(d) (this rank's
  /// chunk of dim d).
  Tensor complete_exact(kernels::BinnedSums& sums, const Shape& shape, const Placement& to,
                        const std::string& module, const std::string& phase,
                        const std::string& what);
  /// Sums (in the mode), maxima or minima of `values` over the group, in place.
  void all_reduce(std::span<double> values, ReduceOp op, const std::string& module,
                  const std::string& what);
  /// Exact sums of `sums` over the group, rounded once into `rounded`.
  void all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded,
                        const std::string& module, const std::string& what);

  /// The whole sequence length of the current forward (set when activations are first split
  /// along the sequence).
  std::int64_t sequence_length() const { return sequence_length_; }
  /// See sequence_length().
  void set_sequence_length(std::int64_t length) { sequence_length_ = length; }

  /// Keeps `object` alive as long as the group (the communication a style installs).
  template <class T>
  T& keep(std::unique_ptr<T> object) {
    T& ref = *object;
    kept_.push_back(std::shared_ptr<void>(std::move(object)));
    return ref;
  }

 private:
  void note(CommEvent event);  // to the log and to an active CommDebugMode

  std::shared_ptr<comm::Communicator> group_;
  comm::MeshGroups groups_;
  comm::ReductionMode mode_;
  bool sequence_parallel_;
  CommLog log_;
  std::int64_t sequence_length_ = 0;
  std::vector<std::shared_ptr<void>> kept_;
};

/// Sums (in `mode`), maxima or minima of `values` over `group`, in place (an f64 all-reduce;
/// maxima and minima are ordered whatever `mode`). `label` names the call.
void all_reduce_values(comm::Communicator& group, std::span<double> values, ReduceOp op,
                       comm::ReductionMode mode, const std::string& label,
                       std::chrono::milliseconds timeout = comm::default_timeout());

/// The exact sums `sums` hold over `group`, merged as binned sums and rounded once into
/// `rounded` (the same bits for any split of the addends over the ranks).
void all_reduce_binned_values(comm::Communicator& group, kernels::BinnedSums& sums,
                              std::span<double> rounded, const std::string& label);

/// The classes of logits split over a tensor-parallel group (loss_parallel): this rank holds
/// chunk rank() of `classes`.
class VocabularySplit : public nn::ClassSplit {
 public:
  VocabularySplit(TensorParallel& tp, std::int64_t classes);
  std::int64_t first_class() const override;
  std::int64_t classes() const override { return classes_; }
  void all_reduce(std::span<double> values, ReduceOp op) override;
  void all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded) override;

 private:
  TensorParallel& tp_;
  std::int64_t classes_;
};

/// The cross-entropy of logits whose last dim is split over `tp` (null: whole), with exact
/// denominators in exact mode (nn::softmax_cross_entropy with a VocabularySplit).
nn::CrossEntropyResult parallel_cross_entropy(const Tensor& logits,
                                              std::span<const std::int32_t> labels,
                                              TensorParallel* tp, std::int64_t classes,
                                              bool exact_sums);

/// The whole logits from this rank's chunk of the last dim (an all-gather over the group).
Tensor gather_classes(TensorParallel& tp, const Tensor& local, std::int64_t classes);

}  // namespace meshtensor::tp
