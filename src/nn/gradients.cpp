#include <algorithm>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/elementwise.hpp>
#include <meshtensor/kernels/matmul.hpp>
#include <meshtensor/nn/gradients.hpp>

namespace meshtensor::nn {

GradientLayout::GradientLayout(std::vector<Parameter*> parameters)
    : parameters_(std::move(parameters)) {
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    places_[parameters_[i]] = {total_, i};
    sizes_.push_back(parameters_[i]->value.numel());
    total_ += sizes_.back();
  }
}

const GradientLayout::Place& GradientLayout::place_of(const Parameter& p) const {
  const auto it = places_.find(&p);
  if (it == places_.end())
    throw InvalidArgument(fmt::format("parameter '{}' is not one this sink collects", p.name));
  return it->second;
}

std::int64_t GradientLayout::offset_of(const Parameter& p) const {
  return place_of(p).offset;
}

std::size_t GradientLayout::index_of(const Parameter& p) const {
  return place_of(p).index;
}

namespace {

void check_rows(const Tensor& a, std::int64_t columns, const Parameter& p, const char* what,
                DType dtype = DType::f32) {
  if (a.rank() != 2 || a.dtype() != dtype || a.shape()[1] != columns) {
    throw InvalidArgument(fmt::format("gradient of '{}': {} must be {} [rows, {}], got {} {}",
                                      p.name, what, dtype_name(dtype), columns,
                                      dtype_name(a.dtype()), a.shape().to_string()));
  }
}

/// x and dy of an outer product: f32, or both bf16 (a layer computing in bf16).
void check_outer(const Parameter& p, const Tensor& x, const Tensor& dy) {
  const Shape& shape = p.value.shape();
  if (shape.rank() != 2) throw InvalidArgument(fmt::format("'{}' is not a matrix", p.name));
  const DType dtype = x.dtype() == DType::bf16 ? DType::bf16 : DType::f32;
  check_rows(x, shape[0], p, "x", dtype);
  check_rows(dy, shape[1], p, "dy", dtype);
  if (x.shape()[0] != dy.shape()[0]) {
    throw InvalidArgument(
        fmt::format("gradient of '{}': x has {} rows, dy {}", p.name, x.shape()[0], dy.shape()[0]));
  }
}

void check_indexed(const Parameter& p, std::span<const std::int64_t> indices, const Tensor& rows) {
  const Shape& shape = p.value.shape();
  if (shape.rank() != 2) throw InvalidArgument(fmt::format("'{}' is not a table", p.name));
  check_rows(rows, shape[1], p, "rows");
  if (static_cast<std::int64_t>(indices.size()) != rows.shape()[0]) {
    throw InvalidArgument(fmt::format("gradient of '{}': {} indices for {} rows", p.name,
                                      indices.size(), rows.shape()[0]));
  }
  for (const std::int64_t index : indices) {
    if (index < 0 || index >= shape[0]) {
      throw InvalidArgument(
          fmt::format("gradient of '{}': index {} is outside [0, {})", p.name, index, shape[0]));
    }
  }
}

}  // namespace

DenseGradients::DenseGradients(std::vector<Parameter*> parameters)
    : layout_(std::move(parameters)), sums_(Shape{layout_.total()}, DType::f32) {}

Tensor DenseGradients::view_of(const Parameter& p) {
  return sums_.narrow(0, layout_.offset_of(p), p.value.numel()).reshape(p.value.shape());
}

void DenseGradients::add_outer_products(const Parameter& p, const Tensor& x, const Tensor& dy) {
  check_outer(p, x, dy);
  kernels::matmul(x.contiguous(), kernels::Transpose::yes, dy.contiguous(), kernels::Transpose::no,
                  view_of(p), /*accumulate=*/true);
}

void DenseGradients::add_column_sums(const Parameter& p, const Tensor& a) {
  check_rows(a, p.value.numel(), p, "a");
  const Tensor dense = a.contiguous();
  const std::int64_t n = p.value.numel();
  float* sum = view_of(p).values<float>().data();
  kernels::column_sums_into(sum, dense.values<float>().data(), dense.shape()[0], n);
}

void DenseGradients::add_column_products(const Parameter& p, const Tensor& a, const Tensor& b) {
  check_rows(a, p.value.numel(), p, "a");
  check_rows(b, p.value.numel(), p, "b");
  const Tensor da = a.contiguous();
  const Tensor db = b.contiguous();
  const std::int64_t n = p.value.numel();
  float* sum = view_of(p).values<float>().data();
  kernels::column_products_into(sum, da.values<float>().data(), db.values<float>().data(),
                                da.shape()[0], n);
}

void DenseGradients::add_indexed_rows(const Parameter& p, std::span<const std::int64_t> indices,
                                      const Tensor& rows) {
  check_indexed(p, indices, rows);
  const Tensor dense = rows.contiguous();
  const std::int64_t n = p.value.shape()[1];
  float* sum = view_of(p).values<float>().data();
  const auto values = dense.values<float>();
  for (std::size_t r = 0; r < indices.size(); ++r) {
    float* target = sum + indices[r] * n;
    const float* row = values.data() + static_cast<std::int64_t>(r) * n;
    for (std::int64_t j = 0; j < n; ++j)
      target[j] += row[j];
  }
}

void DenseGradients::clear() {
  sums_.fill(0.0);
}

void DenseGradients::finish(std::int64_t divisor) {
  if (divisor <= 0)
    throw InvalidArgument(fmt::format("gradient divisor {} is not positive", divisor));
  const auto d = static_cast<float>(divisor);
  for (Parameter* p : layout_.parameters()) {
    const auto sum = view_of(*p).values<float>();
    auto grad = p->grad.values<float>();
    for (std::size_t i = 0; i < grad.size(); ++i)
      grad[i] = sum[i] / d;
  }
}

BinnedGradients::BinnedGradients(std::vector<Parameter*> parameters)
    : layout_(std::move(parameters)),
      sums_(kernels::BinnedSums::uninitialized(layout_.total())),
      emptied_(layout_.parameters().size(), 1) {}  // emptied on first use: no pass over memory

template <class Add>
void BinnedGradients::add_to(const Parameter& p, const Add& add) {
  char& emptied = emptied_[layout_.index_of(p)];
  add(emptied != 0 ? kernels::Start::empty : kernels::Start::sums);
  emptied = 0;  // after the addition: one that throws leaves the elements to sums() to empty
}

void BinnedGradients::clear() {
  std::fill(emptied_.begin(), emptied_.end(), 1);
}

kernels::BinnedSums& BinnedGradients::sums() {
  for (std::size_t i = 0; i < emptied_.size(); ++i) {
    if (emptied_[i] == 0) continue;
    // Not p.value.numel(): the sums are read after the parameter was resharded (emptied).
    sums_.clear(layout_.offset_of(*layout_.parameters()[i]), layout_.size_at(i));
    emptied_[i] = 0;
  }
  return sums_;
}

void BinnedGradients::add_outer_products(const Parameter& p, const Tensor& given_x,
                                         const Tensor& given_dy) {
  check_outer(p, given_x, given_dy);
  const Tensor x = kernels::as_dtype(given_x, DType::f32);  // bf16 values are exact in f32
  const Tensor dy = kernels::as_dtype(given_dy, DType::f32);
  add_to(p, [&](kernels::Start start) {
    kernels::add_outer_products(sums_, layout_.offset_of(p), x, dy, start);
  });
}

void BinnedGradients::add_sample_outer_products(const Parameter& p, const Tensor& x,
                                                const Tensor& dy, std::int64_t sample_rows) {
  check_outer(p, x, dy);
  const std::int64_t rows = x.shape()[0];
  if (sample_rows <= 1 || rows == 0 || rows % sample_rows != 0 ||
      x.shape()[1] * dy.shape()[1] == 0) {
    add_outer_products(p, x, dy);
    return;
  }
  const std::int64_t samples = rows / sample_rows;
  const std::int64_t m = x.shape()[1];
  const std::int64_t n = dy.shape()[1];
  // Samples in groups, so the per-sample products of a large layer stay a few megabytes.
  const std::int64_t group = std::clamp<std::int64_t>((std::int64_t{1} << 22) / (m * n), 1, 32);
  const Tensor xs = x.contiguous();  // f32 or bf16: the products are f32 either way
  const Tensor dys = dy.contiguous();
  // One buffer per thread, kept between calls: a fresh one of megabytes would fault its pages in
  // every step, and one per sink would hold as many as there are parameter groups.
  thread_local Tensor buffer;
  const std::int64_t held = std::min(group, samples);
  if (!buffer.defined() || buffer.numel() < held * m * n)
    buffer = Tensor::uninitialized(Shape{held * m * n}, DType::f32);
  const Tensor products = buffer.narrow(0, 0, held * m * n).reshape(Shape{held, m * n});
  for (std::int64_t first = 0; first < samples; first += group) {
    const std::int64_t count = std::min(group, samples - first);
    for (std::int64_t s = 0; s < count; ++s) {
      const std::int64_t row = (first + s) * sample_rows;
      kernels::matmul(xs.narrow(0, row, sample_rows), kernels::Transpose::yes,
                      dys.narrow(0, row, sample_rows), kernels::Transpose::no,
                      products.narrow(0, s, 1).reshape(Shape{m, n}));
    }
    add_to(p, [&](kernels::Start start) {
      kernels::add_column_sums(sums_, layout_.offset_of(p), products.narrow(0, 0, count), start);
    });
  }
}

void BinnedGradients::add_column_sums(const Parameter& p, const Tensor& a) {
  check_rows(a, p.value.numel(), p, "a");
  add_to(p, [&](kernels::Start start) {
    kernels::add_column_sums(sums_, layout_.offset_of(p), a, start);
  });
}

void BinnedGradients::add_column_products(const Parameter& p, const Tensor& a, const Tensor& b) {
  check_rows(a, p.value.numel(), p, "a");
  check_rows(b, p.value.numel(), p, "b");
  add_to(p, [&](kernels::Start start) {
    kernels::add_column_products(sums_, layout_.offset_of(p), a, b, start);
  });
}

void BinnedGradients::add_indexed_rows(const Parameter& p, std::span<const std::int64_t> indices,
                                       const Tensor& rows) {
  check_indexed(p, indices, rows);
  const Tensor dense = rows.contiguous();
  const std::int64_t count = p.value.shape()[0];
  const std::int64_t n = p.value.shape()[1];
  // The rows of each index, gathered index by index (a counting sort).
  std::vector<std::int64_t> first(static_cast<std::size_t>(count + 1), 0);
  for (const std::int64_t index : indices)
    ++first[static_cast<std::size_t>(index + 1)];
  for (std::int64_t i = 0; i < count; ++i)
    first[static_cast<std::size_t>(i + 1)] += first[static_cast<std::size_t>(i)];
  Tensor gathered(dense.shape(), DType::f32);
  std::vector<std::int64_t> next(first.begin(), first.end() - 1);
  const auto in = dense.values<float>();
  auto out = gathered.values<float>();
  for (std::size_t r = 0; r < indices.size(); ++r) {
    const std::int64_t slot = next[static_cast<std::size_t>(indices[r])]++;
    std::copy_n(in.data() + static_cast<std::int64_t>(r) * n, n, out.data() + slot * n);
  }
  const std::int64_t offset = layout_.offset_of(p);
  add_to(p, [&](kernels::Start start) {
    if (start == kernels::Start::empty) sums_.clear(offset, p.value.numel());
    for (std::int64_t i = 0; i < count; ++i) {
      const std::int64_t begin = first[static_cast<std::size_t>(i)];
      const std::int64_t rows_of_index = first[static_cast<std::size_t>(i + 1)] - begin;
      if (rows_of_index == 0) continue;
      kernels::add_column_sums(sums_, offset + i * n, gathered.narrow(0, begin, rows_of_index));
    }
  });
}

void BinnedGradients::finish(std::int64_t divisor) {
  Tensor rounded(Shape{layout_.total()}, DType::f32);
  kernels::round_binned_sums(sums(), divisor, rounded);
  set_gradients(rounded);
}

void BinnedGradients::set_gradients(const Tensor& flat) {
  if (flat.dtype() != DType::f32 || flat.shape() != Shape{layout_.total()}) {
    throw InvalidArgument(fmt::format("set_gradients needs f32 [{}], got {} {}", layout_.total(),
                                      dtype_name(flat.dtype()), flat.shape().to_string()));
  }
  for (std::size_t i = 0; i < layout_.parameters().size(); ++i) {
    Parameter* p = layout_.parameters()[i];
    p->grad.flatten().copy_from(flat.narrow(0, layout_.offset_of(*p), layout_.size_at(i)));
  }
}

}  // namespace meshtensor::nn
