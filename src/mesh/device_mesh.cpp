#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/mesh/device_mesh.hpp>

namespace meshtensor {

namespace {
bool is_identifier(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  auto is_alpha = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  };
  if (!is_alpha(name[0])) return false;
  for (char c : name) {
    if (!is_alpha(c) && !(c >= '0' && c <= '9')) return false;
  }
  return true;
}
}  // namespace

DeviceMesh::DeviceMesh(std::vector<std::int64_t> sizes, std::vector<std::string> names)
    : sizes_(std::move(sizes)), names_(std::move(names)) {
  if (sizes_.empty()) throw InvalidArgument("a device mesh needs at least one dim");
  if (ndim() > kMaxMeshDims) {
    throw InvalidArgument(fmt::format("mesh {} has {} dims; at most {} are supported",
                                      fmt::join(sizes_, "x"), ndim(), kMaxMeshDims));
  }
  for (std::int64_t dim_size : sizes_) {
    if (dim_size < 1) {
      throw InvalidArgument(fmt::format("mesh {} has a dim of size {}; sizes must be at least 1",
                                        fmt::join(sizes_, "x"), dim_size));
    }
    if (dim_size > kMaxMeshRanks / size_) {
      throw InvalidArgument(
          fmt::format("mesh {} has more than {} ranks", fmt::join(sizes_, "x"), kMaxMeshRanks));
    }
    size_ *= dim_size;
  }
  if (names_.empty()) return;
  if (names_.size() != sizes_.size()) {
    throw InvalidArgument(fmt::format("{} dim names ({}) for a mesh of {} dims ({})", names_.size(),
                                      fmt::join(names_, ","), ndim(), fmt::join(sizes_, "x")));
  }
  for (std::size_t i = 0; i < names_.size(); ++i) {
    if (!is_identifier(names_[i])) {
      throw InvalidArgument(
          fmt::format("mesh dim name '{}' is not an identifier (letters, digits, '_'; not starting "
                      "with a digit)",
                      names_[i]));
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (names_[i] == names_[j]) {
        throw InvalidArgument(fmt::format("mesh dim name '{}' is used twice", names_[i]));
      }
    }
  }
}

std::int64_t DeviceMesh::size(int dim) const {
  if (dim < 0 || dim >= ndim()) {
    throw InvalidArgument(fmt::format("mesh dim {} is out of range for mesh {} of {} dims", dim,
                                      to_string(), ndim()));
  }
  return sizes_[static_cast<std::size_t>(dim)];
}

std::string DeviceMesh::dim_name(int dim) const {
  size(dim);  // range check
  if (names_.empty()) return fmt::format("dim{}", dim);
  return names_[static_cast<std::size_t>(dim)];
}

int DeviceMesh::dim_index(std::string_view name) const {
  for (int dim = 0; dim < ndim(); ++dim) {
    if (dim_name(dim) == name) return dim;
  }
  throw InvalidArgument(fmt::format("mesh {} has no dim named '{}'", to_string(), name));
}

void DeviceMesh::check_rank(std::int64_t rank) const {
  if (rank < 0 || rank >= size_) {
    throw InvalidArgument(
        fmt::format("rank {} is out of range for mesh {} of {} ranks", rank, to_string(), size_));
  }
}

void DeviceMesh::check_dims(std::span<const int> dims) const {
  for (std::size_t i = 0; i < dims.size(); ++i) {
    size(dims[i]);
    for (std::size_t j = 0; j < i; ++j) {
      if (dims[i] == dims[j]) {
        throw InvalidArgument(fmt::format("mesh dim {} is listed twice in group dims [{}]", dims[i],
                                          fmt::join(dims, ",")));
      }
    }
  }
}

std::vector<std::int64_t> DeviceMesh::coordinates(std::int64_t rank) const {
  check_rank(rank);
  std::vector<std::int64_t> coordinates(sizes_.size());
  for (int dim = ndim() - 1; dim >= 0; --dim) {
    const auto d = static_cast<std::size_t>(dim);
    coordinates[d] = rank % sizes_[d];
    rank /= sizes_[d];
  }
  return coordinates;
}

std::int64_t DeviceMesh::rank_at(std::span<const std::int64_t> coordinates) const {
  if (static_cast<int>(coordinates.size()) != ndim()) {
    throw InvalidArgument(fmt::format("{} coordinates for mesh {} of {} dims", coordinates.size(),
                                      to_string(), ndim()));
  }
  std::int64_t rank = 0;
  for (std::size_t d = 0; d < sizes_.size(); ++d) {
    if (coordinates[d] < 0 || coordinates[d] >= sizes_[d]) {
      throw InvalidArgument(fmt::format("coordinate {} is out of range for mesh dim {} of size {}",
                                        coordinates[d], d, sizes_[d]));
    }
    rank = rank * sizes_[d] + coordinates[d];
  }
  return rank;
}

std::int64_t DeviceMesh::group_size(std::span<const int> dims) const {
  check_dims(dims);
  std::int64_t product = 1;
  for (int dim : dims)
    product *= sizes_[static_cast<std::size_t>(dim)];
  return product;
}

std::vector<std::int64_t> DeviceMesh::group_ranks(std::int64_t rank,
                                                  std::span<const int> dims) const {
  std::vector<std::int64_t> coordinates = this->coordinates(rank);
  std::vector<std::int64_t> ranks(static_cast<std::size_t>(group_size(dims)));
  // Odometer over `dims`, the last listed dim varying fastest.
  for (int dim : dims)
    coordinates[static_cast<std::size_t>(dim)] = 0;
  for (std::int64_t& member : ranks) {
    member = rank_at(coordinates);
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
      auto& c = coordinates[static_cast<std::size_t>(*it)];
      if (++c < sizes_[static_cast<std::size_t>(*it)]) break;
      c = 0;
    }
  }
  return ranks;
}

std::int64_t DeviceMesh::group_position(std::int64_t rank, std::span<const int> dims) const {
  check_dims(dims);
  const std::vector<std::int64_t> coordinates = this->coordinates(rank);
  std::int64_t position = 0;
  for (int dim : dims) {
    const auto d = static_cast<std::size_t>(dim);
    position = position * sizes_[d] + coordinates[d];
  }
  return position;
}

std::string DeviceMesh::to_string() const {
  if (names_.empty()) return fmt::format("{}", fmt::join(sizes_, "x"));
  std::vector<std::string> parts;
  for (std::size_t d = 0; d < sizes_.size(); ++d)
    parts.push_back(fmt::format("{}={}", names_[d], sizes_[d]));
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace meshtensor
