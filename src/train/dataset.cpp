#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <zlib.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/train/dataset.hpp>

namespace meshtensor::train {

namespace {

// The largest array the reader accepts: far above MNIST's 47 MB, far below a decompression bomb.
constexpr std::int64_t kMaxIdxBytes = std::int64_t{1} << 31;
// Declared sizes above this are checked against the memory available before reading.
constexpr std::int64_t kMemoryCheckBytes = std::int64_t{64} << 20;
// The first piece of data read; later pieces double what is there.
constexpr std::size_t kFirstPiece = std::size_t{1} << 20;
// Bytes after the declared data read before the file is refused for them.
constexpr std::int64_t kMaxTrailingBytes = std::int64_t{1} << 20;

bool is_gzip(std::span<const std::byte> bytes) {
  return bytes.size() >= 2 && bytes[0] == std::byte{0x1f} && bytes[1] == std::byte{0x8b};
}

/// Bytes of an IDX file, plain or gzip, read in the amounts the caller asks for, so that nothing
/// is decompressed past what the header declares.
class IdxSource {
 public:
  IdxSource(std::span<const std::byte> bytes, std::string name)
      : bytes_(bytes), name_(std::move(name)), gzip_(is_gzip(bytes)) {
    if (gzip_ && inflateInit2(&stream_, 15 + 16) != Z_OK)
      throw DataError(fmt::format("{}: cannot start the gzip decoder", name_));
  }
  IdxSource(const IdxSource&) = delete;
  IdxSource& operator=(const IdxSource&) = delete;
  ~IdxSource() {
    if (gzip_) inflateEnd(&stream_);
  }

  /// Fills `out` as far as the data goes; returns the bytes written (fewer at the end).
  std::size_t read(std::span<std::uint8_t> out) {
    if (!gzip_) {
      const std::size_t n = std::min(out.size(), bytes_.size() - consumed_);
      std::memcpy(out.data(), bytes_.data() + consumed_, n);
      consumed_ += n;
      return n;
    }
    std::size_t produced = 0;
    while (produced < out.size() && !ended_) {
      // At most 1 GiB a call each way: z_stream counts in 32 bits.
      const std::size_t in = std::min<std::size_t>(bytes_.size() - consumed_, std::size_t{1} << 30);
      const std::size_t room = std::min<std::size_t>(out.size() - produced, std::size_t{1} << 30);
      stream_.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(bytes_.data() + consumed_));
      stream_.avail_in = static_cast<uInt>(in);
      stream_.next_out = out.data() + produced;
      stream_.avail_out = static_cast<uInt>(room);
      const int status = inflate(&stream_, Z_NO_FLUSH);
      consumed_ += in - stream_.avail_in;
      produced += room - stream_.avail_out;
      if (status == Z_STREAM_END) {
        ended_ = true;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        throw DataError(fmt::format("{}: bad gzip stream ({})", name_,
                                    stream_.msg != nullptr ? stream_.msg : "corrupt data"));
      } else if (status == Z_BUF_ERROR && consumed_ == bytes_.size() && stream_.avail_out != 0) {
        throw DataError(fmt::format("{}: the gzip stream is truncated (it ends after {} bytes)",
                                    name_, bytes_.size()));
      }
    }
    return produced;
  }

 private:
  std::span<const std::byte> bytes_;
  std::string name_;
  bool gzip_ = false;
  bool ended_ = false;
  std::size_t consumed_ = 0;
  z_stream stream_{};
};

std::int64_t read_be32(const std::uint8_t* p) {
  return (std::int64_t{p[0]} << 24) | (std::int64_t{p[1]} << 16) | (std::int64_t{p[2]} << 8) |
         std::int64_t{p[3]};
}

}  // namespace

IdxArray parse_idx(std::span<const std::byte> bytes, int expected_dims, const std::string& name) {
  IdxSource source(bytes, name);
  std::uint8_t magic[4] = {};
  if (const std::size_t got = source.read(magic); got < 4)
    throw DataError(fmt::format("{}: {} bytes is too short for an IDX header", name, got));
  if (magic[0] != 0 || magic[1] != 0) {
    throw DataError(
        fmt::format("{}: bad magic {:02x}{:02x}{:02x}{:02x} (an IDX file starts with "
                    "two zero bytes)",
                    name, magic[0], magic[1], magic[2], magic[3]));
  }
  if (magic[2] != 0x08) {
    throw DataError(
        fmt::format("{}: element type 0x{:02x} is not unsigned byte (0x08)", name, magic[2]));
  }
  if (magic[3] != expected_dims) {
    throw DataError(
        fmt::format("{}: {} dims where {} were expected", name, magic[3], expected_dims));
  }
  std::vector<std::uint8_t> sizes(4 * static_cast<std::size_t>(expected_dims));
  if (const std::size_t got = source.read(sizes); got < sizes.size()) {
    throw DataError(
        fmt::format("{}: truncated header ({} bytes, {} needed)", name, 4 + got, 4 + sizes.size()));
  }
  IdxArray array;
  std::int64_t elements = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const std::int64_t size = read_be32(sizes.data() + 4 * d);
    if (size <= 0 || size > kMaxIdxBytes / elements) {
      throw DataError(
          fmt::format("{}: dim {} has size {}, which is not valid here", name, d, size));
    }
    elements *= size;
    array.dims.push_back(size);
  }
  // Only what the header declares is ever decompressed (a bomb stops here or at the check
  // below), and the buffer grows with the data actually there, not with what a header claims.
  if (elements > kMemoryCheckBytes) {
    require_memory(static_cast<double>(elements),
                   fmt::format("reading the {} bytes {} declares", elements, name));
  }
  std::size_t total = 0;
  const auto wanted = static_cast<std::size_t>(elements);
  while (total < wanted) {
    const std::size_t piece = std::min(wanted - total, std::max(kFirstPiece, total));
    array.data.resize(total + piece);
    const std::size_t got = source.read(std::span(array.data).subspan(total, piece));
    total += got;
    if (got < piece) break;
  }
  if (total < wanted) {
    throw DataError(fmt::format("{}: truncated: the dims need {} bytes of data, the file has {}",
                                name, elements, total));
  }
  std::uint8_t extra[4096];
  std::int64_t trailing = 0;
  for (std::size_t got = source.read(extra); got > 0; got = source.read(extra)) {
    trailing += static_cast<std::int64_t>(got);
    if (trailing > kMaxTrailingBytes) break;
  }
  if (trailing > 0) {
    throw DataError(fmt::format("{}: {}{} bytes after the {} the dims describe", name,
                                trailing > kMaxTrailingBytes ? "more than " : "",
                                std::min(trailing, kMaxTrailingBytes), elements));
  }
  return array;
}

IdxArray read_idx(const std::string& path, int expected_dims) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error) throw DataError(fmt::format("{}: cannot open the file: {}", path, error.message()));
  if (!std::filesystem::is_regular_file(status)) {
    throw DataError(fmt::format(
        "{}: cannot read it: {}", path,
        std::filesystem::is_directory(status) ? "it is a directory" : "it is not a regular file"));
  }
  const auto size = static_cast<std::int64_t>(std::filesystem::file_size(path, error));
  // A gzip stream is never much larger than what it holds: refuse files past twice the cap.
  if (error || size > 2 * kMaxIdxBytes) {
    throw DataError(fmt::format("{}: {} bytes, more than an IDX file this reader accepts ({})",
                                path, size, 2 * kMaxIdxBytes));
  }
  require_memory(static_cast<double>(size), fmt::format("reading {}", path));
  std::ifstream file(path, std::ios::binary);
  if (!file) throw DataError(fmt::format("{}: cannot open the file", path));
  std::vector<char> content(static_cast<std::size_t>(size));
  file.read(content.data(), size);
  if (file.gcount() != size) throw DataError(fmt::format("{}: read error", path));
  return parse_idx(std::as_bytes(std::span<const char>(content)), expected_dims, path);
}

namespace {

std::string find_file(const std::string& dir, const std::string& base) {
  for (const std::string& candidate : {dir + "/" + base + ".gz", dir + "/" + base}) {
    if (std::ifstream(candidate).good()) return candidate;
  }
  throw DataError(
      fmt::format("{}/{}[.gz]: no such file (the directory needs the four IDX files "
                  "of MNIST or Fashion-MNIST)",
                  dir, base));
}

ImageSet load_set(const std::string& dir, const std::string& prefix) {
  const std::string images_path = find_file(dir, prefix + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_path, 3);
  IdxArray labels = read_idx(labels_path, 1);
  if (images.dims[0] != labels.dims[0]) {
    throw DataError(fmt::format("{} holds {} images but {} holds {} labels", images_path,
                                images.dims[0], labels_path, labels.dims[0]));
  }
  for (std::size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kClasses) {
      throw DataError(fmt::format("{}: label {} of sample {} is not below {}", labels_path,
                                  labels.data[i], i, kClasses));
    }
  }
  return {images.dims[0], images.dims[1], images.dims[2], std::move(images.data),
          std::move(labels.data)};
}

}  // namespace

Dataset load_dataset(const std::string& dir) {
  Dataset data{load_set(dir, "train"), load_set(dir, "t10k")};
  if (data.train.height != data.test.height || data.train.width != data.test.width) {
    throw DataError(fmt::format("{}: training images are {}x{} but test images {}x{}", dir,
                                data.train.height, data.train.width, data.test.height,
                                data.test.width));
  }
  return data;
}

std::vector<std::int64_t> epoch_order(std::int64_t count, std::uint64_t seed, std::int64_t epoch) {
  if (count < 0 || count > kMaxEpochSamples) {
    throw InvalidArgument(fmt::format(
        "epoch order of {} samples: the count must be 0 to {} (the most samples a dataset holds)",
        count, kMaxEpochSamples));
  }
  require_memory(static_cast<double>(count) * sizeof(std::int64_t),
                 fmt::format("the epoch order of {} samples", count));
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i)
    order[static_cast<std::size_t>(i)] = i;
  const std::uint64_t stream = mix64(seed ^ mix64(static_cast<std::uint64_t>(epoch) + 1));
  for (std::int64_t i = count - 1; i > 0; --i) {
    const std::int64_t j = uniform_int_sample(stream, static_cast<std::uint64_t>(i), 0, i);
    std::swap(order[static_cast<std::size_t>(i)], order[static_cast<std::size_t>(j)]);
  }
  return order;
}

}  // namespace meshtensor::train
