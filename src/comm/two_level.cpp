#include <set>

#include <fmt/format.h>

#include <meshtensor/comm/two_level.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/fixed_point.hpp>

namespace meshtensor::comm {

namespace {
// What a two-level call passes to each level: the reduction of a sum, ordered or native as
// asked; integer limb sums (exact mode) are exact in any order.
CollectiveOptions level_options(const CollectiveOptions& options, ReduceOp op, ReductionMode mode) {
  CollectiveOptions out = options;
  out.op = op;
  out.mode = mode;
  return out;
}

ReduceOp summed(ReduceOp op) {
  return op == ReduceOp::avg ? ReduceOp::sum : op;
}

std::int64_t total(const std::vector<std::int64_t>& counts) {
  std::int64_t sum = 0;
  for (const std::int64_t c : counts)
    sum += c;
  return sum;
}

std::vector<std::int64_t> scaled(std::vector<std::int64_t> counts, std::int64_t by) {
  for (std::int64_t& c : counts)
    c *= by;
  return counts;
}

// The counts a call uses: the given ones, or `count` split evenly (describe_* checked that it
// divides).
std::vector<std::int64_t> counts_or_equal(std::vector<std::int64_t> counts, std::int64_t count,
                                          int size) {
  if (!counts.empty()) return counts;
  return std::vector<std::int64_t>(static_cast<std::size_t>(size), count / size);
}
}  // namespace

TwoLevelCommunicator::TwoLevelCommunicator(
    std::shared_ptr<Communicator> flat, std::shared_ptr<Communicator> inner,
    std::shared_ptr<Communicator> outer, std::vector<std::vector<int>> positions,
    GroupSpread spread, std::shared_ptr<const Topology> topology, TwoLevelChoice choice)
    : flat_(std::move(flat)),
      inner_(std::move(inner)),
      outer_(std::move(outer)),
      positions_(std::move(positions)),
      spread_(spread),
      topology_(std::move(topology)),
      choice_(choice) {
  if (!flat_ || !inner_ || !outer_ || positions_.empty())
    throw InvalidArgument("a two-level group needs its flat, inner and outer groups");
  std::set<int> seen;
  for (const auto& unit : positions_) {
    if (unit.size() != positions_.front().size()) {
      throw InvalidArgument(
          fmt::format("a two-level group needs as many members on every unit; "
                      "units hold {} and {}",
                      positions_.front().size(), unit.size()));
    }
    seen.insert(unit.begin(), unit.end());
  }
  if (static_cast<int>(seen.size()) != flat_->size() || *seen.begin() != 0 ||
      *seen.rbegin() != flat_->size() - 1 || inner_->size() * outer_->size() != flat_->size()) {
    throw InvalidArgument(
        fmt::format("two-level positions of {} units x {} do not cover a group "
                    "of {} once (inner {}, outer {})",
                    positions_.size(), positions_.front().size(), flat_->size(), inner_->size(),
                    outer_->size()));
  }
}

TwoLevelCommunicator::~TwoLevelCommunicator() {
  queue_.stop();
}

bool TwoLevelCommunicator::two_levels(RingKind kind, const CollectiveCall& call) const {
  if (choice_ == TwoLevelChoice::always) return true;
  if (!topology_) return false;
  const std::int64_t count = kind == RingKind::all_reduce ? call.count : total(call.segment_counts);
  const double bytes =
      static_cast<double>(count * static_cast<std::int64_t>(dtype_size(call.dtype)));
  const LocalCosts local;  // the planner's defaults
  return price_two_level(*topology_, spread_, kind, bytes, local, 0,
                         bytes / local.memory_bandwidth_bytes_s)
      .cheaper();
}

std::vector<std::int64_t> TwoLevelCommunicator::place_counts(
    const std::vector<std::int64_t>& counts) const {
  std::vector<std::int64_t> out(static_cast<std::size_t>(per_unit()), 0);
  for (const auto& unit : positions_) {
    for (std::size_t l = 0; l < unit.size(); ++l)
      out[l] += counts[static_cast<std::size_t>(unit[l])];
  }
  return out;
}

std::vector<std::int64_t> TwoLevelCommunicator::unit_counts(
    const std::vector<std::int64_t>& counts) const {
  std::vector<std::int64_t> out;
  const auto place = static_cast<std::size_t>(inner_->rank());
  for (const auto& unit : positions_)
    out.push_back(counts[static_cast<std::size_t>(unit[place])]);
  return out;
}

void TwoLevelCommunicator::reorder(const Tensor& from, const Tensor& to,
                                   const std::vector<std::int64_t>& counts, bool to_places) const {
  const std::int64_t width = from.numel() / std::max<std::int64_t>(1, total(counts));
  std::vector<std::int64_t> offset(counts.size(), 0);
  for (std::size_t p = 1; p < counts.size(); ++p)
    offset[p] = offset[p - 1] + counts[p - 1] * width;
  const Tensor flat_from = from.flatten();
  const Tensor flat_to = to.flatten();
  std::int64_t at = 0;
  for (int l = 0; l < per_unit(); ++l) {
    for (const auto& unit : positions_) {
      const auto p = static_cast<std::size_t>(unit[static_cast<std::size_t>(l)]);
      const std::int64_t n = counts[p] * width;
      if (n > 0) {
        if (to_places) {
          flat_to.narrow(0, at, n).copy_from(flat_from.narrow(0, offset[p], n));
        } else {
          flat_to.narrow(0, offset[p], n).copy_from(flat_from.narrow(0, at, n));
        }
      }
      at += n;
    }
  }
}

std::pair<Tensor, Tensor> TwoLevelCommunicator::agreed_fixed_point(
    const Tensor& values, const CollectiveOptions& options) {
  Tensor keys({values.numel()}, DType::u8);
  kernels::fixed_point_keys(values, keys);
  const CollectiveOptions max = level_options(options, ReduceOp::max, ReductionMode::ordered);
  inner_->all_reduce(keys, max);
  outer_->all_reduce(keys, max);
  Tensor fixed({values.numel() * kernels::fixed_point_format(values.dtype()).limbs}, DType::i64);
  kernels::encode_fixed_point(values, keys, fixed);
  return {std::move(keys), std::move(fixed)};
}

void TwoLevelCommunicator::divide_if_avg(Tensor result, const CollectiveOptions& options) const {
  if (options.op == ReduceOp::avg) kernels::divide(result, size());
}

void TwoLevelCommunicator::run_all_reduce(const Tensor& buffer, const CollectiveOptions& options) {
  const CollectiveCall call = describe_all_reduce(buffer, options, size());
  if (!two_levels(RingKind::all_reduce, call)) {
    flat_->all_reduce(buffer, options);
    return;
  }
  if (options.mode == ReductionMode::exact && uses_fixed_point(call)) {
    check_exact_addends(call, size());
    exact_all_reduce(buffer, options);
    return;
  }
  const Tensor values = buffer.flatten();
  const std::vector<std::int64_t> chunks = balanced_counts(values.numel(), per_unit());
  Tensor mine({chunks[static_cast<std::size_t>(inner_->rank())]}, buffer.dtype());
  const CollectiveOptions sum = level_options(options, summed(options.op), options.mode);
  inner_->reduce_scatter(values, mine, chunks, sum);
  outer_->all_reduce(mine, sum);
  inner_->all_gather(mine, values, chunks, options);
  divide_if_avg(buffer, options);
}

void TwoLevelCommunicator::exact_all_reduce(const Tensor& buffer,
                                            const CollectiveOptions& options) {
  const Tensor values = buffer.flatten();
  const std::int64_t count = values.numel();
  const auto [keys, fixed] = agreed_fixed_point(values, options);
  const std::int64_t limbs = kernels::fixed_point_format(buffer.dtype()).limbs;
  const std::vector<std::int64_t> chunks = balanced_counts(count, per_unit());
  const auto place = static_cast<std::size_t>(inner_->rank());
  const std::int64_t first = displacements(chunks)[place];
  Tensor mine({chunks[place] * limbs}, DType::i64);
  const CollectiveOptions sum = level_options(options, ReduceOp::sum, ReductionMode::ordered);
  inner_->reduce_scatter(fixed, mine, scaled(chunks, limbs), sum);
  outer_->all_reduce(mine, sum);
  Tensor rounded({chunks[place]}, buffer.dtype());
  kernels::decode_fixed_point(mine, keys.narrow(0, first, chunks[place]),
                              options.op == ReduceOp::avg ? size() : 1, rounded);
  inner_->all_gather(rounded, values, chunks, options);
}

void TwoLevelCommunicator::run_reduce_scatter(const Tensor& input, const Tensor& output,
                                              std::vector<std::int64_t> counts,
                                              const CollectiveOptions& options) {
  const CollectiveCall call =
      describe_reduce_scatter(input, output, counts, options, rank(), size());
  if (!two_levels(RingKind::reduce_scatter, call)) {
    flat_->reduce_scatter(input, output, std::move(counts), options);
    return;
  }
  counts = counts_or_equal(std::move(counts), input.numel(), size());
  if (options.mode == ReductionMode::exact && uses_fixed_point(call)) {
    check_exact_addends(call, size());
    exact_reduce_scatter(input, output, counts, options);
    return;
  }
  Tensor placed({input.numel()}, input.dtype());
  reorder(input, placed, counts, true);
  const std::vector<std::int64_t> places = place_counts(counts);
  Tensor mid({places[static_cast<std::size_t>(inner_->rank())]}, input.dtype());
  const CollectiveOptions sum = level_options(options, summed(options.op), options.mode);
  inner_->reduce_scatter(placed, mid, places, sum);
  outer_->reduce_scatter(mid, output.flatten(), unit_counts(counts), sum);
  divide_if_avg(output, options);
}

void TwoLevelCommunicator::exact_reduce_scatter(const Tensor& input, const Tensor& output,
                                                const std::vector<std::int64_t>& counts,
                                                const CollectiveOptions& options) {
  const Tensor values = input.flatten();
  const std::int64_t count = values.numel();
  const auto [keys, fixed] = agreed_fixed_point(values, options);
  const std::int64_t limbs = kernels::fixed_point_format(input.dtype()).limbs;
  Tensor placed({count * limbs}, DType::i64);
  reorder(fixed, placed, counts, true);
  const std::vector<std::int64_t> places = place_counts(counts);
  Tensor mid({places[static_cast<std::size_t>(inner_->rank())] * limbs}, DType::i64);
  const CollectiveOptions sum = level_options(options, ReduceOp::sum, ReductionMode::ordered);
  inner_->reduce_scatter(placed, mid, scaled(places, limbs), sum);
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  Tensor segment({mine * limbs}, DType::i64);
  outer_->reduce_scatter(mid, segment, scaled(unit_counts(counts), limbs), sum);
  const std::int64_t first = displacements(counts)[static_cast<std::size_t>(rank())];
  kernels::decode_fixed_point(segment, keys.narrow(0, first, mine),
                              options.op == ReduceOp::avg ? size() : 1, output.flatten());
}

void TwoLevelCommunicator::run_all_gather(const Tensor& input, const Tensor& output,
                                          std::vector<std::int64_t> counts,
                                          const CollectiveOptions& options) {
  const CollectiveCall call = describe_all_gather(input, output, counts, rank(), size());
  if (!two_levels(RingKind::all_gather, call)) {
    flat_->all_gather(input, output, std::move(counts), options);
    return;
  }
  counts = counts_or_equal(std::move(counts), output.numel(), size());
  const std::vector<std::int64_t> units = unit_counts(counts);
  Tensor mid({total(units)}, input.dtype());
  outer_->all_gather(input.flatten(), mid, units, options);
  Tensor placed({output.numel()}, output.dtype());
  inner_->all_gather(mid, placed, place_counts(counts), options);
  reorder(placed, output, counts, false);
}

void TwoLevelCommunicator::all_reduce(const Tensor& buffer, const CollectiveOptions& options) {
  queue_.run([&] { run_all_reduce(buffer, options); });
}

void TwoLevelCommunicator::reduce_scatter(const Tensor& input, const Tensor& output,
                                          std::vector<std::int64_t> counts,
                                          const CollectiveOptions& options) {
  queue_.run([&] { run_reduce_scatter(input, output, std::move(counts), options); });
}

void TwoLevelCommunicator::all_gather(const Tensor& input, const Tensor& output,
                                      std::vector<std::int64_t> counts,
                                      const CollectiveOptions& options) {
  queue_.run([&] { run_all_gather(input, output, std::move(counts), options); });
}

Work TwoLevelCommunicator::all_reduce_async(Tensor buffer, const CollectiveOptions& options) {
  describe_all_reduce(buffer, options, size());  // argument errors on the calling thread
  return queue_.submit([this, buffer, options] { run_all_reduce(buffer, options); });
}

Work TwoLevelCommunicator::reduce_scatter_async(Tensor input, Tensor output,
                                                std::vector<std::int64_t> counts,
                                                const CollectiveOptions& options) {
  describe_reduce_scatter(input, output, counts, options, rank(), size());
  return queue_.submit([this, input, output, counts, options] {
    run_reduce_scatter(input, output, counts, options);
  });
}

Work TwoLevelCommunicator::all_gather_async(Tensor input, Tensor output,
                                            std::vector<std::int64_t> counts,
                                            const CollectiveOptions& options) {
  describe_all_gather(input, output, counts, rank(), size());
  return queue_.submit(
      [this, input, output, counts, options] { run_all_gather(input, output, counts, options); });
}

Work TwoLevelCommunicator::all_to_all_async(Tensor input, Tensor output,
                                            std::vector<std::int64_t> send_counts,
                                            std::vector<std::int64_t> recv_counts,
                                            const CollectiveOptions& options) {
  describe_all_to_all(input, output, send_counts, recv_counts, size());
  return queue_.submit([this, input, output, send_counts, recv_counts, options] {
    flat_->all_to_all(input, output, send_counts, recv_counts, options);
  });
}

Work TwoLevelCommunicator::broadcast_async(Tensor buffer, int root,
                                           const CollectiveOptions& options) {
  describe_broadcast(buffer, root, size());
  return queue_.submit([this, buffer, root, options] { flat_->broadcast(buffer, root, options); });
}

Work TwoLevelCommunicator::barrier_async(const CollectiveOptions& options) {
  return queue_.submit([this, options] { flat_->barrier(options); });
}

std::shared_ptr<Communicator> TwoLevelCommunicator::split(std::int64_t color, std::int64_t key,
                                                          const CollectiveOptions& options) {
  std::shared_ptr<Communicator> out;
  queue_.run([&] { out = flat_->split(color, key, options); });
  return out;
}

}  // namespace meshtensor::comm
