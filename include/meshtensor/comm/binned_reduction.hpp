#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/kernels/binned_sum.hpp>

namespace meshtensor::comm {

/// Exact collectives of binned sums (kernels::BinnedSums): every rank's partial sums merged and
/// rounded once, so the result is the correctly rounded exact sum for any number of ranks. FSDP's
/// exact gradient reductions, tensor parallelism's exact partial sums and the trainers' exact
/// scalars use them.

/// The reduce-scatter form of reduce_binned_sums: rank r owns the `counts[r]` elements from the
/// sum of the counts before it, and receives in `rounded_segment` (f32 or f64 [counts[rank]],
/// contiguous) its segment of the merged sums, rounded once: the same bits reduce_binned_sums
/// gives those elements. `received` as there.
void reduce_scatter_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums,
                                const std::vector<std::int64_t>& counts, std::int64_t divisor,
                                const Tensor& rounded_segment, const std::string& label,
                                kernels::BinnedSums& received);

/// Merges the binned sums of every rank of `group` and rounds (exact sum) / divisor into `rounded`
/// (f32 or f64 [count], contiguous) on every rank: the same bits as rounding the merged sums in
/// one place, for any number of ranks. Each rank takes one slice of the elements and receives
/// every other rank's state of it as it stands (bins and digit sums, all_to_all: no agreement on
/// bins first); it merges them (each element at the largest bin, digits aligned and summed:
/// integers far below 2^53, exact in any order) and rounds a chunk at a time, and the rounded
/// slices are all-gathered. Collective over `group`; `label` names the calls.
void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label = {});
/// The same, with `received` as the buffer the other ranks' states arrive in (resized when its
/// size differs), so that a reduction repeated every step reuses one allocation.
void reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums, std::int64_t divisor,
                        const Tensor& rounded, const std::string& label,
                        kernels::BinnedSums& received);

/// Merges the binned sums of every rank of `group` into `sums` on every rank, still binned (each
/// element at the largest bin of any rank, digit sums aligned and added: integers, exact in any
/// order): sums to be merged again or rounded later. Collective over `group`; `label` names the
/// calls.
void all_reduce_binned_sums(comm::Communicator& group, kernels::BinnedSums& sums,
                            const std::string& label = {});

}  // namespace meshtensor::comm
