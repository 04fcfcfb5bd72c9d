#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

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

// Correctly rounded (sum of inputs) / divisor, through the fixed-point kernels.
Tensor exact_reference(const std::vector<Tensor>& inputs, std::int64_t divisor) {
  const DType dtype = inputs.front().dtype();
  const std::int64_t count = inputs.front().numel();
  const int limbs = kernels::fixed_point_format(dtype).limbs;
  Tensor keys = Tensor::zeros({count}, DType::u8);
  for (const Tensor& input : inputs) {
    Tensor mine({count}, DType::u8);
    kernels::fixed_point_keys(input.flatten(), mine);
    kernels::accumulate(keys, mine, ReduceOp::max);
  }
  Tensor sum = Tensor::zeros({count * limbs}, DType::i64);
  for (const Tensor& input : inputs) {
    Tensor fixed({count * limbs}, DType::i64);
    kernels::encode_fixed_point(input.flatten(), keys, fixed);
    kernels::accumulate(sum, fixed, ReduceOp::sum);
  }
  Tensor out(inputs.front().shape(), dtype);
  kernels::decode_fixed_point(sum, keys, divisor, out.flatten());
  return out;
}

struct Verdict {
  bool ok = true;
  std::string message;
  std::uint64_t digest = 0;
};

class Reference {
 public:
  Reference(const CheckConfig& config, const plan::Plan& plan)
      : config_(config), plan_(plan), mesh_(config.mesh) {
    source_partial_ = config.from.partial_mesh_dims();
    kept_ = dims_where(mesh_, [&](int m) {
      return config.from.at(m).is_partial() && config.to.at(m) == config.from.at(m);
    });
    fresh_partial_ = dims_where(mesh_, [&](int m) {
      return config.to.at(m).is_partial() && !(config.to.at(m) == config.from.at(m));
    });
    replicate_ = dims_where(mesh_, [&](int m) { return config.to.at(m).is_replicate(); });
    const std::int64_t contributions = contribution_count(mesh_, config.from);
    const Layout whole{config.shape,
                       std::vector<std::int64_t>(static_cast<std::size_t>(config.shape.rank()), 0)};
    for (std::int64_t j = 0; j < contributions; ++j) {
      Tensor tensor(config.shape, config.dtype);
      fill_contribution(tensor, whole, config.shape, config.seed, j);
      contributions_.push_back(std::move(tensor));
    }
    op_ = ReduceOp::sum;
    for (int m : source_partial_) {
      const ReduceOp op = config.from.at(m).reduce_op();
      if (op == ReduceOp::max || op == ReduceOp::min) op_ = op;
    }
  }

  // Verifies the gathered blocks (rank r's block at offset displacements[r]).
  Verdict verify(const Tensor& gathered, const std::vector<std::int64_t>& displacements) const {
    Verdict verdict;
    const std::int64_t kept_positions = mesh_.group_size(kept_);
    const std::int64_t fresh_positions = mesh_.group_size(fresh_partial_);
    Digest64 digest;
    digest.update_u64(static_cast<std::uint64_t>(kept_positions));
    for (std::int64_t k = 0; k < kept_positions; ++k) {
      std::vector<Tensor> assembled;
      for (std::int64_t n = 0; n < fresh_positions; ++n)
        assembled.push_back(Tensor::zeros(config_.shape, config_.dtype));
      for (std::int64_t r = 0; r < mesh_.size(); ++r) {
        if (mesh_.group_position(r, kept_) != k) continue;
        const Layout layout = local_layout(mesh_, config_.to, config_.shape, r);
        const Tensor block = block_of(gathered, displacements, r, layout);
        const std::int64_t canonical = canonical_rank(r);
        if (canonical != r) {
          const Tensor reference_block =
              block_of(gathered, displacements, canonical,
                       local_layout(mesh_, config_.to, config_.shape, canonical));
          if (!block.bitwise_equal(reference_block)) {
            verdict.ok = false;
            verdict.message =
                fmt::format("rank {} and its replica rank {} hold different bits for block {}", r,
                            canonical, layout.to_string());
            return verdict;
          }
          continue;
        }
        local_view(assembled[static_cast<std::size_t>(mesh_.group_position(r, fresh_partial_))],
                   layout)
            .copy_from(block);
      }
      const Tensor result = combine_fresh(assembled);
      if (!compare(result, k, verdict)) return verdict;
      digest.update(result.bytes());
    }
    verdict.digest = digest.finish();
    verdict.message = "every rank matches the reference";
    return verdict;
  }

 private:
  Tensor block_of(const Tensor& gathered, const std::vector<std::int64_t>& displacements,
                  std::int64_t rank, const Layout& layout) const {
    Tensor flat = gathered.narrow(0, displacements[static_cast<std::size_t>(rank)], layout.numel());
    Tensor block(layout.local_shape, config_.dtype);
    std::memcpy(block.bytes().data(), flat.bytes().data(), flat.nbytes());
    return block;
  }

  std::int64_t canonical_rank(std::int64_t rank) const {
    std::vector<std::int64_t> coordinates = mesh_.coordinates(rank);
    for (int m : replicate_)
      coordinates[static_cast<std::size_t>(m)] = 0;
    return mesh_.rank_at(coordinates);
  }

  // Target Partial dims the source did not have hold the value spread over their positions:
  // combine them (in f64) to the value they stand for.
  Tensor combine_fresh(const std::vector<Tensor>& assembled) const {
    if (assembled.size() == 1) return assembled.front();
    std::vector<double> values = values_of(assembled.front());
    const ReduceOp op = config_.to.at(fresh_partial_.front()).reduce_op();
    for (std::size_t n = 1; n < assembled.size(); ++n) {
      const std::vector<double> more = values_of(assembled[n]);
      for (std::size_t i = 0; i < values.size(); ++i) {
        if (op == ReduceOp::max) {
          values[i] = std::max(values[i], more[i]);
        } else if (op == ReduceOp::min) {
          values[i] = std::min(values[i], more[i]);
        } else {
          values[i] += more[i];
        }
      }
    }
    bool averages = false;
    for (int m : fresh_partial_)
      averages = averages || config_.to.at(m).reduce_op() == ReduceOp::avg;
    if (averages) {
      // Replicate -> Partial(avg) keeps the value on every member; the sum over the avg dims
      // divides by their sizes.
      std::int64_t divisor = 1;
      for (int m : fresh_partial_) {
        if (config_.to.at(m).reduce_op() == ReduceOp::avg) divisor *= mesh_.size(m);
      }
      for (double& value : values)
        value /= static_cast<double>(divisor);
    }
    return Tensor::from_values(config_.shape, config_.dtype, values);
  }

  std::vector<const Tensor*> inputs_for(std::int64_t kept_position) const {
    std::vector<const Tensor*> inputs;
    for (std::int64_t j = 0; j < static_cast<std::int64_t>(contributions_.size()); ++j) {
      if (kept_position_of(j) == kept_position) {
        inputs.push_back(&contributions_[static_cast<std::size_t>(j)]);
      }
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

  bool compare(const Tensor& result, std::int64_t kept_position, Verdict& verdict) const {
    const std::vector<const Tensor*> inputs = inputs_for(kept_position);
    const bool floating = is_floating(config_.dtype);
    const bool bitwise = fresh_partial_.empty() &&
                         (inputs.size() == 1 || op_ == ReduceOp::max || op_ == ReduceOp::min ||
                          !floating || config_.mode == comm::ReductionMode::exact);
    if (bitwise) {
      Tensor expected = inputs.front()->clone();
      if (floating && op_ == ReduceOp::sum && config_.mode == comm::ReductionMode::exact &&
          inputs.size() > 1) {
        std::vector<Tensor> copies;
        for (const Tensor* input : inputs)
          copies.push_back(*input);
        expected = exact_reference(copies, plan_.avg_divisor);
      } else {
        for (std::size_t i = 1; i < inputs.size(); ++i)
          kernels::accumulate(expected, *inputs[i], op_);
        if (plan_.avg_divisor > 1)
          kernels::divide(expected, static_cast<double>(plan_.avg_divisor));
      }
      if (!result.bitwise_equal(expected)) {
        return fail(verdict, result, expected, kept_position, "bit for bit");
      }
      return true;
    }
    // Floating sums in ordered/native mode: within the rounding bound of the sum's length.
    std::vector<double> sum(static_cast<std::size_t>(result.numel()), 0.0);
    std::vector<double> magnitude(sum.size(), 0.0);
    for (const Tensor* input : inputs) {
      const std::vector<double> values = values_of(*input);
      for (std::size_t i = 0; i < sum.size(); ++i) {
        if (op_ == ReduceOp::sum) {
          sum[i] += values[i];
          magnitude[i] += std::fabs(values[i]);
        } else {
          sum[i] = input == inputs.front() ? values[i]
                   : op_ == ReduceOp::max  ? std::max(sum[i], values[i])
                                           : std::min(sum[i], values[i]);
          magnitude[i] = std::fabs(sum[i]);
        }
      }
    }
    const double divisor = static_cast<double>(plan_.avg_divisor);
    const double u = unit_roundoff(config_.dtype);
    const std::vector<double> got = values_of(result);
    for (std::size_t i = 0; i < sum.size(); ++i) {
      const double expected = sum[i] / divisor;
      // Integers: an average rounds to the nearest integer once.
      const double bound =
          floating ? (static_cast<double>(inputs.size()) + 3) * 2 * u * magnitude[i] / divisor +
                         std::numeric_limits<float>::denorm_min()
                   : 0.5;
      if (!(std::fabs(got[i] - expected) <= bound)) {
        verdict.ok = false;
        verdict.message =
            fmt::format("element {} of result {}: got {}, expected {} within {} ({} contributions)",
                        i, kept_position, got[i], expected, bound, inputs.size());
        return false;
      }
    }
    return true;
  }

  static bool fail(Verdict& verdict, const Tensor& got, const Tensor& expected,
                   std::int64_t kept_position, std::string_view how) {
    const std::vector<double> a = values_of(got);
    const std::vector<double> b = values_of(expected);
    std::size_t first = 0;
    const Tensor got_flat = got.flatten();
    const Tensor expected_flat = expected.flatten();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const auto index = static_cast<std::int64_t>(i);
      if (!got_flat.narrow(0, index, 1).bitwise_equal(expected_flat.narrow(0, index, 1))) {
        first = i;
        break;
      }
    }
    verdict.ok = false;
    verdict.message =
        fmt::format("result {} differs from the reference {} at element {}: got {}, expected {}",
                    kept_position, how, first, a[first], b[first]);
    return false;
  }

  const CheckConfig& config_;
  const plan::Plan& plan_;
  const DeviceMesh& mesh_;
  std::vector<int> source_partial_;
  std::vector<int> kept_;
  std::vector<int> fresh_partial_;
  std::vector<int> replicate_;
  std::vector<Tensor> contributions_;
  ReduceOp op_ = ReduceOp::sum;
};
}  // namespace

std::int64_t contribution_count(const DeviceMesh& mesh, const PlacementSpec& spec) {
  return mesh.group_size(spec.partial_mesh_dims());
}

void fill_contribution(Tensor& block, const Layout& layout, const Shape& shape, std::uint64_t seed,
                       std::int64_t index) {
  const std::uint64_t stream = mix64(seed ^ mix64(static_cast<std::uint64_t>(index) + 0x51EDu));
  const std::int64_t count = layout.numel();
  std::vector<double> values(static_cast<std::size_t>(count));
  const int rank = shape.rank();
  std::vector<std::int64_t> position(static_cast<std::size_t>(rank), 0);
  for (std::int64_t i = 0; i < count; ++i) {
    std::int64_t global = 0;
    for (int d = 0; d < rank; ++d) {
      const auto k = static_cast<std::size_t>(d);
      global = global * shape[d] + layout.global_offset[k] + position[k];
    }
    const auto g = static_cast<std::uint64_t>(global);
    double value = 0;
    if (is_floating(block.dtype())) {
      value = std::ldexp(normal_sample(stream, g),
                         static_cast<int>(uniform_int_sample(stream ^ 0xB1A5u, g, -6, 6)));
    } else {
      value = static_cast<double>(uniform_int_sample(
          stream, g, block.dtype() == DType::u8 ? 0 : -50, block.dtype() == DType::u8 ? 3 : 50));
    }
    values[static_cast<std::size_t>(i)] = value;
    for (int d = rank - 1; d >= 0; --d) {
      const auto k = static_cast<std::size_t>(d);
      if (++position[k] < layout.local_shape[d]) break;
      position[k] = 0;
    }
  }
  block.copy_from(Tensor::from_values(layout.local_shape, block.dtype(), values));
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
  const auto plan =
      plan_for(config.mesh, config.from, config.to, config.shape, config.dtype, options);
  const DTensor result =
      from_local(local, groups, config.from, config.shape).redistribute(config.to, options);

  std::vector<std::int64_t> counts;
  std::vector<std::int64_t> displacements;
  std::int64_t total = 0;
  for (std::int64_t r = 0; r < config.mesh.size(); ++r) {
    counts.push_back(local_layout(config.mesh, config.to, config.shape, r).numel());
    displacements.push_back(total);
    total += counts.back();
  }
  Tensor gathered({total}, config.dtype);
  world->all_gather(result.local().contiguous().flatten(), gathered, counts);

  // Rank 0 verifies; the verdict goes to everyone.
  constexpr std::int64_t kMessageBytes = 1024;
  Tensor verdict_bytes = Tensor::zeros({9 + kMessageBytes}, DType::u8);
  if (rank == 0) {
    const Verdict verdict = Reference(config, *plan).verify(gathered, displacements);
    auto out = verdict_bytes.values<std::uint8_t>();
    out[0] = verdict.ok ? 1 : 0;
    std::memcpy(&out[1], &verdict.digest, 8);
    std::memcpy(&out[9], verdict.message.data(),
                std::min<std::size_t>(verdict.message.size(), kMessageBytes - 1));
  }
  world->broadcast(verdict_bytes, 0);
  const auto in = std::as_const(verdict_bytes).values<std::uint8_t>();
  CheckResult out;
  out.ok = in[0] == 1;
  std::uint64_t digest = 0;
  std::memcpy(&digest, &in[1], 8);
  out.digest = digest_hex(digest);
  out.message = std::string(reinterpret_cast<const char*>(&in[9]));
  out.collectives = plan->collectives();
  return out;
}

}  // namespace meshtensor::dtensor
