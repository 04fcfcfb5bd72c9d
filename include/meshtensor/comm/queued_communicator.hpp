#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/comm/work_queue.hpp>

namespace meshtensor::comm {

/// Base of the backends. Validates every call on the calling rank, numbers it, and runs it on
/// the group's own FIFO queue; a backend supplies the data movement. Reductions follow one
/// pattern on every backend: the rank that owns a segment receives every rank's copy of it and
/// combines them with reduce_elements(), so ordered and exact results never depend on the
/// backend or on how the transport splits messages.
class QueuedCommunicator : public Communicator {
 public:
  Work all_reduce_async(Tensor buffer, const CollectiveOptions& options) final;
  Work reduce_scatter_async(Tensor input, Tensor output, std::vector<std::int64_t> counts,
                            const CollectiveOptions& options) final;
  Work all_gather_async(Tensor input, Tensor output, std::vector<std::int64_t> counts,
                        const CollectiveOptions& options) final;
  Work all_to_all_async(Tensor input, Tensor output, std::vector<std::int64_t> send_counts,
                        std::vector<std::int64_t> recv_counts,
                        const CollectiveOptions& options) final;
  Work broadcast_async(Tensor buffer, int root, const CollectiveOptions& options) final;
  Work barrier_async(const CollectiveOptions& options) final;
  std::shared_ptr<Communicator> split(std::int64_t color, std::int64_t key,
                                      const CollectiveOptions& options) final;

  void all_reduce(const Tensor& buffer, const CollectiveOptions& options = {}) final;
  void reduce_scatter(const Tensor& input, const Tensor& output,
                      std::vector<std::int64_t> counts = {},
                      const CollectiveOptions& options = {}) final;
  void all_gather(const Tensor& input, const Tensor& output, std::vector<std::int64_t> counts = {},
                  const CollectiveOptions& options = {}) final;
  void all_to_all(const Tensor& input, const Tensor& output,
                  std::vector<std::int64_t> send_counts = {},
                  std::vector<std::int64_t> recv_counts = {},
                  const CollectiveOptions& options = {}) final;
  void broadcast(const Tensor& buffer, int root, const CollectiveOptions& options = {}) final;
  void barrier(const CollectiveOptions& options = {}) final;

 protected:
  /// When the collective in progress gives up waiting for the other ranks.
  using Deadline = std::chrono::steady_clock::time_point;

  /// Runs one collective now, on the queue's thread. `input` and `output` are contiguous and
  /// match `call` (undefined where the kind has none; for all_gather the input may be the
  /// output's own segment, i.e. in place).
  virtual void run_collective(const CollectiveCall& call, const Tensor& input, Tensor output,
                              Deadline deadline) = 0;
  /// Creates the groups of a split (see Communicator::split), on the queue's thread.
  virtual std::shared_ptr<Communicator> run_split(const CollectiveCall& call, std::int64_t color,
                                                  std::int64_t key, Deadline deadline) = 0;

  /// Drains and stops the queue. Derived destructors call it first, so no queued task runs
  /// while their members are destroyed.
  void stop_queue() { queue_.stop(); }

  /// Number of calls this rank has issued on the group so far (any thread may read it): the
  /// sequence number the next call will get.
  std::int64_t issued_calls() const { return next_sequence_.load(std::memory_order_relaxed); }

 private:
  // The validated calls of the reducing collectives (exact mode's addend limit included).
  CollectiveCall all_reduce_call(const Tensor& buffer, const CollectiveOptions& options) const;
  CollectiveCall reduce_scatter_call(const Tensor& input, const Tensor& output,
                                     std::vector<std::int64_t> counts,
                                     const CollectiveOptions& options) const;
  Work enqueue(CollectiveCall call, Tensor input, Tensor output, const CollectiveOptions& options);
  // Runs the call in queue order and waits for it (on this thread when the queue is idle).
  void run_now(CollectiveCall call, const Tensor& input, const Tensor& output,
               const CollectiveOptions& options);

  std::atomic<std::int64_t> next_sequence_{0};
  WorkQueue queue_;
};

/// Combines one segment's copies from every group rank, `inputs` in group-rank order, as the
/// call prescribes: kernels::reduce_exact for exact sums, kernels::reduce_ordered otherwise
/// (also for `native` on backends without a native reduction of their own).
void reduce_elements(const CollectiveCall& call, std::span<const std::byte* const> inputs,
                     std::span<std::byte* const> outputs, std::size_t count);

}  // namespace meshtensor::comm
