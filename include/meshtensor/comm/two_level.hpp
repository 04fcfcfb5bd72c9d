#pragma once

#include <memory>
#include <utility>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/work_queue.hpp>
#include <meshtensor/mesh/topology.hpp>

namespace meshtensor::comm {

/// When a TwoLevelCommunicator runs a reducing or gathering collective in two levels.
enum class TwoLevelChoice : std::uint8_t {
  always,    ///< every all_reduce, reduce_scatter and all_gather (a plan chose it)
  by_price,  ///< when the topology's links make it cheaper for the call's size
};

/// A group whose members sit on several hosts (or domains), `per_unit` on each, running its
/// all_reduce, reduce_scatter and all_gather in two levels: `inner` holds this rank's unit's
/// members, `outer` the members at this rank's place on every unit. The other collectives run
/// on `flat`, the group itself. Same members, ranks and world ranks as `flat`.
///
/// Order (DESIGN §3.3, fixed): in `ordered` mode each element is summed inside each unit in
/// the members' group order, then those sums across units in unit order (hosts by number).
/// Every member gets the same bits; they may differ from one flat ordered collective. In
/// `exact` mode the levels add fixed-point limbs and round once: the bits of the flat
/// collective. `avg` sums and divides once by the group size.
class TwoLevelCommunicator final : public Communicator {
 public:
  /// `positions[u][l]`: the group position of the member at place l on unit u, units in
  /// `outer`'s order, places in `inner`'s. InvalidArgument unless it covers the group once with
  /// as many members on every unit.
  TwoLevelCommunicator(std::shared_ptr<Communicator> flat, std::shared_ptr<Communicator> inner,
                       std::shared_ptr<Communicator> outer, std::vector<std::vector<int>> positions,
                       GroupSpread spread, std::shared_ptr<const Topology> topology,
                       TwoLevelChoice choice);
  ~TwoLevelCommunicator() override;

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  const std::vector<std::int64_t>& world_ranks() const override { return flat_->world_ranks(); }
  std::string_view backend() const override { return flat_->backend(); }
  void throw_if_aborted() const override { flat_->throw_if_aborted(); }
  std::shared_ptr<const Topology> topology() const override { return flat_->topology(); }
  /// Hosts (or domains) the group spans.
  int units() const { return static_cast<int>(positions_.size()); }
  /// Members on each.
  int per_unit() const { return static_cast<int>(positions_.front().size()); }

  Work all_reduce_async(Tensor buffer, const CollectiveOptions& options) override;
  Work reduce_scatter_async(Tensor input, Tensor output, std::vector<std::int64_t> counts,
                            const CollectiveOptions& options) override;
  Work all_gather_async(Tensor input, Tensor output, std::vector<std::int64_t> counts,
                        const CollectiveOptions& options) override;
  Work all_to_all_async(Tensor input, Tensor output, std::vector<std::int64_t> send_counts,
                        std::vector<std::int64_t> recv_counts,
                        const CollectiveOptions& options) override;
  Work broadcast_async(Tensor buffer, int root, const CollectiveOptions& options) override;
  Work barrier_async(const CollectiveOptions& options) override;
  std::shared_ptr<Communicator> split(std::int64_t color, std::int64_t key,
                                      const CollectiveOptions& options) override;

  void all_reduce(const Tensor& buffer, const CollectiveOptions& options = {}) override;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      std::vector<std::int64_t> counts = {},
                      const CollectiveOptions& options = {}) override;
  void all_gather(const Tensor& input, const Tensor& output, std::vector<std::int64_t> counts = {},
                  const CollectiveOptions& options = {}) override;

 private:
  bool two_levels(RingKind kind, const CollectiveCall& call) const;
  void run_all_reduce(const Tensor& buffer, const CollectiveOptions& options);
  void run_reduce_scatter(const Tensor& input, const Tensor& output,
                          std::vector<std::int64_t> counts, const CollectiveOptions& options);
  void run_all_gather(const Tensor& input, const Tensor& output, std::vector<std::int64_t> counts,
                      const CollectiveOptions& options);
  /// The scale keys of `values` agreed over the group (max at both levels) and `values` in
  /// fixed point at those keys.
  std::pair<Tensor, Tensor> agreed_fixed_point(const Tensor& values,
                                               const CollectiveOptions& options);
  /// Divides a summed result by the group size when `options` asks for avg.
  void divide_if_avg(Tensor result, const CollectiveOptions& options) const;
  void exact_all_reduce(const Tensor& values, const CollectiveOptions& options);
  void exact_reduce_scatter(const Tensor& input, const Tensor& output,
                            const std::vector<std::int64_t>& counts,
                            const CollectiveOptions& options);
  /// Copies segments between group-position order (`counts[p]` each) and unit-major-inside
  /// place order ([place][unit]); `width` values per counted element.
  void reorder(const Tensor& from, const Tensor& to, const std::vector<std::int64_t>& counts,
               bool to_places) const;
  std::vector<std::int64_t> place_counts(const std::vector<std::int64_t>& counts) const;
  std::vector<std::int64_t> unit_counts(const std::vector<std::int64_t>& counts) const;

  std::shared_ptr<Communicator> flat_;
  std::shared_ptr<Communicator> inner_;
  std::shared_ptr<Communicator> outer_;
  std::vector<std::vector<int>> positions_;
  GroupSpread spread_;
  std::shared_ptr<const Topology> topology_;
  TwoLevelChoice choice_;
  WorkQueue queue_;
};

}  // namespace meshtensor::comm
