#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/dtensor/comm_debug.hpp>
#include <meshtensor/dtensor/redistribute.hpp>
#include <meshtensor/fsdp/reduction.hpp>
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

Tensor TensorParallel::redistribute(const Tensor& local, const Shape& global_shape,
                                    const Placement& from, const Placement& to,
                                    const std::string& module, const std::string& phase,
                                    const std::string& what) {
  dtensor::RedistributeOptions options;
  options.mode = mode_;
  const PlacementSpec source({from});
  const PlacementSpec target({to});
  const auto plan =
      dtensor::plan_for(groups_.mesh(), source, target, global_shape, local.dtype(), options);
  if (log_.enabled()) {
    for (const plan::Step& step : plan->steps) {
      if (!plan::is_collective(step.kind)) continue;
      log_.add({module, phase, what, std::string(plan::step_kind_name(step.kind)),
                step.traffic.send_bytes.at(static_cast<std::size_t>(rank()))});
    }
  }
  if (dtensor::CommDebugMode* mode = dtensor::CommDebugMode::active())
    mode->add_plan(*plan, rank(), module + " " + what);
  return dtensor::execute_plan(*plan, groups_, local.contiguous(), options);
}

Tensor TensorParallel::complete_exact(kernels::BinnedSums& sums, const Shape& shape,
                                      const Placement& to, const std::string& module,
                                      const std::string& phase, const std::string& what) {
  Tensor whole = Tensor::uninitialized(shape, DType::f32);
  fsdp::reduce_binned_sums(*group_, sums, 1, whole, module + " " + what);
  const std::int64_t n = size();
  log_.add({module, phase, what, to.is_replicate() ? "all_reduce" : "reduce_scatter",
            shape.numel() * (n - 1) / n * static_cast<std::int64_t>(sizeof(float) * 8)});
  if (to.is_replicate()) return whole;
  const int dim = to.shard_dim();
  const Chunk chunk = chunk_extent(shape[dim], n, rank());
  return whole.narrow(dim, chunk.offset, chunk.size).contiguous();
}

void TensorParallel::all_reduce(std::span<double> values, ReduceOp op, const std::string& module,
                                const std::string& what) {
  Tensor buffer =
      Tensor::uninitialized(Shape{static_cast<std::int64_t>(values.size())}, DType::f64);
  std::copy(values.begin(), values.end(), buffer.values<double>().begin());
  comm::CollectiveOptions options;
  options.op = op;
  options.mode = op == ReduceOp::sum ? mode_ : comm::ReductionMode::ordered;
  options.label = module + " " + what;
  group_->all_reduce(buffer, options);
  const auto out = buffer.values<double>();
  std::copy(out.begin(), out.end(), values.begin());
  log_.add({module, "forward", what, "all_reduce",
            static_cast<std::int64_t>(values.size() * sizeof(double))});
}

void TensorParallel::all_reduce_exact(kernels::BinnedSums& sums, std::span<double> rounded,
                                      const std::string& module, const std::string& what) {
  Tensor out = Tensor::uninitialized(Shape{sums.count()}, DType::f64);
  fsdp::reduce_binned_sums(*group_, sums, 1, out, module + " " + what);
  const auto values = out.values<double>();
  std::copy(values.begin(), values.end(), rounded.begin());
  log_.add({module, "forward", what, "all_reduce", sums.count() * 32});
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
