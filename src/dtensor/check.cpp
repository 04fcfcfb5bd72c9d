#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include <meshtensor/comm/agree.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/dtensor/check.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/fixed_point.hpp>

namespace meshtensor::dtensor {

namespace {
std::vector<int> dims_where(const DeviceMesh& mesh, const std::function<bool(int)>& keep) {
  std::vector<int> dims;
  for (int m = 0; m < mesh.ndim(); ++m) {
    if (mesh.size(m) > 1 && keep(m)) dims.push_back(m);
  }
  return dims;
}

// The target's mesh dims by role (size-1 dims left out): Partial dims kept from the source,
// Partial dims new to the target (their positions hold pieces of one value), Replicate dims.
struct TargetDims {
  std::vector<int> kept;
  std::vector<int> fresh_partial;
  std::vector<int> replicate;
};

TargetDims target_dims(const CheckConfig& config) {
  const auto& from = config.from;
  const auto& to = config.to;
  return {dims_where(config.mesh,
                     [&](int m) { return from.at(m).is_partial() && to.at(m) == from.at(m); }),
          dims_where(config.mesh,
                     [&](int m) { return to.at(m).is_partial() && !(to.at(m) == from.at(m)); }),
          dims_where(config.mesh, [&](int m) { return to.at(m).is_replicate(); })};
}

double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::f64:
      return std::ldexp(1.0, -53);
    case DType::f32:
      return std::ldexp(1.0, -24);
    case DType::bf16:
      return std::ldexp(1.0, -8);
    case DType::f16:
      return std::ldexp(1.0, -11);
    default:
      return 0;
  }
}

// Element values of a tensor as doubles, row-major.
std::vector<double> values_of(const Tensor& tensor) {
  const Tensor f64 = kernels::convert(tensor, DType::f64);
  const auto data = f64.values<double>();
  return {data.begin(), data.end()};
}

// A failure found on this rank (empty: none).
struct Finding {
  std::string message;
  bool failed() const { return !message.empty(); }
};

// Per element of a block, in row-major order: its index in the global tensor.
template <class Fn>
void for_each_global_index(const Layout& layout, const Shape& shape, Fn&& fn) {
  const int rank = shape.rank();
  std::vector<std::int64_t> position(static_cast<std::size_t>(rank), 0);
  for (std::int64_t i = 0; i < layout.numel(); ++i) {
    std::int64_t global = 0;
    for (int d = 0; d < rank; ++d) {
      const auto k = static_cast<std::size_t>(d);
      global = global * shape[d] + layout.global_offset[k] + position[k];
    }
    fn(i, global);
    for (int d = rank - 1; d >= 0; --d) {
      const auto k = static_cast<std::size_t>(d);
      if (++position[k] < layout.local_shape[d]) break;
      position[k] = 0;
    }
  }
}

// The check of one rank: its block against a reference built from the contributions of that
// block alone (generated one at a time), so memory follows the block, not the global tensor.
class BlockCheck {
 public:
  BlockCheck(const CheckConfig& config, const plan::Plan& plan, std::int64_t rank)
      : config_(config), plan_(plan), mesh_(config.mesh), rank_(rank) {
    source_partial_ = config.from.partial_mesh_dims();
    TargetDims dims = target_dims(config);
    kept_ = std::move(dims.kept);
    fresh_partial_ = std::move(dims.fresh_partial);
    replicate_ = std::move(dims.replicate);
    op_ = ReduceOp::sum;
    for (int m : source_partial_) {
      const ReduceOp op = config.from.at(m).reduce_op();
      if (op == ReduceOp::max || op == ReduceOp::min) op_ = op;
    }
    layout_ = local_layout(mesh_, config.to, config.shape, rank);
    kept_position_ = mesh_.group_position(rank, kept_);
  }

  const std::vector<int>& fresh_partial() const { return fresh_partial_; }
  const std::vector<int>& replicate() const { return replicate_; }
  const Layout& layout() const { return layout_; }
  std::int64_t kept_position() const { return kept_position_; }
  // This rank verifies and adds to the digest: the first of its replicas, holding (once the
  // fresh Partial dims are combined) the value of its block.
  bool verifies() const {
    return mesh_.group_position(rank_, fresh_partial_) == 0 &&
           mesh_.group_position(rank_, replicate_) == 0;
  }

  // Target Partial dims the source did not have hold the value spread over their positions:
  // combined (in f64, over the group of those dims) to the value they stand for. Collective
  // over that group.
  Tensor combine_fresh(comm::MeshGroups& groups, const Tensor& block) const {
    if (fresh_partial_.empty()) return block;
    Tensor values = kernels::convert(block, DType::f64);
    const ReduceOp op = config_.to.at(fresh_partial_.front()).reduce_op();
    comm::CollectiveOptions options;
    options.op = op == ReduceOp::max || op == ReduceOp::min ? op : ReduceOp::sum;
    groups.group(fresh_partial_)->all_reduce(values, options);
    // Replicate -> Partial(avg) keeps the value on every member; the sum over the avg dims
    // divides by their sizes.
    std::int64_t divisor = 1;
    for (int m : fresh_partial_) {
      if (config_.to.at(m).reduce_op() == ReduceOp::avg) divisor *= mesh_.size(m);
    }
    if (divisor > 1) kernels::divide(values, static_cast<double>(divisor));
    return kernels::convert(values, config_.dtype);
  }

  Finding verify(const Tensor& result) const {
    const std::vector<std::int64_t> inputs = inputs_for(kept_position_);
    const bool floating = is_floating(config_.dtype);
    const bool bitwise = fresh_partial_.empty() &&
                         (inputs.size() == 1 || op_ == ReduceOp::max || op_ == ReduceOp::min ||
                          !floating || config_.mode == comm::ReductionMode::exact);
    if (bitwise) {
      const Tensor expected = floating && op_ == ReduceOp::sum &&
                                      config_.mode == comm::ReductionMode::exact &&
                                      inputs.size() > 1
                                  ? exact_reference(inputs)
                                  : combined_reference(inputs);
      if (!result.bitwise_equal(expected)) return mismatch(result, expected, "bit for bit");
      return {};
    }
    return within_bound(result, inputs);
  }

 private:
  Tensor contribution(std::int64_t j) const {
    Tensor block(layout_.local_shape, config_.dtype);
    fill_contribution(block, layout_, config_.shape, config_.seed, j);
    return block;
  }

  // Contributions j (source Partial positions) that make up kept position k.
  std::vector<std::int64_t> inputs_for(std::int64_t kept_position) const {
    std::vector<std::int64_t> inputs;
    const std::int64_t contributions = contribution_count(mesh_, config_.from);
    for (std::int64_t j = 0; j < contributions; ++j) {
      if (kept_position_of(j) == kept_position) inputs.push_back(j);
    }
    return inputs;
  }

  // Position along the kept dims of contribution j (j counts the source Partial positions).
  std::int64_t kept_position_of(std::int64_t j) const {
    std::int64_t position = 0;
    std::int64_t rest = j;
    std::vector<std::int64_t> coordinate(source_partial_.size());
    for (std::size_t i = source_partial_.size(); i-- > 0;) {
      const std::int64_t size = mesh_.size(source_partial_[i]);
      coordinate[i] = rest % size;
      rest /= size;
    }
    for (std::size_t i = 0; i < source_partial_.size(); ++i) {
      if (std::find(kept_.begin(), kept_.end(), source_partial_[i]) != kept_.end()) {
        position = position * mesh_.size(source_partial_[i]) + coordinate[i];
      }
    }
    return position;
  }

  // max/min, integer sums or a single input: exact in any order.
  Tensor combined_reference(const std::vector<std::int64_t>& inputs) const {
    Tensor expected = contribution(inputs.front());
    for (std::size_t i = 1; i < inputs.size(); ++i)
      kernels::accumulate(expected, contribution(inputs[i]), op_);
    if (plan_.avg_divisor > 1) kernels::divide(expected, static_cast<double>(plan_.avg_divisor));
    return expected;
  }

  // Correctly rounded (sum of inputs) / divisor, through the fixed-point kernels: the keys' max
  // over every input first, then the limbs' sum.
  Tensor exact_reference(const std::vector<std::int64_t>& inputs) const {
    const std::int64_t count = layout_.numel();
    const int limbs = kernels::fixed_point_format(config_.dtype).limbs;
    Tensor keys = Tensor::zeros({count}, DType::u8);
    Tensor own({count}, DType::u8);
    for (std::int64_t j : inputs) {
      kernels::fixed_point_keys(contribution(j).flatten(), own);
      kernels::accumulate(keys, own, ReduceOp::max);
    }
    Tensor sum = Tensor::zeros({count * limbs}, DType::i64);
    Tensor fixed({count * limbs}, DType::i64);
    for (std::int64_t j : inputs) {
      kernels::encode_fixed_point(contribution(j).flatten(), keys, fixed);
      kernels::accumulate(sum, fixed, ReduceOp::sum);
    }
    Tensor out(layout_.local_shape, config_.dtype);
    kernels::decode_fixed_point(sum, keys, plan_.avg_divisor, out.flatten());
    return out;
  }

  // Floating sums in ordered/native mode (and combined fresh Partial values): within the
  // rounding bound of the sum's length.
  Finding within_bound(const Tensor& result, const std::vector<std::int64_t>& inputs) const {
    const auto count = static_cast<std::size_t>(layout_.numel());
    std::vector<double> sum(count, 0.0);
    std::vector<double> magnitude(count, 0.0);
    bool first = true;
    for (std::int64_t j : inputs) {
      const std::vector<double> values = values_of(contribution(j));
      for (std::size_t i = 0; i < count; ++i) {
        if (op_ == ReduceOp::sum) {
          sum[i] += values[i];
          magnitude[i] += std::fabs(values[i]);
        } else {
          sum[i] = first                  ? values[i]
                   : op_ == ReduceOp::max ? std::max(sum[i], values[i])
                                          : std::min(sum[i], values[i]);
          magnitude[i] = std::fabs(sum[i]);
        }
      }
      first = false;
    }
    const bool floating = is_floating(config_.dtype);
    const double divisor = static_cast<double>(plan_.avg_divisor);
    const double u = unit_roundoff(config_.dtype);
    const std::vector<double> got = values_of(result);
    for (std::size_t i = 0; i < count; ++i) {
      const double expected = sum[i] / divisor;
      // Integers: an average rounds to the nearest integer once.
      const double bound =
          floating ? (static_cast<double>(inputs.size()) + 3) * 2 * u * magnitude[i] / divisor +
                         std::numeric_limits<float>::denorm_min()
                   : 0.5;
      if (!(std::fabs(got[i] - expected) <= bound)) {
        return {fmt::format(
            "rank {} (block {}), element {} of result {}: got {}, expected {} within {} ({} "
            "contributions)",
            rank_, layout_.to_string(), i, kept_position_, got[i], expected, bound, inputs.size())};
      }
    }
    return {};
  }

  Finding mismatch(const Tensor& got, const Tensor& expected, std::string_view how) const {
    const Tensor got_flat = got.flatten();
    const Tensor expected_flat = expected.flatten();
    std::int64_t first = 0;
    for (std::int64_t i = 0; i < got_flat.numel(); ++i) {
      if (!got_flat.narrow(0, i, 1).bitwise_equal(expected_flat.narrow(0, i, 1))) {
        first = i;
        break;
      }
    }
    const std::int64_t at[] = {first};
    return {fmt::format(
        "rank {} (block {}): result {} differs from the reference {} at element {}: got {}, "
        "expected {}",
        rank_, layout_.to_string(), kept_position_, how, first, got_flat.get(at),
        expected_flat.get(at))};
  }

  const CheckConfig& config_;
  const plan::Plan& plan_;
  const DeviceMesh& mesh_;
  const std::int64_t rank_;
  std::vector<int> source_partial_;
  std::vector<int> kept_;
  std::vector<int> fresh_partial_;
  std::vector<int> replicate_;
  ReduceOp op_ = ReduceOp::sum;
  Layout layout_;
  std::int64_t kept_position_ = 0;
};

// Part of the checksum of the assembled result: every element's hash of (kept position, global
// index, bits), summed with wrap-around. Sums of parts are the same however the elements are
// split over ranks, so the checksum does not depend on the mesh.
std::uint64_t checksum_part(const Tensor& block, const Layout& layout, const Shape& shape,
                            std::int64_t kept_position) {
  const Tensor dense = block.contiguous();
  const std::size_t element = dtype_size(dense.dtype());
  const std::byte* bytes = dense.bytes().data();
  const std::uint64_t salt = mix64(static_cast<std::uint64_t>(kept_position) + 0xC4EC);
  std::uint64_t sum = 0;
  for_each_global_index(layout, shape, [&](std::int64_t i, std::int64_t global) {
    std::uint64_t bits = 0;
    std::memcpy(&bits, bytes + static_cast<std::size_t>(i) * element, element);
    sum += mix64(mix64(salt ^ static_cast<std::uint64_t>(global)) ^ bits);
  });
  return sum;
}

// The first failure over all ranks (the lowest rank that found one), or none. Collective.
Finding first_failure(comm::Communicator& world, const Finding& mine) {
  Tensor rank = Tensor::zeros({1}, DType::i64);
  rank.values<std::int64_t>()[0] =
      mine.failed() ? world.rank() : std::numeric_limits<std::int64_t>::max();
  world.all_reduce(rank, {.op = ReduceOp::min});
  const std::int64_t failing = std::as_const(rank).values<std::int64_t>()[0];
  if (failing == std::numeric_limits<std::int64_t>::max()) return {};
  return {comm::broadcast_text(world, mine.message, static_cast<int>(failing))};
}
}  // namespace

std::int64_t contribution_count(const DeviceMesh& mesh, const PlacementSpec& spec) {
  return mesh.group_size(spec.partial_mesh_dims());
}

void fill_contribution(Tensor& block, const Layout& layout, const Shape& shape, std::uint64_t seed,
                       std::int64_t index) {
  const std::uint64_t stream = mix64(seed ^ mix64(static_cast<std::uint64_t>(index) + 0x51EDu));
  std::vector<double> values(static_cast<std::size_t>(layout.numel()));
  const bool floating = is_floating(block.dtype());
  const bool bytes = block.dtype() == DType::u8;
  for_each_global_index(layout, shape, [&](std::int64_t i, std::int64_t global) {
    const auto g = static_cast<std::uint64_t>(global);
    values[static_cast<std::size_t>(i)] =
        floating
            ? std::ldexp(normal_sample(stream, g),
                         static_cast<int>(uniform_int_sample(stream ^ 0xB1A5u, g, -6, 6)))
            : static_cast<double>(uniform_int_sample(stream, g, bytes ? 0 : -50, bytes ? 3 : 50));
  });
  block.copy_from(Tensor::from_values(layout.local_shape, block.dtype(), values));
}

double check_bytes(const CheckConfig& config, const plan::Plan& plan, std::int64_t ranks) {
  const auto element = static_cast<double>(dtype_size(config.dtype));
  const double source =
      static_cast<double>(max_local_shape(config.mesh, config.from, config.shape).numel());
  const double target =
      static_cast<double>(max_local_shape(config.mesh, config.to, config.shape).numel());
  // Exact plans with several reductions carry each element as int64 limbs plus a key lane.
  const double width = config.mode == comm::ReductionMode::exact && is_floating(config.dtype)
                           ? 8.0 * (kernels::fixed_point_format(config.dtype).limbs + 1) / element
                           : 1.0;
  const double working = 2.0 * static_cast<double>(plan.peak_bytes_per_rank) * width;
  constexpr double kPerRankOverhead = 256 << 10;  // thread, queue, plan, groups
  const double held = source * element + target * element + working + kPerRankOverhead;
  // The reference of a verified block: a contribution, the expected values and the f64 sums,
  // magnitudes or limbs. One rank of each set of replicas verifies.
  const double reference = target * (2 * element + 48);
  const TargetDims dims = target_dims(config);
  const std::int64_t verifying = config.mesh.size() / config.mesh.group_size(dims.replicate) /
                                 config.mesh.group_size(dims.fresh_partial);
  return static_cast<double>(ranks) * held +
         static_cast<double>(std::min(ranks, verifying)) * reference;
}

CheckResult run_check(const std::shared_ptr<comm::Communicator>& world, const CheckConfig& config) {
  if (world->size() != config.mesh.size()) {
    throw InvalidArgument(fmt::format("mesh {} has {} ranks, but the world has {}",
                                      config.mesh.to_string(), config.mesh.size(), world->size()));
  }
  config.from.validate(config.mesh, config.shape.rank());
  config.to.validate(config.mesh, config.shape.rank());
  auto groups = std::make_shared<comm::MeshGroups>(config.mesh, world);
  const std::int64_t rank = groups->rank();

  const Layout source = local_layout(config.mesh, config.from, config.shape, rank);
  Tensor local(source.local_shape, config.dtype);
  fill_contribution(local, source, config.shape, config.seed,
                    config.mesh.group_position(rank, config.from.partial_mesh_dims()));

  RedistributeOptions options;
  options.mode = config.mode;
  options.merge = config.merge;
  const auto plan = plan_for(*groups, config.from, config.to, config.shape, config.dtype, options);
  const Tensor result = from_local(local, groups, config.from, config.shape)
                            .redistribute(config.to, options)
                            .local()
                            .contiguous();
  local = Tensor();

  const BlockCheck check(config, *plan, rank);
  Finding finding;
  // Replicas of a block hold the same bits: each compares its digest with the first replica's.
  if (!check.replicate().empty()) {
    Tensor digest = Tensor::zeros({1}, DType::i64);
    const std::uint64_t mine = result.digest();
    std::memcpy(digest.bytes().data(), &mine, sizeof mine);
    groups->group(check.replicate())->broadcast(digest, 0);
    std::uint64_t first = 0;
    std::memcpy(&first, digest.bytes().data(), sizeof first);
    if (first != mine) {
      const std::int64_t canonical = config.mesh.group_ranks(rank, check.replicate()).front();
      finding.message =
          fmt::format("rank {} and its replica rank {} hold different bits for block {}", rank,
                      canonical, check.layout().to_string());
    }
  }
  const Tensor value = check.combine_fresh(*groups, result);
  std::uint64_t checksum = 0;
  if (check.verifies()) {
    if (!finding.failed()) finding = check.verify(value);
    checksum = checksum_part(value, check.layout(), config.shape, check.kept_position());
  }
  const Finding failure = first_failure(*world, finding);

  Tensor total = Tensor::zeros({1}, DType::i64);
  std::memcpy(total.bytes().data(), &checksum, sizeof checksum);
  world->all_reduce(total, {.op = ReduceOp::sum});  // integer sums wrap: the same on every rank
  std::uint64_t digest = 0;
  std::memcpy(&digest, total.bytes().data(), sizeof digest);
  const std::int64_t kept_positions = config.mesh.group_size(target_dims(config).kept);
  CheckResult out;
  out.ok = !failure.failed();
  out.digest = digest_hex(mix64(digest ^ mix64(static_cast<std::uint64_t>(kept_positions))));
  out.message = failure.failed() ? failure.message : "every rank matches the reference";
  out.collectives = plan->collectives();
  for (const plan::Step& step : plan->steps)
    out.two_level += step.two_level ? 1 : 0;
  return out;
}

}  // namespace meshtensor::dtensor
