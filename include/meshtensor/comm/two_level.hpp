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

/// A group whose members sit on several hosts (or domains), running its all_reduce,
/// reduce_scatter and all_gather in two levels: `inner` holds this rank's unit's members,
/// `outer` the members at this rank's place on every unit (jagged units: a private copy of the
/// group, for the exchange across units). The other collectives run on `flat`, the group
/// itself. Same members, ranks and world ranks as `flat`.
///
/// Units holding as many members each run the classic form (inside, across one k-th, inside).
/// Jagged units (seed 000's fsdp groups of 5 on hosts of 8: 3 + 2) reduce inside each unit into
/// per-member blocks (a member's own segment and a share of every other unit's members'
/// segments) and send the shares home in one exchange across units on `outer`; all_gather is the
/// reverse and all_reduce both.
///
/// Order (DESIGN §3.3, fixed): in `ordered` mode each element is summed inside each unit in
/// the members' group order, then those sums across units in unit order (hosts by number), in
/// both forms. Every member gets the same bits; they may differ from one flat ordered
/// collective. In `exact` mode the levels add fixed-point limbs and round once: the bits of the
/// flat collective. `avg` sums and divides once by the group size.
///
/// TwoLevelChoice::by_price decides per call with `local` (the measured costs of a collective
/// and of copies) where the form changes no bit (exact mode, max/min, gathers) and with the
/// model's default LocalCosts where it does (ordered sums), so that an ordered run's bits never
/// depend on a timing. When the other groups along the same mesh dims split over their units
/// differently (`splits_alike` false: seed 000's fsdp groups 3 + 2 beside 1 + 4), ordered sums
/// always run flat, so that what those groups replicate (the same tensor's copies) holds the
/// same bits.
class TwoLevelCommunicator final : public Communicator {
 public:
  /// `positions[u][l]`: the group position of the member at place l on unit u, units in
  /// `outer`'s order, places in `inner`'s. InvalidArgument unless it covers the group once.
  TwoLevelCommunicator(std::shared_ptr<Communicator> flat, std::shared_ptr<Communicator> inner,
                       std::shared_ptr<Communicator> outer, std::vector<std::vector<int>> positions,
                       GroupSpread spread, std::shared_ptr<const Topology> topology,
                       TwoLevelChoice choice, LocalCosts local = {}, bool splits_alike = true);
  ~TwoLevelCommunicator() override;

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  const std::vector<std::int64_t>& world_ranks() const override { return flat_->world_ranks(); }
  std::string_view backend() const override { return flat_->backend(); }
  void throw_if_aborted() const override { flat_->throw_if_aborted(); }
  std::shared_ptr<const Topology> topology() const override { return flat_->topology(); }
  /// Hosts (or domains) the group spans.
  int units() const { return static_cast<int>(positions_.size()); }
  /// Members on each; 0 when the units hold different numbers (jagged).
  int per_unit() const { return spread_.per_unit; }

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
  /// A range of a group-ordered buffer, in counted elements.
  struct Range {
    std::int64_t from = 0;
    std::int64_t count = 0;
  };
  /// Jagged form: per place of this rank's unit, the ranges of a buffer of `counts` segments
  /// (group order) that make its block: its member's own segment, then its share of each other
  /// unit's members' segments in group order.
  std::vector<std::vector<Range>> jagged_blocks(const std::vector<std::int64_t>& counts) const;
  /// Share `part` of `parts` of `whole` (balanced_counts, the larger shares first).
  static Range share(Range whole, int parts, int part);
  /// Elements per block.
  static std::vector<std::int64_t> counts_of(const std::vector<std::vector<Range>>& blocks);
  /// Copies between a group-ordered buffer and its blocks laid end to end (`to_blocks`: from
  /// the group order), `width` values per counted element.
  static void copy_blocks(const Tensor& from, const Tensor& to,
                          const std::vector<std::vector<Range>>& blocks, std::int64_t width,
                          bool to_blocks);
  /// Members on unit `unit`.
  int unit_size(int unit) const {
    return static_cast<int>(positions_[static_cast<std::size_t>(unit)].size());
  }
  /// Per member q of another unit: the share of q's segment this member relays (its place's
  /// share, split over this unit), and the share of this member's own segment that q's place
  /// relays (split over q's unit); `width` values per counted element.
  std::pair<std::vector<std::int64_t>, std::vector<std::int64_t>> relayed_and_own_shares(
      const std::vector<std::int64_t>& counts, std::int64_t width) const;
  /// Jagged reduce_scatter of `input` (segments of `counts` elements of `width` values each)
  /// into `output`, this member's segment, summed inside units then across in unit order.
  void jagged_reduce_scatter(const Tensor& input, const Tensor& output,
                             const std::vector<std::int64_t>& counts, std::int64_t width,
                             const CollectiveOptions& options);
  /// Jagged all_gather: the inverse exchange, then a gather inside the unit.
  void jagged_all_gather(const Tensor& input, const Tensor& output,
                         const std::vector<std::int64_t>& counts, std::int64_t width,
                         const CollectiveOptions& options);
  /// Jagged all_reduce (no fixed point): reduce_scatter and all_gather over balanced segments.
  void jagged_all_reduce(const Tensor& values, const CollectiveOptions& options);
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
  LocalCosts local_;
  bool splits_alike_ = true;
  std::vector<int> unit_of_;   // per group position
  std::vector<int> place_of_;  // per group position
  int my_unit_ = 0;
  WorkQueue queue_;
};

}  // namespace meshtensor::comm
