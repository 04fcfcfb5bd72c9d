#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::cp {

/// The context-parallel group of this rank: a sequence splits over its ranks (mesh::
/// context_chunks, head-tail by default), every rank keeps the rows of its positions, and
/// attention sees the whole sequence's keys and values through gather(), an all-gather over
/// the group that puts every row at its position. The bits of a row do not depend on the split:
/// attention runs each row over the keys in ascending position whatever rank holds them.
class ContextParallel : public nn::SequenceSplit {
 public:
  /// Over `group`, the ranks of one context-parallel group in their cp order.
  explicit ContextParallel(std::shared_ptr<comm::Communicator> group,
                           ContextSplit split = ContextSplit::head_tail);
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

  int degree() const override { return group_->size(); }
  int rank() const override { return group_->rank(); }
  std::int64_t length() const override { return length_; }
  const std::vector<std::int64_t>& positions() const override;
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces() const override;
  Tensor gather(const Tensor& local) override;

  /// Sets the length of the sequences that come next; the positions follow. InvalidArgument
  /// naming the values when the sequence does not split over the group (a chunk would be empty).
  void set_length(std::int64_t length);
  /// Whether a sequence of `length` splits over the group.
  bool splits(std::int64_t length) const { return context_splits(length, degree(), split_); }
  /// This rank's rows of `whole` ([batch, length(), ...], any dtype): [batch, positions, ...].
  Tensor local_rows(const Tensor& whole) const;
  /// This rank's entries of `whole`, one per row of `batch` sequences of length() in row order.
  template <class T>
  std::vector<T> local_entries(const std::vector<T>& whole, std::int64_t batch) const {
    std::vector<T> out;
    out.reserve(static_cast<std::size_t>(batch) * positions().size());
    for (std::int64_t b = 0; b < batch; ++b)
      for (const std::int64_t t : positions())
        out.push_back(whole.at(static_cast<std::size_t>(b * length_ + t)));
    return out;
  }
  /// How the sequence splits.
  ContextSplit split() const { return split_; }
  /// Bytes this rank contributed to gathers, and their number, since construction.
  std::int64_t gathered_bytes() const { return gathered_bytes_; }
  std::int64_t gathers() const { return gathers_; }
  /// The group's communicator.
  comm::Communicator& group() { return *group_; }

 private:
  std::shared_ptr<comm::Communicator> group_;
  ContextSplit split_;
  std::int64_t length_ = 0;
  std::vector<std::vector<std::int64_t>> member_positions_;    // per member of the group
  std::vector<std::pair<std::int64_t, std::int64_t>> pieces_;  // this rank's, of length_
  std::int64_t gathered_bytes_ = 0;
  std::int64_t gathers_ = 0;
};

}  // namespace meshtensor::cp
