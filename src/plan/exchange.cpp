#include <algorithm>

#include <meshtensor/plan/exchange.hpp>

namespace meshtensor::plan {

StepGroup::StepGroup(const DeviceMesh& mesh, const std::vector<int>& dims, std::int64_t rank)
    : mesh_(mesh), dims_(dims), coordinates_(mesh.coordinates(rank)) {
  for (int m : dims_) {
    size_ *= mesh.size(m);
    position_ = position_ * mesh.size(m) + coordinates_[static_cast<std::size_t>(m)];
  }
}

std::int64_t StepGroup::member(std::int64_t position) const {
  std::vector<std::int64_t> coordinates = coordinates_;
  for (std::size_t i = dims_.size(); i-- > 0;) {
    const std::int64_t size = mesh_.size(dims_[i]);
    coordinates[static_cast<std::size_t>(dims_[i])] = position % size;
    position /= size;
  }
  return mesh_.rank_at(coordinates);
}

namespace {
// Blocks of one spec from mesh coordinates, without allocating: the shard chain of every tensor
// dim is looked up once.
class BlockGrid {
 public:
  BlockGrid(const DeviceMesh& mesh, const PlacementSpec& spec, const Shape& shape)
      : mesh_(mesh), shape_(shape) {
    spec.validate(mesh, shape.rank());
    for (int t = 0; t < shape.rank(); ++t)
      chains_.push_back(spec.shard_mesh_dims(t));
  }
  // offsets[t], sizes[t] of the block at `coordinates`.
  void block(const std::vector<std::int64_t>& coordinates, std::int64_t* offsets,
             std::int64_t* sizes) const {
    for (std::size_t t = 0; t < chains_.size(); ++t) {
      std::int64_t offset = 0;
      std::int64_t size = shape_[static_cast<int>(t)];
      for (int m : chains_[t]) {
        const Chunk piece =
            chunk_extent(size, mesh_.size(m), coordinates[static_cast<std::size_t>(m)]);
        offset += piece.offset;
        size = piece.size;
      }
      offsets[t] = offset;
      sizes[t] = size;
    }
  }

 private:
  const DeviceMesh& mesh_;
  const Shape& shape_;
  std::vector<std::vector<int>> chains_;
};

// A box [offsets, offsets + sizes) of the global tensor in flat arrays.
struct Box {
  explicit Box(std::size_t rank) : offsets(rank), sizes(rank) {}
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t size : sizes)
      n *= size;
    return n;
  }
  Layout layout() const { return {Shape(sizes), offsets}; }
  std::vector<std::int64_t> offsets;
  std::vector<std::int64_t> sizes;
};

// out = a intersected with b; returns its element count.
std::int64_t intersect_into(const Box& a, const Box& b, Box& out) {
  std::int64_t n = 1;
  for (std::size_t t = 0; t < a.sizes.size(); ++t) {
    const std::int64_t begin = std::max(a.offsets[t], b.offsets[t]);
    const std::int64_t end = std::min(a.offsets[t] + a.sizes[t], b.offsets[t] + b.sizes[t]);
    out.offsets[t] = begin;
    out.sizes[t] = std::max<std::int64_t>(0, end - begin);
    n *= out.sizes[t];
  }
  return n;
}

// Walks the members of a rank's group in group order, keeping their coordinates.
class MemberWalk {
 public:
  MemberWalk(const DeviceMesh& mesh, const std::vector<int>& group, std::int64_t rank)
      : mesh_(mesh), group_(group), coordinates_(mesh.coordinates(rank)) {
    for (int m : group_)
      coordinates_[static_cast<std::size_t>(m)] = 0;
  }
  const std::vector<std::int64_t>& coordinates() const { return coordinates_; }
  // To the next member (an odometer over the group dims, the last one fastest).
  void next() {
    for (std::size_t i = group_.size(); i-- > 0;) {
      auto& coordinate = coordinates_[static_cast<std::size_t>(group_[i])];
      if (++coordinate < mesh_.size(group_[i])) return;
      coordinate = 0;
    }
  }

 private:
  const DeviceMesh& mesh_;
  const std::vector<int>& group_;
  std::vector<std::int64_t> coordinates_;
};

// The holders of one block before a step: members whose coordinates differ only on the group's
// non-Shard dims of `before` hold the same block. A member's index among its fellow holders is
// the mixed-radix number of those coordinates (group order); every set of holders has `count`
// members.
struct HolderDims {
  HolderDims(const DeviceMesh& mesh, const Step& step) {
    for (int m : step.group) {
      if (step.before.at(m).is_shard()) {
        shard_dims.push_back(m);
      } else {
        replicated_dims.push_back(m);
        count *= mesh.size(m);
      }
    }
  }
  std::int64_t index(const DeviceMesh& mesh, const std::vector<std::int64_t>& coordinates) const {
    std::int64_t value = 0;
    for (int m : replicated_dims)
      value = value * mesh.size(m) + coordinates[static_cast<std::size_t>(m)];
    return value;
  }
  bool same_block(const std::vector<std::int64_t>& a, const std::vector<std::int64_t>& b) const {
    for (int m : shard_dims) {
      if (a[static_cast<std::size_t>(m)] != b[static_cast<std::size_t>(m)]) return false;
    }
    return true;
  }

  std::vector<int> shard_dims;
  std::vector<int> replicated_dims;
  std::int64_t count = 1;
};
}  // namespace

std::vector<std::int64_t> member_counts(const DeviceMesh& mesh, const std::vector<int>& group,
                                        const PlacementSpec& spec, const Shape& shape,
                                        std::int64_t rank) {
  const BlockGrid grid(mesh, spec, shape);
  Box block(static_cast<std::size_t>(shape.rank()));
  MemberWalk walk(mesh, group, rank);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(StepGroup(mesh, group, rank).size()));
  for (std::int64_t& count : counts) {
    grid.block(walk.coordinates(), block.offsets.data(), block.sizes.data());
    count = block.numel();
    walk.next();
  }
  return counts;
}

std::vector<Layout> member_blocks(const DeviceMesh& mesh, const std::vector<int>& group,
                                  const PlacementSpec& spec, const Shape& shape,
                                  std::int64_t rank) {
  const BlockGrid grid(mesh, spec, shape);
  Box block(static_cast<std::size_t>(shape.rank()));
  MemberWalk walk(mesh, group, rank);
  const std::int64_t size = StepGroup(mesh, group, rank).size();
  std::vector<Layout> blocks;
  blocks.reserve(static_cast<std::size_t>(size));
  for (std::int64_t j = 0; j < size; ++j, walk.next()) {
    grid.block(walk.coordinates(), block.offsets.data(), block.sizes.data());
    blocks.push_back(block.layout());
  }
  return blocks;
}

GroupExchange group_exchange(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                             std::int64_t rank) {
  const StepGroup members(mesh, step.group, rank);
  const HolderDims holders(mesh, step);
  const BlockGrid before_grid(mesh, step.before, shape);
  const BlockGrid after_grid(mesh, step.after, shape);
  const auto tensor_rank = static_cast<std::size_t>(shape.rank());
  const std::vector<std::int64_t> mine = mesh.coordinates(rank);
  Box before(tensor_rank), after(tensor_rank), other(tensor_rank), piece(tensor_rank);
  before_grid.block(mine, before.offsets.data(), before.sizes.data());
  after_grid.block(mine, after.offsets.data(), after.sizes.data());
  const std::int64_t my_index = holders.index(mesh, mine);
  const std::int64_t me = members.position();
  GroupExchange exchange;
  exchange.position = me;
  const auto n = static_cast<std::size_t>(members.size());
  exchange.send_counts.assign(n, 0);
  exchange.recv_counts.assign(n, 0);
  MemberWalk walk(mesh, step.group, rank);
  for (std::int64_t j = 0; j < members.size(); ++j, walk.next()) {
    const auto at = static_cast<std::size_t>(j);
    if (j == me) {
      if (intersect_into(before, after, piece) > 0) {  // its own piece stays
        exchange.send_counts[at] = exchange.recv_counts[at] = piece.numel();
        exchange.send.push_back(piece.layout());
        exchange.recv.push_back(piece.layout());
      }
      continue;
    }
    const std::vector<std::int64_t>& theirs = walk.coordinates();
    if (holders.same_block(mine, theirs)) continue;  // it holds what this rank would send
    if (my_index == j % holders.count) {
      after_grid.block(theirs, other.offsets.data(), other.sizes.data());
      if (const std::int64_t count = intersect_into(before, other, piece); count > 0) {
        exchange.send_counts[at] = count;
        exchange.send.push_back(piece.layout());
      }
    }
    if (holders.index(mesh, theirs) == me % holders.count) {
      before_grid.block(theirs, other.offsets.data(), other.sizes.data());
      if (const std::int64_t count = intersect_into(other, after, piece); count > 0) {
        exchange.recv_counts[at] = count;
        exchange.recv.push_back(piece.layout());
      }
    }
  }
  return exchange;
}

ExchangeVolume exchange_volume(const DeviceMesh& mesh, const Step& step, const Shape& shape,
                               std::int64_t rank) {
  const Layout before = local_layout(mesh, step.before, shape, rank);
  const Layout after = local_layout(mesh, step.after, shape, rank);
  const std::int64_t own = intersect(before, after).numel();
  ExchangeVolume volume;
  // Every piece of its new block that it does not hold comes from exactly one other member.
  volume.recv = after.numel() - own;
  const HolderDims holders(mesh, step);
  if (holders.count == 1) {
    // The sole holder of its block sends it to every other member whose new block covers it:
    // the after blocks tile the group's region, each tile held by as many members as the
    // group's non-Shard dims of `after` have positions.
    std::int64_t copies = 1;
    for (int m : step.group) {
      if (!step.after.at(m).is_shard()) copies *= mesh.size(m);
    }
    volume.send = before.numel() * copies - own;
    return volume;
  }
  const StepGroup members(mesh, step.group, rank);
  const std::vector<std::int64_t> mine = mesh.coordinates(rank);
  for (std::int64_t j = holders.index(mesh, mine); j < members.size(); j += holders.count) {
    if (j == members.position()) continue;
    const std::int64_t other = members.member(j);
    if (holders.same_block(mine, mesh.coordinates(other))) continue;
    volume.send += intersect(before, local_layout(mesh, step.after, shape, other)).numel();
  }
  return volume;
}

}  // namespace meshtensor::plan
