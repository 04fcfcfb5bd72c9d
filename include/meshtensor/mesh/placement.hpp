#pragma once

#include <string>

#include <meshtensor/core/reduce_op.hpp>

namespace meshtensor {

/// How a tensor lives along one mesh dim: split on a tensor dim (Shard), copied (Replicate), or
/// held as pending contributions that combine with an op (Partial).
class Placement {
 public:
  /// The three kinds of placement.
  enum class Kind : std::uint8_t { shard, replicate, partial };

  /// Shard(tensor_dim): each rank along the mesh dim holds one torch.chunk-style piece.
  static Placement shard(int tensor_dim);
  /// Replicate: every rank along the mesh dim holds the same data.
  static Placement replicate();
  /// Partial(op): the true value is op over the ranks along the mesh dim.
  static Placement partial(ReduceOp op = ReduceOp::sum);

  /// Which kind.
  Kind kind() const { return kind_; }
  /// True for Shard.
  bool is_shard() const { return kind_ == Kind::shard; }
  /// True for Replicate.
  bool is_replicate() const { return kind_ == Kind::replicate; }
  /// True for Partial.
  bool is_partial() const { return kind_ == Kind::partial; }
  /// The sharded tensor dim (Shard only; throws otherwise).
  int shard_dim() const;
  /// The combining op (Partial only; throws otherwise).
  ReduceOp reduce_op() const;

  /// "S0", "R", "P(sum)", "P(avg)", ...
  std::string to_string() const;

  friend bool operator==(const Placement&, const Placement&) = default;

 private:
  Placement(Kind kind, int shard_dim, ReduceOp op) : kind_(kind), shard_dim_(shard_dim), op_(op) {}

  Kind kind_ = Kind::replicate;
  int shard_dim_ = -1;
  ReduceOp op_ = ReduceOp::sum;
};

}  // namespace meshtensor
