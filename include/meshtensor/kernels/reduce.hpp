#pragma once

#include <cstddef>
#include <span>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/reduce_op.hpp>

namespace meshtensor::kernels {

/// Combines `inputs[0..k)` element by element in ascending input order and writes the result to
/// every buffer in `outputs`. Each of `count` elements is reduced as
/// `acc = in0; acc = op(acc, in1); ...; acc = op(acc, in_{k-1})`, so the bits depend only on the
/// values and k, never on how a message is chunked. Accumulation type: f64 for f64, f32 for f32,
/// bf16 and f16 (rounded once at the end), the integer type itself for integers (sums wrap).
/// `avg` sums and divides once by k at the end (halves: one rounding of the f32 sum over k).
/// max/min follow the order-free NaN and signed-zero rules of `accumulate`.
///
/// An output may alias an input only if it is that input's own buffer and every element is read
/// before it is written: buffers are processed in blocks, each block read from every input before
/// it is written to any output.
void reduce_ordered(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                    std::span<std::byte* const> outputs, std::size_t count);

}  // namespace meshtensor::kernels
