#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtensor {

/// Most ranks a mesh may have.
inline constexpr std::int64_t kMaxMeshRanks = std::int64_t{1} << 20;
/// Most dims a mesh may have.
inline constexpr int kMaxMeshDims = 16;

/// An N-d grid of ranks, as pure data. Rank r sits at the row-major coordinates of r in the
/// grid (rank 0 at the origin, the last dim varying fastest).
class DeviceMesh {
 public:
  /// Throws InvalidArgument for no dims, a size below 1, too many ranks, or names that are not
  /// unique identifiers (one per dim, or none at all).
  explicit DeviceMesh(std::vector<std::int64_t> sizes, std::vector<std::string> names = {});

  /// Number of mesh dims.
  int ndim() const { return static_cast<int>(sizes_.size()); }
  /// Number of ranks.
  std::int64_t size() const { return size_; }
  /// Size of mesh dim `dim` (checked).
  std::int64_t size(int dim) const;
  /// All dim sizes.
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  /// Dim names; empty when the mesh is unnamed.
  const std::vector<std::string>& names() const { return names_; }
  /// Name of dim `dim`, or "dim<k>" for an unnamed mesh.
  std::string dim_name(int dim) const;
  /// Index of the dim called `name`; throws InvalidArgument listing the names.
  int dim_index(std::string_view name) const;

  /// Coordinates of `rank` (checked).
  std::vector<std::int64_t> coordinates(std::int64_t rank) const;
  /// Rank at `coordinates` (checked).
  std::int64_t rank_at(std::span<const std::int64_t> coordinates) const;

  /// The ranks that share every coordinate of `rank` outside `dims`, ordered by their
  /// coordinates along `dims` with the first listed dim most significant (major to minor).
  /// `dims` may be in any order and may be empty (then the group is {rank}).
  std::vector<std::int64_t> group_ranks(std::int64_t rank, std::span<const int> dims) const;
  /// Position of `rank` inside group_ranks(rank, dims).
  std::int64_t group_position(std::int64_t rank, std::span<const int> dims) const;
  /// Product of the sizes of `dims`.
  std::int64_t group_size(std::span<const int> dims) const;

  /// "2x2x2", or "dp=2,fsdp=2,tp=2" for a named mesh.
  std::string to_string() const;

  friend bool operator==(const DeviceMesh&, const DeviceMesh&) = default;

 private:
  void check_rank(std::int64_t rank) const;
  void check_dims(std::span<const int> dims) const;

  std::vector<std::int64_t> sizes_;
  std::vector<std::string> names_;
  std::int64_t size_ = 1;
};

}  // namespace meshtensor
