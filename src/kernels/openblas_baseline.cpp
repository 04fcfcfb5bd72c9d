#include <cblas.h>
#include <dlfcn.h>
#include <string>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/kernels/openblas_baseline.hpp>

namespace meshtensor::kernels {

namespace {
struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&openblas_set_num_threads) set_num_threads = nullptr;

  // Loaded once per process and set to one thread; never closed.
  static const OpenBlas& get() {
    static const OpenBlas loaded = load();
    return loaded;
  }

 private:
  static OpenBlas load() {
    void* handle = nullptr;
    std::string why;
    for (const char* name : {"libopenblas.so.0", "libopenblas.so"}) {
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) break;
      const char* error = dlerror();
      why += fmt::format("{}{}", why.empty() ? "" : "; ", error != nullptr ? error : name);
    }
    if (handle == nullptr) {
      throw DataError(fmt::format(
          "the batch-variant baseline is OpenBLAS, which could not be loaded ({}): install "
          "libopenblas0",
          why));
    }
    OpenBlas blas;
    blas.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(handle, "cblas_sgemm"));
    blas.set_num_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(
        dlsym(handle, "openblas_set_num_threads"));
    if (blas.sgemm == nullptr || blas.set_num_threads == nullptr)
      throw DataError("the OpenBLAS library found has no cblas_sgemm or openblas_set_num_threads");
    blas.set_num_threads(1);
    return blas;
  }
};
}  // namespace

void openblas_matmul(const Tensor& a, Transpose transpose_a, const Tensor& b, Transpose transpose_b,
                     Tensor& c, float beta) {
  const OpenBlas& blas = OpenBlas::get();
  const bool ta = transpose_a == Transpose::yes;
  const bool tb = transpose_b == Transpose::yes;
  const auto m = static_cast<int>(c.shape()[0]);
  const auto n = static_cast<int>(c.shape()[1]);
  const auto k = static_cast<int>(ta ? a.shape()[0] : a.shape()[1]);
  blas.sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
             1.0f, a.values<float>().data(), static_cast<int>(a.shape()[1]),
             b.values<float>().data(), static_cast<int>(b.shape()[1]), beta,
             c.values<float>().data(), n);
}

std::function<void(const Tensor& x, const Tensor& w, Tensor& y)> openblas_linear_matmul() {
  OpenBlas::get();  // load errors here, not inside a forward
  return [](const Tensor& x, const Tensor& w, Tensor& y) {
    openblas_matmul(x, Transpose::no, w, Transpose::no, y, 1.0f);
  };
}

}  // namespace meshtensor::kernels
