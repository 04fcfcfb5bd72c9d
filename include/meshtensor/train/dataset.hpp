#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace meshtensor::train {

/// One IDX array of unsigned bytes (the MNIST file format): its dims and its elements.
struct IdxArray {
  std::vector<std::int64_t> dims;
  std::vector<std::uint8_t> data;
};

/// Parses IDX bytes (gzip-compressed or plain) holding an unsigned-byte array of `expected_dims`
/// dims. Every defect (bad gzip stream, bad magic, wrong element type or dim count, a zero or
/// absurd size, data shorter or longer than the dims say) throws DataError naming `name` and the
/// problem; no input reads out of bounds.
IdxArray parse_idx(std::span<const std::byte> bytes, int expected_dims, const std::string& name);

/// Reads and parses an IDX file; a missing or unreadable file is a DataError naming the path.
IdxArray read_idx(const std::string& path, int expected_dims);

/// Images with their labels.
struct ImageSet {
  std::int64_t count = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::vector<std::uint8_t> pixels;  ///< count * height * width, row-major
  std::vector<std::uint8_t> labels;  ///< count, each below kClasses
  /// Pixels per image.
  std::int64_t features() const { return height * width; }
};

/// Classes of Fashion-MNIST and MNIST.
inline constexpr int kClasses = 10;

/// The training and test sets of one directory.
struct Dataset {
  ImageSet train;
  ImageSet test;
};

/// Where Debian's dataset-fashion-mnist package puts its files.
inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

/// Loads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
/// t10k-labels-idx1-ubyte from `dir` (each with or without ".gz"). Image and label counts must
/// match, images of both sets must have one size, labels must be below kClasses; a DataError names
/// the file and the problem otherwise.
Dataset load_dataset(const std::string& dir);

/// Most samples a dataset holds: an IDX file of 1-byte samples at the reader's 2 GiB cap.
inline constexpr std::int64_t kMaxEpochSamples = std::int64_t{1} << 31;

/// The order of the `count` training samples in epoch `epoch`: a permutation seeded by (seed,
/// epoch) alone, the same on every platform and for any number of ranks. InvalidArgument for a
/// count outside [0, kMaxEpochSamples], ResourceError when the order does not fit in memory.
std::vector<std::int64_t> epoch_order(std::int64_t count, std::uint64_t seed, std::int64_t epoch);

}  // namespace meshtensor::train
