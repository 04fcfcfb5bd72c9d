#include <algorithm>

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

// A placed copy of `value` into `target`, or `target` combined with it.
void add_or_copy(Tensor target, const Tensor& value, bool copy, ReduceOp op) {
  if (target.numel() == 0) return;
  if (copy) {
    target.copy_from(value);
  } else {
    kernels::accumulate(target, value, op);
  }
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
    GroupSpread spread, std::shared_ptr<const Topology> topology, TwoLevelChoice choice,
    LocalCosts local, bool splits_alike)
    : flat_(std::move(flat)),
      inner_(std::move(inner)),
      outer_(std::move(outer)),
      positions_(std::move(positions)),
      spread_(spread),
      topology_(std::move(topology)),
      choice_(choice),
      local_(local),
      splits_alike_(splits_alike) {
  if (!flat_ || !inner_ || !outer_ || positions_.empty())
    throw InvalidArgument("a two-level group needs its flat, inner and outer groups");
  const auto size = static_cast<std::size_t>(flat_->size());
  unit_of_.assign(size, -1);
  place_of_.assign(size, -1);
  bool uniform = true;
  for (std::size_t u = 0; u < positions_.size(); ++u) {
    uniform = uniform && positions_[u].size() == positions_.front().size();
    for (std::size_t l = 0; l < positions_[u].size(); ++l) {
      const int p = positions_[u][l];
      if (p < 0 || static_cast<std::size_t>(p) >= size ||
          unit_of_[static_cast<std::size_t>(p)] >= 0)
        throw InvalidArgument(fmt::format("two-level position {} is out of range or repeated", p));
      unit_of_[static_cast<std::size_t>(p)] = static_cast<int>(u);
      place_of_[static_cast<std::size_t>(p)] = static_cast<int>(l);
    }
  }
  const bool covered = std::find(unit_of_.begin(), unit_of_.end(), -1) == unit_of_.end();
  my_unit_ = unit_of_[static_cast<std::size_t>(flat_->rank())];
  const bool inner_fits =
      inner_->size() == static_cast<int>(positions_[static_cast<std::size_t>(my_unit_)].size());
  if (!covered || !inner_fits || uniform != (spread_.per_unit > 0) ||
      (uniform ? inner_->size() * outer_->size() : outer_->size()) != flat_->size()) {
    throw InvalidArgument(
        fmt::format("two-level positions over {} units do not cover a group of {} once as "
                    "spread (inner {}, outer {})",
                    positions_.size(), flat_->size(), inner_->size(), outer_->size()));
  }
}

TwoLevelCommunicator::~TwoLevelCommunicator() {
  queue_.stop();
}

bool TwoLevelCommunicator::two_levels(RingKind kind, const CollectiveCall& call) const {
  // An ordered sum's bits depend on the form: its choice must not depend on a timing, and the
  // groups along these dims must add in one order.
  const bool form_sets_bits = kind != RingKind::all_gather && call.mode == ReductionMode::ordered &&
                              (call.op == ReduceOp::sum || call.op == ReduceOp::avg);
  if (form_sets_bits && !splits_alike_) return false;
  if (choice_ == TwoLevelChoice::always) return true;
  if (!topology_) return false;
  const std::int64_t count = kind == RingKind::all_reduce ? call.count : total(call.segment_counts);
  const double bytes =
      static_cast<double>(count * static_cast<std::int64_t>(dtype_size(call.dtype)));
  const LocalCosts local = form_sets_bits ? LocalCosts{} : local_;
  TwoLevelExtra extra;
  if (call.mode == ReductionMode::exact && uses_fixed_point(call)) {
    const double value_bytes = static_cast<double>(dtype_size(call.dtype));
    extra.bytes_scale = 8.0 * kernels::fixed_point_format(call.dtype).limbs / value_bytes;
    extra.key_bytes = bytes / value_bytes;
  }
  return price_two_level(*topology_, spread_, kind, bytes, local, 0,
                         bytes / local.memory_bandwidth_bytes_s, extra)
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
  if (spread_.jagged()) {
    jagged_all_reduce(keys, max);
  } else {
    inner_->all_reduce(keys, max);
    outer_->all_reduce(keys, max);
  }
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
  if (spread_.jagged()) {
    jagged_all_reduce(buffer.flatten(), options);
    divide_if_avg(buffer, options);
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
  const int divisor = options.op == ReduceOp::avg ? size() : 1;
  if (spread_.jagged()) {
    const std::vector<std::int64_t> segments = balanced_counts(count, size());
    const auto me = static_cast<std::size_t>(rank());
    Tensor mine({segments[me] * limbs}, DType::i64);
    jagged_reduce_scatter(fixed, mine, segments, limbs,
                          level_options(options, ReduceOp::sum, ReductionMode::ordered));
    Tensor rounded({segments[me]}, buffer.dtype());
    kernels::decode_fixed_point(mine, keys.narrow(0, displacements(segments)[me], segments[me]),
                                divisor, rounded);
    jagged_all_gather(rounded, values, segments, 1, options);
    return;
  }
  const std::vector<std::int64_t> chunks = balanced_counts(count, per_unit());
  const auto place = static_cast<std::size_t>(inner_->rank());
  const std::int64_t first = displacements(chunks)[place];
  Tensor mine({chunks[place] * limbs}, DType::i64);
  const CollectiveOptions sum = level_options(options, ReduceOp::sum, ReductionMode::ordered);
  inner_->reduce_scatter(fixed, mine, scaled(chunks, limbs), sum);
  outer_->all_reduce(mine, sum);
  Tensor rounded({chunks[place]}, buffer.dtype());
  kernels::decode_fixed_point(mine, keys.narrow(0, first, chunks[place]), divisor, rounded);
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
  const CollectiveOptions sum = level_options(options, summed(options.op), options.mode);
  if (spread_.jagged()) {
    jagged_reduce_scatter(input.flatten(), output.flatten(), counts, 1, sum);
    divide_if_avg(output, options);
    return;
  }
  Tensor placed({input.numel()}, input.dtype());
  reorder(input, placed, counts, true);
  const std::vector<std::int64_t> places = place_counts(counts);
  Tensor mid({places[static_cast<std::size_t>(inner_->rank())]}, input.dtype());
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
  const std::int64_t mine = counts[static_cast<std::size_t>(rank())];
  const std::int64_t first = displacements(counts)[static_cast<std::size_t>(rank())];
  const CollectiveOptions sum = level_options(options, ReduceOp::sum, ReductionMode::ordered);
  const int divisor = options.op == ReduceOp::avg ? size() : 1;
  Tensor segment({mine * limbs}, DType::i64);
  if (spread_.jagged()) {
    jagged_reduce_scatter(fixed, segment, counts, limbs, sum);
    kernels::decode_fixed_point(segment, keys.narrow(0, first, mine), divisor, output.flatten());
    return;
  }
  Tensor placed({count * limbs}, DType::i64);
  reorder(fixed, placed, counts, true);
  const std::vector<std::int64_t> places = place_counts(counts);
  Tensor mid({places[static_cast<std::size_t>(inner_->rank())] * limbs}, DType::i64);
  inner_->reduce_scatter(placed, mid, scaled(places, limbs), sum);
  outer_->reduce_scatter(mid, segment, scaled(unit_counts(counts), limbs), sum);
  kernels::decode_fixed_point(segment, keys.narrow(0, first, mine), divisor, output.flatten());
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
  if (spread_.jagged()) {
    jagged_all_gather(input.flatten(), output.flatten(), counts, 1, options);
    return;
  }
  const std::vector<std::int64_t> units = unit_counts(counts);
  Tensor mid({total(units)}, input.dtype());
  outer_->all_gather(input.flatten(), mid, units, options);
  Tensor placed({output.numel()}, output.dtype());
  inner_->all_gather(mid, placed, place_counts(counts), options);
  reorder(placed, output, counts, false);
}

TwoLevelCommunicator::Range TwoLevelCommunicator::share(Range whole, int parts, int part) {
  const std::vector<std::int64_t> shares = balanced_counts(whole.count, parts);
  return {whole.from + displacements(shares)[static_cast<std::size_t>(part)],
          shares[static_cast<std::size_t>(part)]};
}

std::vector<std::int64_t> TwoLevelCommunicator::counts_of(
    const std::vector<std::vector<Range>>& blocks) {
  std::vector<std::int64_t> out;
  for (const auto& block : blocks) {
    std::int64_t sum = 0;
    for (const Range& range : block)
      sum += range.count;
    out.push_back(sum);
  }
  return out;
}

void TwoLevelCommunicator::copy_blocks(const Tensor& from, const Tensor& to,
                                       const std::vector<std::vector<Range>>& blocks,
                                       std::int64_t width, bool to_blocks) {
  const Tensor flat_from = from.flatten();
  const Tensor flat_to = to.flatten();
  std::int64_t at = 0;
  for (const auto& block : blocks) {
    for (const Range& range : block) {
      const std::int64_t n = range.count * width;
      if (n == 0) continue;
      const std::int64_t placed = range.from * width;
      if (to_blocks) {
        flat_to.narrow(0, at, n).copy_from(flat_from.narrow(0, placed, n));
      } else {
        flat_to.narrow(0, placed, n).copy_from(flat_from.narrow(0, at, n));
      }
      at += n;
    }
  }
}

std::vector<std::vector<TwoLevelCommunicator::Range>> TwoLevelCommunicator::jagged_blocks(
    const std::vector<std::int64_t>& counts) const {
  const std::vector<int>& unit = positions_[static_cast<std::size_t>(my_unit_)];
  const auto k = static_cast<int>(unit.size());
  const std::vector<std::int64_t> offsets = displacements(counts);
  std::vector<std::vector<Range>> blocks(unit.size());
  for (std::size_t l = 0; l < unit.size(); ++l) {
    const auto p = static_cast<std::size_t>(unit[l]);
    blocks[l].push_back({offsets[p], counts[p]});
  }
  for (std::size_t p = 0; p < counts.size(); ++p) {
    if (unit_of_[p] == my_unit_) continue;
    const Range whole{offsets[p], counts[p]};
    for (int l = 0; l < k; ++l) {
      const Range part = share(whole, k, l);
      blocks[static_cast<std::size_t>(l)].push_back(part);
    }
  }
  return blocks;
}

std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>>
TwoLevelCommunicator::relayed_and_own_shares(const std::vector<std::int64_t>& counts,
                                             std::int64_t width) const {
  const auto me = static_cast<std::size_t>(rank());
  const int k = unit_size(my_unit_);
  const int place = inner_->rank();
  std::vector<std::int64_t> relayed(counts.size(), 0);
  std::vector<std::int64_t> own(counts.size(), 0);
  for (std::size_t q = 0; q < counts.size(); ++q) {
    if (unit_of_[q] == my_unit_) continue;
    relayed[q] = share({0, counts[q]}, k, place).count * width;
    own[q] = share({0, counts[me]}, unit_size(unit_of_[q]), place_of_[q]).count * width;
  }
  return {std::move(relayed), std::move(own)};
}

void TwoLevelCommunicator::jagged_reduce_scatter(const Tensor& input, const Tensor& output,
                                                 const std::vector<std::int64_t>& counts,
                                                 std::int64_t width,
                                                 const CollectiveOptions& options) {
  // Inside the unit: every place's block summed in the members' order.
  const std::vector<std::vector<Range>> blocks = jagged_blocks(counts);
  Tensor placed({input.numel()}, input.dtype());
  copy_blocks(input, placed, blocks, width, true);
  const std::vector<std::int64_t> block_counts = counts_of(blocks);
  const auto place = static_cast<std::size_t>(inner_->rank());
  Tensor mid({block_counts[place] * width}, input.dtype());
  inner_->reduce_scatter(placed, mid, scaled(block_counts, width), options);
  // Across units: each share goes home.
  const auto me = static_cast<std::size_t>(rank());
  const std::int64_t own = counts[me] * width;
  const auto [send, receive] = relayed_and_own_shares(counts, width);
  Tensor received({total(receive)}, input.dtype());
  outer_->all_to_all(mid.narrow(0, own, mid.numel() - own), received, send, receive, options);
  // Each element: the units' sums in unit order.
  const std::vector<std::int64_t> at = displacements(receive);
  Tensor result = output.flatten();
  for (std::size_t v = 0; v < positions_.size(); ++v) {
    const bool first = v == 0;
    if (static_cast<int>(v) == my_unit_) {
      add_or_copy(result, mid.narrow(0, 0, own), first, options.op);
      continue;
    }
    for (std::size_t l = 0; l < positions_[v].size(); ++l) {
      const auto q = static_cast<std::size_t>(positions_[v][l]);
      const Range part =
          share({0, counts[me]}, unit_size(static_cast<int>(v)), static_cast<int>(l));
      add_or_copy(result.narrow(0, part.from * width, part.count * width),
                  received.narrow(0, at[q], receive[q]), first, options.op);
    }
  }
}

void TwoLevelCommunicator::jagged_all_gather(const Tensor& input, const Tensor& output,
                                             const std::vector<std::int64_t>& counts,
                                             std::int64_t width, const CollectiveOptions& options) {
  const std::vector<std::vector<Range>> blocks = jagged_blocks(counts);
  const std::vector<std::int64_t> block_counts = counts_of(blocks);
  const auto place = static_cast<std::size_t>(inner_->rank());
  const auto me = static_cast<std::size_t>(rank());
  const std::int64_t own = counts[me] * width;
  // Across units: this member's segment in shares, one to each place of every other unit.
  const auto [receive, send] = relayed_and_own_shares(counts, width);
  const Tensor segment = input.flatten();
  Tensor outgoing({total(send)}, input.dtype());
  std::int64_t at = 0;
  for (std::size_t q = 0; q < counts.size(); ++q) {
    if (send[q] == 0) continue;
    const Range part = share({0, counts[me]}, unit_size(unit_of_[q]), place_of_[q]);
    outgoing.narrow(0, at, send[q]).copy_from(segment.narrow(0, part.from * width, send[q]));
    at += send[q];
  }
  Tensor block({block_counts[place] * width}, input.dtype());
  if (own > 0) block.narrow(0, 0, own).copy_from(segment);
  outer_->all_to_all(outgoing, block.narrow(0, own, block.numel() - own), send, receive, options);
  // Inside the unit: every place's block, then each segment put back together.
  Tensor placed({output.numel()}, output.dtype());
  inner_->all_gather(block, placed, scaled(block_counts, width), options);
  copy_blocks(placed, output, blocks, width, false);
}

void TwoLevelCommunicator::jagged_all_reduce(const Tensor& values,
                                             const CollectiveOptions& options) {
  const std::vector<std::int64_t> segments = balanced_counts(values.numel(), size());
  Tensor mine({segments[static_cast<std::size_t>(rank())]}, values.dtype());
  jagged_reduce_scatter(values, mine, segments, 1,
                        level_options(options, summed(options.op), options.mode));
  jagged_all_gather(mine, values, segments, 1, options);
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
