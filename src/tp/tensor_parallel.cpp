#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/comm/binned_reduction.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/plan/plan.hpp>
#include <meshtensor/tp/tensor_parallel.hpp>

namespace meshtensor::tp {

void CommLog::add(CommEvent event) {
  if (enabled_) events_.push_back(std::move(event));
}

std::int64_t CommLog::count(const std::string& collective, const std::string& phase) const {
  return std::count_if(events_.begin(), events_.end(), [&](const CommEvent& e) {
    return e.collective == collective && (phase.empty() || e.phase == phase);
  });
}

std::string CommLog::to_text() const {
  std::string text;
  for (const CommEvent& e : events_) {
    text += fmt::format("{:<9} {:<22} {:<15} {:<40} {} bytes\n", e.phase, e.module, e.collective,
                        e.what, e.bytes);
  }
  return text;
}

namespace {

comm::MeshGroups tp_groups(const std::shared_ptr<comm::Communicator>& group) {
  return comm::MeshGroups(DeviceMesh({group->size()}, {"tp"}), group);
}

}  // namespace

TensorParallel::TensorParallel(std::shared_ptr<comm::Communicator> group, comm::ReductionMode mode,
                               bool sequence_parallel)
    : group_(std::move(group)),
      groups_(tp_groups(group_)),
      mode_(mode),
      sequence_parallel_(sequence_parallel) {}

void TensorParallel::note(CommEvent event) {
  if (dtensor::CommDebugMode* mode = dtensor::CommDebugMode::active())
    mode->add_collective(
        {event.collective, {"tp"}, size(), event.bytes, event.module + " " + event.what});
  log_.add(std::move(event));
}

Tensor TensorParallel::redistribute(const Tensor& local, const Shape& global_shape,
                                    const Placement& from, const Placement& to,
                                    const std::string& module, const std::string& phase,
                                    const std::string& what) {
  dtensor::RedistributeOptions options;
  options.mode = mode_;
  const PlacementSpec source({from});
  const PlacementSpec target({to});
  const auto plan =
      dtensor::plan_for(groups_, source, target, global_shape, local.dtype(), options);
  for (const plan::Step& step : plan->steps) {
    if (!plan::is_collective(step.kind)) continue;
    log_.add({module, phase, what, std::string(plan::step_kind_name(step.kind)),
              step.traffic.send_bytes.at(static_cast<std::size_t>(rank()))});
  }
  if (dtensor::CommDebugMode* mode = dtensor::CommDebugMode::active())
    mode->add_plan(*plan, rank(), module + " " + what);
  return dtensor::execute_plan(*plan, groups_, local.contiguous(), options);
}

namespace {

/// Bytes of one element's binned state (its bin and three digit sums).
constexpr std::int64_t kBinnedElementBytes = sizeof(std::int32_t) + 3 * sizeof(double);

/// `sums` of a tensor [outer, length, inner] reordered to [length, outer, inner], so that a chunk
/// of the length dim is one contiguous segment.
kernels::BinnedSums length_major(const kernels::BinnedSums& sums, std::int64_t outer,
                                 std::int64_t length, std::int64_t inner) {
  const std::int64_t count = sums.count();
  kernels::BinnedSums out = kernels::BinnedSums::uninitialized(count);
  const std::int32_t* bins = sums.bins.values<std::int32_t>().data();
  const double* digits = sums.digits.values<double>().data();
  std::int32_t* out_bins = out.bins.values<std::int32_t>().data();
  double* out_digits = out.digits.values<double>().data();
  for (std::int64_t o = 0; o < outer; ++o) {
    for (std::int64_t t = 0; t < length; ++t) {
      const std::int64_t from = (o * length + t) * inner;
      const std::int64_t to = (t * outer + o) * inner;
      std::copy_n(bins + from, inner, out_bins + to);
      for (std::int64_t plane = 0; plane < 3; ++plane)
        std::copy_n(digits + plane * count + from, inner, out_digits + plane * count + to);
    }
  }
  return out;
}

}  // namespace

Tensor TensorParallel::complete_exact(kernels::BinnedSums& sums, const Shape& shape,
                                      const Placement& to, const std::string& module,
                                      const std::string& phase, const std::string& what) {
  const std::int64_t n = size();
  const std::string label = module + " " + what;
  if (to.is_replicate()) {
    Tensor whole = Tensor::uninitialized(shape, DType::f32);
    comm::reduce_binned_sums(*group_, sums, 1, whole, label);
    note({module, phase, what, "all_reduce",
          shape.numel() * (n - 1) / n * (kBinnedElementBytes + 4)});
    return whole;
  }
  // Reduce-scatter: each rank merges and rounds only its chunk of dim `dim`.
  const int dim = to.shard_dim();
  std::int64_t outer = 1;
  std::int64_t inner = 1;
  for (int d = 0; d < shape.rank(); ++d)
    (d < dim ? outer : inner) *= d == dim ? 1 : shape[d];
  std::vector<std::int64_t> counts;
  for (std::int64_t r = 0; r < n; ++r)
    counts.push_back(chunk_extent(shape[dim], n, r).size * outer * inner);
  kernels::BinnedSums reordered;
  kernels::BinnedSums& segments =
      outer == 1 ? sums : (reordered = length_major(sums, outer, shape[dim], inner));
  const std::int64_t held = chunk_extent(shape[dim], n, rank()).size;
  Tensor segment = Tensor::uninitialized(Shape{held, outer, inner}, DType::f32);
  kernels::BinnedSums received;
  comm::reduce_scatter_binned_sums(*group_, segments, counts, 1, segment.flatten(), label,
                                   received);
  note({module, phase, what, "reduce_scatter", shape.numel() * (n - 1) / n * kBinnedElementBytes});
  std::vector<std::int64_t> dims = shape.dims();
  dims[static_cast<std::size_t>(dim)] = held;
  Tensor out = Tensor::uninitialized(Shape(dims), DType::f32);
  // [held, outer, inner] back to [outer..., held, inner...].
  const float* in = segment.values<float>().data();
  float* o = out.values<float>().data();
  for (std::int64_t b = 0; b < outer; ++b)
    for (std::int64_t t = 0; t < held; ++t)
      std::copy_n(in + (t * outer + b) * inner, inner, o + (b * held + t) * inner);
  return out;
}

void all_reduce_values(comm::Communicator& group, std::span<double> values, ReduceOp op,
                       comm::ReductionMode mode, const std::string& label,
                       std::chrono::milliseconds timeout) {
  Tensor buffer =
      Tensor::uninitialized(Shape{static_cast<std::int64_t>(values.size())}, DType::f64);
  std::copy(values.begin(), values.end(), buffer.values<double>().begin());
  comm::CollectiveOptions options;
  options.op = op;
  options.mode = op == ReduceOp::sum ? mode : comm::ReductionMode::ordered;
  options.timeout = timeout;
  options.label = label;
  group.all_reduce(buffer, options);
  const auto out = buffer.values<double>();
  std::copy(out.begin(), out.end(), values.begin());
}

void all_reduce_binned_values(comm::Communicator& group, kernels::BinnedSums& sums,
                              std::span<double> rounded, const std::string& label) {
  Tensor out = Tensor::uninitialized(Shape{sums.count()}, DType::f64);
  comm::reduce_binned_sums(group, sums, 1, out, label);
  const auto values = out.values<double>();
  std::copy(values.begin(), values.end(), rounded.begin());
}

void TensorParallel::all_reduce(std::span<double> values, ReduceOp op, const std::string& module,
                                const std::string& what) {
  all_reduce_values(*group_, values, op, mode_, module + " " + what);
  note({module, "forward", what, "all_reduce",
        static_cast<std::int64_t>(values.size() * sizeof(double))});
}

void TensorParallel::all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded,
                                      const std::string& module, const std::string& what) {
  all_reduce_binned_values(*group_, sums, rounded, module + " " + what);
  note({module, "forward", what, "all_reduce", sums.count() * kBinnedElementBytes});
}

VocabularySplit::VocabularySplit(TensorParallel& tp, std::int64_t classes)
    : tp_(tp), classes_(classes) {}

std::int64_t VocabularySplit::first_class() const {
  return chunk_extent(classes_, tp_.size(), tp_.rank()).offset;
}

void VocabularySplit::all_reduce(std::span<double> values, ReduceOp op) {
  tp_.all_reduce(values, op, "loss", fmt::format("vocabulary {}", reduce_op_name(op)));
}

void VocabularySplit::all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded) {
  tp_.all_reduce_exact(sums, rounded, "loss", "softmax denominators");
}

nn::CrossEntropyResult parallel_cross_entropy(const Tensor& logits,
                                              std::span<const std::int32_t> labels,
                                              TensorParallel* tp, std::int64_t classes,
                                              bool exact_sums) {
  nn::CrossEntropyOptions options;
  options.exact_sums = exact_sums;
  std::unique_ptr<VocabularySplit> split;
  if (tp != nullptr && tp->size() > 1) {
    split = std::make_unique<VocabularySplit>(*tp, classes);
    options.split = split.get();
  }
  return nn::softmax_cross_entropy(logits, labels, options);
}

Tensor gather_classes(TensorParallel& tp, const Tensor& local, std::int64_t classes) {
  std::vector<std::int64_t> dims = local.shape().dims();
  const int last = static_cast<int>(dims.size()) - 1;
  dims.back() = classes;
  return tp.redistribute(local, Shape(dims), Placement::shard(last), Placement::replicate(), "head",
                         "forward", "logits Shard(-1) -> Replicate");
}

}  // namespace meshtensor::tp
