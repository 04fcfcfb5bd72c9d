#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include <meshtensor/kernels/binned_sum.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// Where each parameter's gradient sum lives inside one flat buffer (in parameter order), so a
/// whole model's gradients reduce with one collective.
class GradientLayout {
 public:
  /// The layout of `parameters`, in order.
  explicit GradientLayout(std::vector<Parameter*> parameters);
  /// First element of `p` in the flat buffer; InvalidArgument for a parameter not in the layout.
  std::int64_t offset_of(const Parameter& p) const;
  /// Position of `p` in parameters(); InvalidArgument for a parameter not in the layout.
  std::size_t index_of(const Parameter& p) const;
  /// Elements of parameter i as the layout was made: a sharded runtime empties a parameter's
  /// value between its backward and the reduction that reads these sums.
  std::int64_t size_at(std::size_t i) const { return sizes_[i]; }
  /// Total number of elements.
  std::int64_t total() const { return total_; }
  /// The parameters, in order.
  const std::vector<Parameter*>& parameters() const { return parameters_; }

 private:
  std::vector<Parameter*> parameters_;
  struct Place {
    std::int64_t offset;
    std::size_t index;
  };
  const Place& place_of(const Parameter& p) const;
  std::unordered_map<const Parameter*, Place> places_;
  std::vector<std::int64_t> sizes_;
  std::int64_t total_ = 0;
};

/// Fixed-order f32 sums (ordered and native modes): each sum runs over the rows in order and
/// micro-batches add in the order they come; replicas that reduce these buffers in a fixed
/// order hold the same bits.
class DenseGradients : public GradientSink {
 public:
  explicit DenseGradients(std::vector<Parameter*> parameters);
  void add_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy) override;
  void add_column_sums(const Parameter& p, const Tensor& a) override;
  void add_column_products(const Parameter& p, const Tensor& a, const Tensor& b) override;
  void add_indexed_rows(const Parameter& p, std::span<const std::int64_t> indices,
                        const Tensor& rows) override;
  /// Zeroes the sums (start of a step).
  void clear();
  /// The flat f32 buffer of every sum (reduce it across ranks before finish()).
  Tensor& sums() { return sums_; }
  /// grad = sum / divisor for every parameter (one IEEE division per element).
  void finish(std::int64_t divisor);

 private:
  Tensor view_of(const Parameter& p);
  GradientLayout layout_;
  Tensor sums_;
};

/// Exact sums (exact mode): the binned accumulators of kernels::BinnedSums, so the gradient is
/// the correctly rounded exact sum over the global batch divided once, the same bits for any
/// split of the batch over micro-batches and ranks.
class BinnedGradients : public GradientSink {
 public:
  /// Sums for `parameters`, empty; no pass over their memory until each is first added to.
  explicit BinnedGradients(std::vector<Parameter*> parameters);
  void add_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy) override;
  /// Each sample's xᵀ·dy as one batch-invariant f32 product (its rows in ascending order), the
  /// samples' products then summed exactly: the same bits for any split of the samples, at the
  /// cost of one exact addition per sample and element instead of one per row.
  void add_sample_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy,
                                 std::int64_t sample_rows) override;
  void add_column_sums(const Parameter& p, const Tensor& a) override;
  void add_column_products(const Parameter& p, const Tensor& a, const Tensor& b) override;
  /// Each index's rows are summed exactly (kernels::add_column_sums over the rows gathered per
  /// index), so the order and split of the rows change nothing.
  void add_indexed_rows(const Parameter& p, std::span<const std::int64_t> indices,
                        const Tensor& rows) override;
  /// Back to empty (start of a step). Costs no pass over the sums: each parameter's first
  /// addition afterwards overwrites its elements, and sums() empties those that got none.
  void clear();
  /// The accumulators of every parameter, flat (merge them across ranks before finish()).
  kernels::BinnedSums& sums();
  /// grad = round(exact sum / divisor) for every parameter.
  void finish(std::int64_t divisor);
  /// Sets every parameter's grad from `flat` (f32, one value per element in parameter order):
  /// for gradients rounded elsewhere, e.g. a slice per rank.
  void set_gradients(const Tensor& flat);

 private:
  /// Runs add(start) for an addition to `p`: Start::empty the first time after clear().
  template <class Add>
  void add_to(const Parameter& p, const Add& add);

  GradientLayout layout_;
  kernels::BinnedSums sums_;
  std::vector<char> emptied_;  ///< per parameter: cleared, its elements not yet written
};

}  // namespace meshtensor::nn
