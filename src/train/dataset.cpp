#include <fstream>
#include <iterator>
#include <limits>
#include <zlib.h>

#include <fmt/format.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/core/random.hpp>
#include <meshtensor/train/dataset.hpp>

namespace meshtensor::train {

namespace {

// The largest array the reader accepts: far above MNIST's 47 MB, far below a decompression bomb.
constexpr std::int64_t kMaxIdxBytes = std::int64_t{1} << 31;

bool is_gzip(std::span<const std::byte> bytes) {
  return bytes.size() >= 2 && bytes[0] == std::byte{0x1f} && bytes[1] == std::byte{0x8b};
}

std::vector<std::uint8_t> gunzip(std::span<const std::byte> bytes, const std::string& name) {
  z_stream stream{};
  if (inflateInit2(&stream, 15 + 16) != Z_OK)
    throw DataError(fmt::format("{}: cannot start the gzip decoder", name));
  std::vector<std::uint8_t> out;
  std::size_t consumed = 0;
  int status = Z_OK;
  while (true) {
    // Feed at most 1 GiB at a time: z_stream counts in 32 bits.
    const std::size_t chunk = std::min<std::size_t>(bytes.size() - consumed, std::size_t{1} << 30);
    stream.next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(bytes.data() + consumed));
    stream.avail_in = static_cast<uInt>(chunk);
    const std::size_t before = out.size();
    out.resize(before + std::max<std::size_t>(std::size_t{1} << 16, before));
    stream.next_out = out.data() + before;
    stream.avail_out = static_cast<uInt>(out.size() - before);
    status = inflate(&stream, Z_NO_FLUSH);
    consumed += chunk - stream.avail_in;
    out.resize(out.size() - stream.avail_out);
    if (status == Z_STREAM_END) break;
    if (status != Z_OK && status != Z_BUF_ERROR) {
      const std::string why = stream.msg != nullptr ? stream.msg : "corrupt data";
      inflateEnd(&stream);
      throw DataError(fmt::format("{}: bad gzip stream ({})", name, why));
    }
    if (status == Z_BUF_ERROR && consumed == bytes.size() && stream.avail_out != 0) {
      inflateEnd(&stream);
      throw DataError(fmt::format("{}: the gzip stream is truncated (it ends after {} bytes)", name,
                                  bytes.size()));
    }
    if (static_cast<std::int64_t>(out.size()) > kMaxIdxBytes) {
      inflateEnd(&stream);
      throw DataError(fmt::format("{}: decompresses to more than {} bytes", name, kMaxIdxBytes));
    }
  }
  inflateEnd(&stream);
  return out;
}

std::int64_t read_be32(const std::uint8_t* p) {
  return (std::int64_t{p[0]} << 24) | (std::int64_t{p[1]} << 16) | (std::int64_t{p[2]} << 8) |
         std::int64_t{p[3]};
}

}  // namespace

IdxArray parse_idx(std::span<const std::byte> bytes, int expected_dims, const std::string& name) {
  std::vector<std::uint8_t> raw;
  if (is_gzip(bytes)) {
    raw = gunzip(bytes, name);
  } else {
    const auto* begin = reinterpret_cast<const std::uint8_t*>(bytes.data());
    raw.assign(begin, begin + bytes.size());
  }
  if (raw.size() < 4) {
    throw DataError(fmt::format("{}: {} bytes is too short for an IDX header", name, raw.size()));
  }
  if (raw[0] != 0 || raw[1] != 0) {
    throw DataError(
        fmt::format("{}: bad magic {:02x}{:02x}{:02x}{:02x} (an IDX file starts with "
                    "two zero bytes)",
                    name, raw[0], raw[1], raw[2], raw[3]));
  }
  if (raw[2] != 0x08) {
    throw DataError(
        fmt::format("{}: element type 0x{:02x} is not unsigned byte (0x08)", name, raw[2]));
  }
  if (raw[3] != expected_dims) {
    throw DataError(fmt::format("{}: {} dims where {} were expected", name, raw[3], expected_dims));
  }
  const std::size_t header = 4 + 4 * static_cast<std::size_t>(expected_dims);
  if (raw.size() < header) {
    throw DataError(
        fmt::format("{}: truncated header ({} bytes, {} needed)", name, raw.size(), header));
  }
  IdxArray array;
  std::int64_t elements = 1;
  for (int d = 0; d < expected_dims; ++d) {
    const std::int64_t size = read_be32(raw.data() + 4 + 4 * d);
    if (size <= 0 || size > kMaxIdxBytes / elements) {
      throw DataError(
          fmt::format("{}: dim {} has size {}, which is not valid here", name, d, size));
    }
    elements *= size;
    array.dims.push_back(size);
  }
  const auto data_bytes = static_cast<std::int64_t>(raw.size() - header);
  if (data_bytes < elements) {
    throw DataError(fmt::format("{}: truncated: the dims need {} bytes of data, the file has {}",
                                name, elements, data_bytes));
  }
  if (data_bytes > elements) {
    throw DataError(fmt::format("{}: {} bytes after the {} the dims describe", name,
                                data_bytes - elements, elements));
  }
  array.data.assign(raw.begin() + static_cast<std::ptrdiff_t>(header), raw.end());
  return array;
}

IdxArray read_idx(const std::string& path, int expected_dims) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw DataError(fmt::format("{}: cannot open the file", path));
  std::vector<char> content((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
  if (file.bad()) throw DataError(fmt::format("{}: read error", path));
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
