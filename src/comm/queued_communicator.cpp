#include <fmt/format.h>

#include <meshtensor/comm/queued_communicator.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/fixed_point.hpp>
#include <meshtensor/kernels/reduce.hpp>

namespace meshtensor::comm {

void reduce_elements(const CollectiveCall& call, std::span<const std::byte* const> inputs,
                     std::span<std::byte* const> outputs, std::size_t count) {
  if (call.mode == ReductionMode::exact && uses_fixed_point(call)) {
    kernels::reduce_exact(call.dtype, call.op, inputs, outputs, count);
  } else {
    kernels::reduce_ordered(call.dtype, call.op, inputs, outputs, count);
  }
}

CollectiveCall QueuedCommunicator::all_reduce_call(const Tensor& buffer,
                                                   const CollectiveOptions& options) const {
  CollectiveCall call = describe_all_reduce(buffer, options, size());
  check_exact_addends(call, size());
  return call;
}

CollectiveCall QueuedCommunicator::reduce_scatter_call(const Tensor& input, const Tensor& output,
                                                       std::vector<std::int64_t> counts,
                                                       const CollectiveOptions& options) const {
  CollectiveCall call =
      describe_reduce_scatter(input, output, std::move(counts), options, rank(), size());
  check_exact_addends(call, size());
  return call;
}

Work QueuedCommunicator::all_reduce_async(Tensor buffer, const CollectiveOptions& options) {
  return enqueue(all_reduce_call(buffer, options), buffer, buffer, options);
}

Work QueuedCommunicator::reduce_scatter_async(Tensor input, Tensor output,
                                              std::vector<std::int64_t> counts,
                                              const CollectiveOptions& options) {
  return enqueue(reduce_scatter_call(input, output, std::move(counts), options), input, output,
                 options);
}

Work QueuedCommunicator::all_gather_async(Tensor input, Tensor output,
                                          std::vector<std::int64_t> counts,
                                          const CollectiveOptions& options) {
  return enqueue(describe_all_gather(input, output, std::move(counts), rank(), size()), input,
                 output, options);
}

Work QueuedCommunicator::all_to_all_async(Tensor input, Tensor output,
                                          std::vector<std::int64_t> send_counts,
                                          std::vector<std::int64_t> recv_counts,
                                          const CollectiveOptions& options) {
  return enqueue(
      describe_all_to_all(input, output, std::move(send_counts), std::move(recv_counts), size()),
      input, output, options);
}

Work QueuedCommunicator::broadcast_async(Tensor buffer, int root,
                                         const CollectiveOptions& options) {
  return enqueue(describe_broadcast(buffer, root, size()), buffer, buffer, options);
}

Work QueuedCommunicator::barrier_async(const CollectiveOptions& options) {
  CollectiveCall call;
  call.kind = CollectiveKind::barrier;
  return enqueue(std::move(call), Tensor(), Tensor(), options);
}

void QueuedCommunicator::all_reduce(const Tensor& buffer, const CollectiveOptions& options) {
  run_now(all_reduce_call(buffer, options), buffer, buffer, options);
}

void QueuedCommunicator::reduce_scatter(const Tensor& input, const Tensor& output,
                                        std::vector<std::int64_t> counts,
                                        const CollectiveOptions& options) {
  run_now(reduce_scatter_call(input, output, std::move(counts), options), input, output, options);
}

void QueuedCommunicator::all_gather(const Tensor& input, const Tensor& output,
                                    std::vector<std::int64_t> counts,
                                    const CollectiveOptions& options) {
  run_now(describe_all_gather(input, output, std::move(counts), rank(), size()), input, output,
          options);
}

void QueuedCommunicator::all_to_all(const Tensor& input, const Tensor& output,
                                    std::vector<std::int64_t> send_counts,
                                    std::vector<std::int64_t> recv_counts,
                                    const CollectiveOptions& options) {
  run_now(
      describe_all_to_all(input, output, std::move(send_counts), std::move(recv_counts), size()),
      input, output, options);
}

void QueuedCommunicator::broadcast(const Tensor& buffer, int root,
                                   const CollectiveOptions& options) {
  run_now(describe_broadcast(buffer, root, size()), buffer, buffer, options);
}

void QueuedCommunicator::barrier(const CollectiveOptions& options) {
  CollectiveCall call;
  call.kind = CollectiveKind::barrier;
  run_now(std::move(call), Tensor(), Tensor(), options);
}

std::shared_ptr<Communicator> QueuedCommunicator::split(std::int64_t color, std::int64_t key,
                                                        const CollectiveOptions& options) {
  CollectiveCall call;
  call.kind = CollectiveKind::split;
  call.sequence = next_sequence_++;
  std::shared_ptr<Communicator> result;
  queue_.run([&] { result = run_split(call, color, key, deadline_after(options.timeout)); });
  return result;
}

Work QueuedCommunicator::enqueue(CollectiveCall call, Tensor input, Tensor output,
                                 const CollectiveOptions& options) {
  call.sequence = next_sequence_++;
  call.label = options.label;
  const auto timeout = options.timeout;
  return queue_.submit([this, call = std::move(call), input = std::move(input),
                        output = std::move(output),
                        timeout] { run_collective(call, input, output, deadline_after(timeout)); });
}

void QueuedCommunicator::run_now(CollectiveCall call, const Tensor& input, const Tensor& output,
                                 const CollectiveOptions& options) {
  call.sequence = next_sequence_++;
  call.label = options.label;
  queue_.run([&] { run_collective(call, input, output, deadline_after(options.timeout)); });
}

}  // namespace meshtensor::comm
