#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include <meshtensor/core/dtype.hpp>
#include <meshtensor/core/reduce_op.hpp>
#include <meshtensor/core/tensor.hpp>

namespace meshtensor::kernels {

/// The integer form exact reductions add (DESIGN §3.3). Every element of a floating dtype becomes
/// `limbs` signed int64 values of `kFixedPointLimbBits` bits each, scaled by the element's
/// *anchor*: a power of two derived from its *scale key*, the maximum over the addends of a
/// one-byte key that depends on each addend's value only. Summing limbs with plain integer adds
/// is exact and associative, so any split of one sum (one collective, a chain of per-dim steps,
/// any rank count) reaches the same integers and, after one rounding, the same bits.
///
/// Floor: each addend is truncated toward zero to a multiple of 2^(anchor - window bits), i.e.
/// at most 2^-47 (f32, bf16), 2^-88 (f64) of the element's largest addend; addends within 2^-24
/// (f32), 2^-40 (bf16) or 2^-36 (f64) of the largest are added exactly, and f16 sums are always
/// exact. This holds over the whole range: f32/bf16/f16 keys are binades, f64 keys bins of at
/// most 8 binades (the lowest 16 binades share key 0, whose window reaches below the smallest
/// subnormal, so nothing there is truncated). An exact zero sum is +0.
struct FixedPointFormat {
  int limbs = 1;        ///< int64 limbs per element
  int window_bits = 0;  ///< significant bits below the anchor: limbs * kFixedPointLimbBits
};

/// Bits each limb carries; the rest of the int64 is headroom for kMaxExactAddends addends.
inline constexpr int kFixedPointLimbBits = 48;
/// Most addends one exact sum may have (the limbs' headroom).
inline constexpr std::int64_t kMaxExactAddends = std::int64_t{1} << 15;

/// The fixed-point form of a floating dtype; throws InvalidArgument for other dtypes.
FixedPointFormat fixed_point_format(DType dtype);

/// keys[i] = scale key of values[i] (u8). Combining the keys of all addends with max gives the
/// key encode and decode need. Contiguous tensors with equal element counts.
void fixed_point_keys(const Tensor& values, Tensor keys);

/// fixed[i * limbs + j] = limb j of values[i] at the anchor of keys[i] (i64, count * limbs).
/// Infinities and NaN are counted instead when keys[i] marks a non-finite element.
void encode_fixed_point(const Tensor& values, const Tensor& keys, Tensor fixed);

/// values[i] = the correctly rounded value of (sum held in fixed[i * limbs ...]) / divisor:
/// one rounding, ties to even, overflow to infinity; NaN if any addend was NaN or both
/// infinities occur, otherwise an infinity if one occurs.
void decode_fixed_point(const Tensor& fixed, const Tensor& keys, std::int64_t divisor,
                        Tensor values);

/// Exact sum (or, for avg, mean) of `inputs[0..k)` element by element, written to every buffer
/// in `outputs`: the same bits as taking each element's key as the maximum over the inputs,
/// encoding every input, adding the limbs and decoding once, i.e. the same bits as any split of
/// the k addends over collectives in exact mode. Floating dtypes, sum or avg, k up to
/// kMaxExactAddends. Aliasing as for reduce_ordered.
void reduce_exact(DType dtype, ReduceOp op, std::span<const std::byte* const> inputs,
                  std::span<std::byte* const> outputs, std::size_t count);

}  // namespace meshtensor::kernels
