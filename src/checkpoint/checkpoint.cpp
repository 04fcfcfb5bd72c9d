#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/checkpoint/checksum.hpp>
#include <meshtensor/checkpoint/safetensors.hpp>
#include <meshtensor/comm/agree.hpp>
#include <meshtensor/core/digest.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/half.hpp>
#include <meshtensor/core/untrusted_json.hpp>

#include "file_io.hpp"

namespace meshtensor::checkpoint {

namespace {

using nlohmann::json;

constexpr char kFormat[] = "meshtensor.checkpoint";
// Version 2 covers the metadata with a checksum; version 1 indexes (no such checksum) are read.
constexpr int kVersion = 2;
constexpr int kOldestVersion = 1;
constexpr char kTemporaryPrefix[] = ".tmp-";
constexpr char kStepPrefix[] = "step-";
// LATEST holds one directory name.
constexpr std::int64_t kMaxLatestBytes = 4096;

std::string join_path(const std::string& directory, const std::string& name) {
  return (std::filesystem::path(directory) / name).string();
}

std::string rank_file_name(int rank) {
  return fmt::format("rank-{:05d}.safetensors", rank);
}

/// Fault injection for the crash tests: MESHTENSOR_FAILPOINT=<point>[@<world rank>] kills the
/// whole process (SIGKILL, as a preemption would) when that rank reaches the point.
void failpoint(const char* point, int rank) {
  const char* setting = std::getenv("MESHTENSOR_FAILPOINT");
  if (setting == nullptr) return;
  const std::string text(setting);
  const std::size_t at = text.find('@');
  if (text.substr(0, at) != point) return;
  if (at != std::string::npos && text.substr(at + 1) != std::to_string(rank)) return;
  ::kill(::getpid(), SIGKILL);
}

std::string offset_text(const std::vector<std::int64_t>& offset) {
  return fmt::format("[{}]", fmt::join(offset, ","));
}

std::vector<std::int64_t> full_offset(const std::vector<std::int64_t>& offset, int rank) {
  return offset.empty() ? std::vector<std::int64_t>(static_cast<std::size_t>(rank), 0) : offset;
}

/// Checks that `offset` + `shape` lies inside `global`; returns the problem or "".
std::string outside(const Shape& global, const std::vector<std::int64_t>& offset,
                    const Shape& shape) {
  if (static_cast<int>(offset.size()) != global.rank() || shape.rank() != global.rank()) {
    return fmt::format("block {} at {} does not have the {} dims of {}", shape.to_string(),
                       offset_text(offset), global.rank(), global.to_string());
  }
  for (int d = 0; d < global.rank(); ++d) {
    const std::int64_t begin = offset[static_cast<std::size_t>(d)];
    if (begin < 0 || shape[d] > global[d] || begin > global[d] - shape[d]) {
      return fmt::format("block {} at {} lies outside {}", shape.to_string(), offset_text(offset),
                         global.to_string());
    }
  }
  return {};
}

std::string overlap_text(const StoredBlock& a, const StoredBlock& b) {
  return fmt::format("blocks {} at {} ({}) and {} at {} ({}) overlap", a.shape.to_string(),
                     offset_text(a.offset), a.file, b.shape.to_string(), offset_text(b.offset),
                     b.file);
}

// Tensors with more blocks than this must be tiled as a grid (every save makes one): the general
// overlap check compares every pair.
constexpr std::size_t kMaxPairwiseBlocks = 2048;

/// Whether the blocks (all inside the tensor) are the cells of one grid, each cell once: per dim,
/// the blocks' bounds cut the dim into intervals, every block spans exactly one interval per dim,
/// and no two blocks share all their intervals. Then the blocks tile the tensor when there are
/// as many as cells. O(n log n) in the blocks.
std::optional<std::string> grid_problem(const StoredTensor& tensor) {
  const int dims = tensor.shape.rank();
  std::vector<std::vector<std::int64_t>> cuts(static_cast<std::size_t>(dims));
  for (const StoredBlock& block : tensor.blocks) {
    for (int d = 0; d < dims; ++d) {
      const auto i = static_cast<std::size_t>(d);
      cuts[i].push_back(block.offset[i]);
      cuts[i].push_back(block.offset[i] + block.shape[d]);
    }
  }
  double cells = 1;
  for (auto& cut : cuts) {
    std::sort(cut.begin(), cut.end());
    cut.erase(std::unique(cut.begin(), cut.end()), cut.end());
    cells *= static_cast<double>(cut.size() - 1);
  }
  std::vector<std::pair<std::vector<std::int64_t>, std::size_t>> positions;
  positions.reserve(tensor.blocks.size());
  for (std::size_t b = 0; b < tensor.blocks.size(); ++b) {
    const StoredBlock& block = tensor.blocks[b];
    std::vector<std::int64_t> cell(static_cast<std::size_t>(dims));
    for (int d = 0; d < dims; ++d) {
      const auto i = static_cast<std::size_t>(d);
      const auto at = std::lower_bound(cuts[i].begin(), cuts[i].end(), block.offset[i]);
      if (at + 1 == cuts[i].end() || *(at + 1) != block.offset[i] + block.shape[d])
        return std::nullopt;  // spans several intervals: not a grid cell
      cell[i] = at - cuts[i].begin();
    }
    positions.emplace_back(std::move(cell), b);
  }
  std::sort(positions.begin(), positions.end());
  for (std::size_t k = 1; k < positions.size(); ++k) {
    if (positions[k].first == positions[k - 1].first)
      return overlap_text(tensor.blocks[positions[k - 1].second],
                          tensor.blocks[positions[k].second]);
  }
  if (static_cast<double>(positions.size()) != cells) return std::nullopt;
  return std::string();
}

/// The problem with a tensor's blocks, or "": every block inside, none overlapping, together
/// covering every element once.
std::string tiling_problem(const StoredTensor& tensor) {
  std::int64_t covered = 0;
  for (const StoredBlock& block : tensor.blocks) {
    if (std::string problem = outside(tensor.shape, block.offset, block.shape); !problem.empty())
      return problem;
    covered += block.shape.numel();  // each at most the tensor's numel: no overflow below 2^63
    if (covered > tensor.shape.numel())
      return fmt::format("its blocks cover more than its {} elements", tensor.shape.numel());
  }
  if (covered != tensor.shape.numel()) {
    return fmt::format("its blocks cover {} of its {} elements", covered, tensor.shape.numel());
  }
  if (tensor.blocks.empty() || tensor.shape.rank() == 0) return {};
  if (std::optional<std::string> problem = grid_problem(tensor)) return *problem;
  if (tensor.blocks.size() > kMaxPairwiseBlocks) {
    return fmt::format("its {} blocks do not form a grid (more than {} must)", tensor.blocks.size(),
                       kMaxPairwiseBlocks);
  }
  for (std::size_t i = 0; i < tensor.blocks.size(); ++i) {
    const StoredBlock& a = tensor.blocks[i];
    for (std::size_t j = 0; j < i; ++j) {
      const StoredBlock& b = tensor.blocks[j];
      if (intersect(Layout{a.shape, a.offset}, Layout{b.shape, b.offset}).numel() > 0)
        return overlap_text(a, b);
    }
  }
  return {};
}

/// Calls fn(stored_element, target_element, elements) for every run of `overlap` that is
/// contiguous both in the stored block and in the target block (row-major), in order.
template <class Fn>
void for_each_overlap_run(const Layout& stored, const Layout& target, const Layout& overlap,
                          Fn&& fn) {
  if (overlap.numel() == 0) return;
  const int dims = overlap.local_shape.rank();
  if (dims == 0) {
    fn(std::int64_t{0}, std::int64_t{0}, std::int64_t{1});
    return;
  }
  std::vector<std::int64_t> stored_stride(static_cast<std::size_t>(dims), 1);
  std::vector<std::int64_t> target_stride(static_cast<std::size_t>(dims), 1);
  for (int d = dims - 2; d >= 0; --d) {
    const auto i = static_cast<std::size_t>(d);
    stored_stride[i] = stored_stride[i + 1] * stored.local_shape[d + 1];
    target_stride[i] = target_stride[i + 1] * target.local_shape[d + 1];
  }
  // Inner dims the overlap spans whole in both blocks fold into one run.
  int inner = dims - 1;
  std::int64_t run = overlap.local_shape[inner];
  while (inner > 0 && overlap.local_shape[inner] == stored.local_shape[inner] &&
         overlap.local_shape[inner] == target.local_shape[inner]) {
    --inner;
    run *= overlap.local_shape[inner];
  }
  std::vector<std::int64_t> index(static_cast<std::size_t>(inner), 0);
  while (true) {
    std::int64_t from = 0;
    std::int64_t to = 0;
    for (int d = 0; d < dims; ++d) {
      const auto i = static_cast<std::size_t>(d);
      const std::int64_t global = overlap.global_offset[i] + (d < inner ? index[i] : 0);
      from += (global - stored.global_offset[i]) * stored_stride[i];
      to += (global - target.global_offset[i]) * target_stride[i];
    }
    fn(from, to, run);
    int d = inner - 1;
    for (; d >= 0; --d) {
      auto& i = index[static_cast<std::size_t>(d)];
      if (++i < overlap.local_shape[d]) break;
      i = 0;
    }
    if (d < 0) return;
  }
}

json shape_json(const Shape& shape) {
  return shape.dims();
}

std::vector<std::int64_t> int_list(const json& value, const std::string& what) {
  if (!value.is_array()) throw DataError(fmt::format("{} is not a list of integers", what));
  std::vector<std::int64_t> out;
  for (const auto& item : value) {
    if (!item.is_number_integer())
      throw DataError(fmt::format("{} holds {}, not an integer", what, json_excerpt(item)));
    out.push_back(item.get<std::int64_t>());
  }
  return out;
}

Shape shape_from(const json& value, const std::string& what) {
  const std::vector<std::int64_t> dims = int_list(value, what);
  try {
    return Shape(dims);
  } catch (const InvalidArgument& error) {
    throw DataError(fmt::format("{}: {}", what, error.what()));
  }
}

const json& field(const json& object, const char* key, const std::string& what) {
  if (!object.is_object() || !object.contains(key))
    throw DataError(fmt::format("{} has no '{}'", what, key));
  return object[key];
}

std::int64_t integer_field(const json& object, const char* key, const std::string& what) {
  const json& value = field(object, key, what);
  if (!value.is_number_integer())
    throw DataError(fmt::format("{}: '{}' is {}, not an integer", what, key, json_excerpt(value)));
  return value.get<std::int64_t>();
}

std::string string_field(const json& object, const char* key, const std::string& what) {
  const json& value = field(object, key, what);
  if (!value.is_string())
    throw DataError(fmt::format("{}: '{}' is {}, not a string", what, key, json_excerpt(value)));
  return value.get<std::string>();
}

bool is_plain_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::uint64_t parse_hex64(const std::string& text, const std::string& what) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw DataError(fmt::format("{}: checksum '{}' is not 16 hex digits", what, text));
  return std::stoull(text, nullptr, 16);
}

/// One rank's part of a save, as world rank 0 collects them.
json describe_block(const SaveItem& item, const Shape& shape, std::int64_t begin, std::int64_t end,
                    std::uint64_t checksum, const std::string& file) {
  return {{"name", item.name},
          {"dtype", safetensors_dtype_name(item.data.dtype())},
          {"global_shape", shape_json(item.global_shape)},
          {"offset", full_offset(item.offset, item.global_shape.rank())},
          {"shape", shape_json(shape)},
          {"owner", item.owner},
          {"file", file},
          {"begin", begin},
          {"end", end},
          {"checksum", digest_hex(checksum)}};
}

void check_items(std::span<const SaveItem> items) {
  std::vector<std::string> names;
  for (const SaveItem& item : items) {
    if (item.name.empty() || item.name == "__metadata__")
      throw InvalidArgument(
          fmt::format("checkpoint tensor name '{}' is empty or reserved", item.name));
    if (!item.data.defined())
      throw InvalidArgument(fmt::format("checkpoint tensor '{}' has no data", item.name));
    const std::vector<std::int64_t> offset = full_offset(item.offset, item.global_shape.rank());
    if (std::string problem = outside(item.global_shape, offset, item.data.shape());
        !problem.empty()) {
      throw InvalidArgument(fmt::format("checkpoint tensor '{}': {}", item.name, problem));
    }
    names.push_back(item.name);
  }
  std::sort(names.begin(), names.end());
  if (const auto repeated = std::adjacent_find(names.begin(), names.end());
      repeated != names.end()) {
    throw InvalidArgument(
        fmt::format("checkpoint tensor '{}' is given twice on one rank", *repeated));
  }
}

// Bytes written per call, checksummed just before while in the cache.
constexpr std::size_t kWritePiece = std::size_t{1} << 20;

/// Writes this rank's owned blocks to `path`; returns their descriptions (and those of the
/// blocks it holds but does not own).
json write_rank_file(std::span<const SaveItem> items, const std::string& path,
                     const std::string& file_name, int rank, std::int64_t& file_bytes) {
  json blocks = json::array();
  std::vector<SafetensorsEntry> entries;
  std::vector<const SaveItem*> written;
  for (const SaveItem& item : items) {
    if (!item.owner || item.data.numel() == 0) {
      blocks.push_back(describe_block(item, item.data.shape(), 0, 0, 0, ""));
      continue;
    }
    entries.push_back({item.name, item.data.dtype(), item.data.shape(), 0, 0});
    written.push_back(&item);
  }
  file_bytes = 0;
  if (written.empty()) return blocks;
  json offsets = json::object();
  for (const SaveItem* item : written)
    offsets[item->name] = {{"offset", full_offset(item->offset, item->global_shape.rank())},
                           {"global_shape", shape_json(item->global_shape)}};
  const std::string prefix =
      encode_safetensors_header(entries, {{"format", "meshtensor"}, {"blocks", offsets.dump()}});
  io::File file = io::File::create(path);
  file.write(std::as_bytes(std::span<const char>(prefix)));
  for (std::size_t i = 0; i < written.size(); ++i) {
    const Tensor data = written[i]->data.contiguous();
    const std::span<const std::byte> bytes = data.bytes();
    std::uint64_t checksum = 0;
    for (std::size_t at = 0; at < bytes.size(); at += kWritePiece) {
      const auto piece = bytes.subspan(at, std::min(kWritePiece, bytes.size() - at));
      checksum += block_checksum(piece, at);
      file.write(piece);
    }
    blocks.push_back(describe_block(*written[i], data.shape(), entries[i].begin, entries[i].end,
                                    checksum, file_name));
    if (i == 0) failpoint("checkpoint.mid_write", rank);
  }
  file.sync();
  file.close();
  file_bytes = static_cast<std::int64_t>(prefix.size()) + entries.back().end;
  return blocks;
}

/// World rank 0: the index from every rank's description; InvalidArgument when the blocks do not
/// fit together.
Index build_index(const std::vector<std::string>& descriptions, std::int64_t step,
                  const SaveOptions& options) {
  Index index;
  index.step = step;
  index.world_size = static_cast<std::int64_t>(descriptions.size());
  index.metadata = options.metadata;
  std::map<std::string, StoredTensor> tensors;
  std::map<std::string, int> first_rank;
  for (std::size_t rank = 0; rank < descriptions.size(); ++rank) {
    const json part = json::parse(descriptions[rank]);
    if (const std::string file = part["file"]; !file.empty())
      index.files[file] = part["bytes"].get<std::int64_t>();
    for (const json& block : part["blocks"]) {
      const std::string name = block["name"];
      const DType dtype = parse_safetensors_dtype(block["dtype"]);
      const Shape global(block["global_shape"].get<std::vector<std::int64_t>>());
      auto [it, inserted] = tensors.try_emplace(name);
      StoredTensor& tensor = it->second;
      if (inserted) {
        tensor.name = name;
        tensor.dtype = dtype;
        tensor.shape = global;
        first_rank[name] = static_cast<int>(rank);
      } else if (tensor.dtype != dtype || tensor.shape != global) {
        throw InvalidArgument(fmt::format(
            "checkpoint tensor '{}' is {} {} on world rank {} but {} {} on world rank {}", name,
            dtype_name(tensor.dtype), tensor.shape.to_string(), first_rank[name], dtype_name(dtype),
            global.to_string(), rank));
      }
      if (!block["owner"].get<bool>()) continue;
      const Shape shape(block["shape"].get<std::vector<std::int64_t>>());
      if (shape.numel() == 0) continue;
      tensor.blocks.push_back({block["file"].get<std::string>(),
                               block["offset"].get<std::vector<std::int64_t>>(), shape,
                               block["begin"].get<std::int64_t>(), block["end"].get<std::int64_t>(),
                               std::stoull(block["checksum"].get<std::string>(), nullptr, 16)});
    }
  }
  for (auto& [name, tensor] : tensors) {
    if (std::string problem = tiling_problem(tensor); !problem.empty())
      throw InvalidArgument(fmt::format("checkpoint tensor '{}': {}", name, problem));
    index.tensors.push_back(std::move(tensor));
  }
  return index;
}

std::string step_directory_name(const std::string& root, std::int64_t step) {
  const std::string base = fmt::format("{}{:08d}", kStepPrefix, step);
  std::string name = base;
  for (int n = 1; io::exists(join_path(root, name)); ++n)
    name = fmt::format("{}.{}", base, n);
  return name;
}

/// The step of a directory name that step_directory_name() makes ("step-00000012" or
/// "step-00000012.3"), or nothing for any other name.
std::optional<std::int64_t> step_of_directory_name(const std::string& name) {
  if (name.rfind(kStepPrefix, 0) != 0) return std::nullopt;
  const std::size_t digits_begin = std::strlen(kStepPrefix);
  const std::size_t dot = name.find('.', digits_begin);
  const std::string digits = name.substr(digits_begin, dot - digits_begin);
  if (digits.empty() || digits.size() > 19 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const std::int64_t step = std::stoll(digits);
  std::string expected = fmt::format("{}{:08d}", kStepPrefix, step);
  if (dot != std::string::npos) {
    const std::string suffix = name.substr(dot + 1);
    if (suffix.empty() || suffix.size() > 9 || suffix[0] == '0' ||
        suffix.find_first_not_of("0123456789") != std::string::npos)
      return std::nullopt;
    expected += "." + suffix;
  }
  if (expected != name) return std::nullopt;
  return step;
}

/// Removes all but the newest `keep` checkpoints under `root` that a save wrote: directories
/// named as step_directory_name() names them whose index is a valid checkpoint index of that
/// step. Nothing else in the root is touched, and never `latest`.
void prune(const std::string& root, int keep, const std::string& latest) {
  if (keep <= 0) return;
  std::vector<std::pair<std::int64_t, std::string>> found;
  for (const std::string& name : io::list_directory(root)) {
    const std::optional<std::int64_t> step = step_of_directory_name(name);
    if (!step) continue;
    const std::string index_file = join_path(join_path(root, name), kIndexFile);
    try {
      if (!io::is_regular_file(index_file) ||
          parse_index(io::read_text(index_file, kMaxIndexBytes), index_file).step != *step)
        continue;
    } catch (const Error&) {
      continue;  // not a checkpoint a save wrote (or a damaged one): leave it to its owner
    }
    found.emplace_back(*step, name);
  }
  std::sort(found.begin(), found.end());
  const std::size_t removable = found.size() > static_cast<std::size_t>(keep)
                                    ? found.size() - static_cast<std::size_t>(keep)
                                    : 0;
  for (std::size_t i = 0; i < removable; ++i)
    if (found[i].second != latest) io::remove_all(join_path(root, found[i].second));
}

/// True for a name temporary_name() makes: ".tmp-step-" then at least 8 digits, "-", the
/// process id in digits, "-" and 8 lowercase hex digits.
bool is_temporary_name(const std::string& name) {
  const std::string prefix = std::string(kTemporaryPrefix) + kStepPrefix;
  if (name.rfind(prefix, 0) != 0) return false;
  const auto digits = [](std::string_view part, std::string_view allowed) {
    return !part.empty() && part.find_first_not_of(allowed) == std::string_view::npos;
  };
  const std::string_view rest = std::string_view(name).substr(prefix.size());
  const std::size_t first = rest.find('-');
  const std::size_t second = first == std::string_view::npos ? first : rest.find('-', first + 1);
  if (second == std::string_view::npos) return false;
  const std::string_view step = rest.substr(0, first);
  const std::string_view pid = rest.substr(first + 1, second - first - 1);
  const std::string_view tag = rest.substr(second + 1);
  return step.size() >= 8 && digits(step, "0123456789") && digits(pid, "0123456789") &&
         tag.size() == 8 && digits(tag, "0123456789abcdef");
}

/// True for a file name a save writes into a checkpoint directory: index.json or a rank file.
bool is_checkpoint_file_name(const std::string& name) {
  if (name == kIndexFile) return true;
  int rank = 0;
  char tail = 0;
  return name.size() == rank_file_name(0).size() &&
         std::sscanf(name.c_str(), "rank-%5d.safetensor%c", &rank, &tail) == 2 && tail == 's' &&
         rank_file_name(rank) == name;
}

/// True when `path` is the leftover of an interrupted save: a directory (not a link) holding only
/// regular files that a save writes.
bool is_leftover_of_a_save(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_directory(std::filesystem::symlink_status(path, error))) return false;
  for (const auto& entry : std::filesystem::directory_iterator(path, error)) {
    if (entry.is_symlink() || !entry.is_regular_file() ||
        !is_checkpoint_file_name(entry.path().filename().string()))
      return false;
  }
  return !error;
}

/// Removes the leftovers of interrupted saves from `root`: only what is_temporary_name() and
/// is_leftover_of_a_save() recognise; anything else is left to its owner.
void remove_leftover_temporaries(const std::string& root) {
  for (const std::string& name : io::list_directory(root)) {
    const std::string path = join_path(root, name);
    if (is_temporary_name(name) && is_leftover_of_a_save(path)) io::remove_all(path);
  }
}

std::string temporary_name(std::int64_t step) {
  std::random_device entropy;
  return fmt::format("{}{}{:08d}-{}-{:08x}", kTemporaryPrefix, kStepPrefix, step, ::getpid(),
                     entropy());
}

}  // namespace

std::int64_t StoredTensor::nbytes() const {
  return shape.numel() * static_cast<std::int64_t>(dtype_size(dtype));
}

const StoredTensor* Index::find(const std::string& name) const {
  const auto it =
      std::lower_bound(tensors.begin(), tensors.end(), name,
                       [](const StoredTensor& t, const std::string& n) { return t.name < n; });
  return it != tensors.end() && it->name == name ? &*it : nullptr;
}

std::uint64_t metadata_checksum(const std::map<std::string, std::string>& metadata) {
  std::string text;
  for (const auto& [key, value] : metadata) {
    text += key;
    text += '\0';
    text += value;
    text += '\0';
  }
  return block_checksum(std::as_bytes(std::span<const char>(text)));
}

std::string Index::to_json() const {
  json tensor_map = json::object();
  for (const StoredTensor& tensor : tensors) {
    json blocks = json::array();
    for (const StoredBlock& block : tensor.blocks) {
      blocks.push_back({{"file", block.file},
                        {"offset", block.offset},
                        {"shape", shape_json(block.shape)},
                        {"data_offsets", {block.begin, block.end}},
                        {"checksum", digest_hex(block.checksum)}});
    }
    tensor_map[tensor.name] = {{"dtype", safetensors_dtype_name(tensor.dtype)},
                               {"shape", shape_json(tensor.shape)},
                               {"blocks", blocks}};
  }
  json file_map = json::object();
  for (const auto& [name, bytes] : files)
    file_map[name] = {{"bytes", bytes}};
  const json index = {
      {"format", kFormat},     {"version", kVersion},
      {"step", step},          {"world_size", world_size},
      {"metadata", metadata},  {"files", file_map},
      {"tensors", tensor_map}, {"metadata_checksum", digest_hex(metadata_checksum(metadata))}};
  return index.dump(1) + "\n";
}

namespace {

/// DataError unless the index's "metadata_checksum" is the checksum of `metadata`.
void check_metadata_checksum(const json& index, const std::map<std::string, std::string>& metadata,
                             const std::string& what) {
  const std::string recorded = string_field(index, "metadata_checksum", what);
  const std::string computed = digest_hex(metadata_checksum(metadata));
  if (recorded != computed) {
    throw DataError(fmt::format(
        "{}: the metadata does not match its checksum (the index records {}, the metadata reads "
        "as {}): it was edited or damaged",
        what, json_excerpt(index["metadata_checksum"]), computed));
  }
}

}  // namespace

Index parse_index(const std::string& text, const std::string& file) {
  const json index = parse_untrusted_json(text, file);
  if (index.is_discarded() || !index.is_object())
    throw DataError(fmt::format("{} is not a checkpoint index: not a JSON object", file));
  const std::string what = fmt::format("checkpoint index {}", file);
  if (!index.contains("format") || index["format"] != kFormat)
    throw DataError(
        fmt::format("{} is not a checkpoint index: 'format' is not '{}'", file, kFormat));
  const std::int64_t version = integer_field(index, "version", what);
  if (version < kOldestVersion || version > kVersion) {
    throw DataError(fmt::format("{}: version {} is not one this build reads ({} to {})", what,
                                json_excerpt(index["version"]), kOldestVersion, kVersion));
  }
  Index result;
  result.step = integer_field(index, "step", what);
  result.world_size = integer_field(index, "world_size", what);
  const json& metadata = field(index, "metadata", what);
  if (!metadata.is_object()) throw DataError(fmt::format("{}: 'metadata' is not an object", what));
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string())
      throw DataError(fmt::format("{}: metadata '{}' is not a string", what, key));
    result.metadata[key] = value.get<std::string>();
  }
  if (version >= 2) check_metadata_checksum(index, result.metadata, what);
  const json& files = field(index, "files", what);
  if (!files.is_object()) throw DataError(fmt::format("{}: 'files' is not an object", what));
  for (const auto& [name, entry] : files.items()) {
    if (!is_plain_file_name(name))
      throw DataError(fmt::format("{}: file name '{}' is not a plain file name", what, name));
    const std::int64_t bytes =
        integer_field(entry, "bytes", fmt::format("{}: file '{}'", what, name));
    if (bytes < 8) throw DataError(fmt::format("{}: file '{}' has {} bytes", what, name, bytes));
    result.files[name] = bytes;
  }
  const json& tensors = field(index, "tensors", what);
  if (!tensors.is_object()) throw DataError(fmt::format("{}: 'tensors' is not an object", what));
  for (const auto& [name, entry] : tensors.items()) {
    const std::string where = fmt::format("{}: tensor '{}'", what, name);
    StoredTensor tensor;
    tensor.name = name;
    try {
      tensor.dtype = parse_safetensors_dtype(string_field(entry, "dtype", where));
    } catch (const DataError& error) {
      throw DataError(fmt::format("{}: {}", where, error.what()));
    }
    tensor.shape = shape_from(field(entry, "shape", where), where + " shape");
    const json& blocks = field(entry, "blocks", where);
    if (!blocks.is_array()) throw DataError(fmt::format("{}: 'blocks' is not a list", where));
    for (const json& block : blocks) {
      StoredBlock stored;
      stored.file = string_field(block, "file", where);
      if (!result.files.contains(stored.file))
        throw DataError(
            fmt::format("{}: block file '{}' is not among the files", where, stored.file));
      stored.offset = int_list(field(block, "offset", where), where + " offset");
      stored.shape = shape_from(field(block, "shape", where), where + " block shape");
      const std::vector<std::int64_t> range =
          int_list(field(block, "data_offsets", where), where + " data_offsets");
      if (range.size() != 2 || range[0] < 0 || range[1] < range[0] ||
          range[1] - range[0] !=
              stored.shape.numel() * static_cast<std::int64_t>(dtype_size(tensor.dtype))) {
        throw DataError(fmt::format("{}: data_offsets {} do not hold a {} block of {}", where,
                                    offset_text(range), dtype_name(tensor.dtype),
                                    stored.shape.to_string()));
      }
      stored.begin = range[0];
      stored.end = range[1];
      stored.checksum = parse_hex64(string_field(block, "checksum", where), where);
      tensor.blocks.push_back(std::move(stored));
    }
    if (std::string problem = tiling_problem(tensor); !problem.empty())
      throw DataError(fmt::format("{}: {}", where, problem));
    result.tensors.push_back(std::move(tensor));
  }
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const StoredTensor& a, const StoredTensor& b) { return a.name < b.name; });
  return result;
}

std::string resolve(const std::string& path) {
  if (io::exists(join_path(path, kIndexFile))) return path;
  const std::string latest = join_path(path, kLatestFile);
  if (!io::exists(latest)) {
    throw DataError(fmt::format("no checkpoint at {}: it has neither {} nor {}", path, kIndexFile,
                                kLatestFile));
  }
  std::string name = io::read_text(latest, kMaxLatestBytes);
  while (!name.empty() && (name.back() == '\n' || name.back() == ' '))
    name.pop_back();
  if (!is_plain_file_name(name))
    throw DataError(fmt::format("{} names '{}', not a checkpoint directory", latest, name));
  const std::string directory = join_path(path, name);
  if (!io::exists(join_path(directory, kIndexFile))) {
    throw DataError(fmt::format("{} names {}, which has no {}", latest, directory, kIndexFile));
  }
  return directory;
}

Index read_index(const std::string& path) {
  const std::string file = join_path(resolve(path), kIndexFile);
  return parse_index(io::read_text(file, kMaxIndexBytes), file);
}

namespace {

/// SPMD check of a save: every rank names the same root (as an absolute path), step, keep,
/// metadata and tensors (names, global shapes, dtypes); otherwise every rank throws the same
/// InvalidArgument naming the first rank that differs, before anything is written.
void check_save_agrees(comm::Communicator& world, const std::string& root, std::int64_t step,
                       std::span<const SaveItem> items, const SaveOptions& options) {
  std::string where = root;
  try {
    where = std::filesystem::absolute(root).lexically_normal().string();
  } catch (const std::exception&) {  // the root's own checks name the problem later
  }
  comm::check_same_on_every_rank(
      world, "the checkpoint root, step and keep",
      fmt::format("root {}, step {}, keep {}", where, step, options.keep));
  std::string metadata;
  for (const auto& [key, value] : options.metadata)
    metadata += fmt::format("{}={}\n", key, value);
  comm::check_same_on_every_rank(world, "the checkpoint metadata", metadata);
  std::vector<std::string> tensors;
  for (const SaveItem& item : items) {
    tensors.push_back(fmt::format("{} {} {}", item.name, dtype_name(item.data.dtype()),
                                  item.global_shape.to_string()));
  }
  std::sort(tensors.begin(), tensors.end());
  comm::check_same_on_every_rank(world, "the checkpoint's tensors (names, dtypes and shapes)",
                                 fmt::format("{}", fmt::join(tensors, "; ")));
}

}  // namespace

void check_save_root(const std::string& root) {
  if (root.empty()) throw InvalidArgument("a checkpoint root must not be an empty path");
  std::error_code error;
  const auto status = std::filesystem::status(root, error);
  if (!std::filesystem::exists(status)) return;  // created by the save
  if (!std::filesystem::is_directory(status)) {
    throw InvalidArgument(
        fmt::format("checkpoint root {} exists and is not a directory; give a new or empty "
                    "directory, or one that holds checkpoints",
                    root));
  }
  const std::string index = join_path(root, kIndexFile);
  if (std::filesystem::exists(std::filesystem::symlink_status(index, error))) {
    throw InvalidArgument(fmt::format(
        "{} is in the way: a checkpoint root holds {} and step-NNNNNNNN directories, and an {} "
        "there would hide them from a resume; give another root (the directory above a "
        "checkpoint, or a new one)",
        index, kLatestFile, kIndexFile));
  }
  const std::string latest = join_path(root, kLatestFile);
  if (!std::filesystem::exists(std::filesystem::symlink_status(latest, error))) return;
  std::string name;
  if (io::is_regular_file(latest)) {
    try {
      name = io::read_text(latest, kMaxLatestBytes);
    } catch (const DataError&) {
      name.clear();
    }
  }
  if (!name.empty() && name.back() == '\n') name.pop_back();
  if (!step_of_directory_name(name)) {
    throw InvalidArgument(fmt::format(
        "{} is not a pointer a save wrote (one line naming a step-NNNNNNNN directory), and a "
        "save would replace it; move it away or give another root",
        latest));
  }
}

std::string save(comm::Communicator& world, const std::string& root, std::int64_t step,
                 std::span<const SaveItem> items, const SaveOptions& options) {
  const int rank = world.rank();
  if (step < 0) throw InvalidArgument(fmt::format("checkpoint step {} is negative", step));
  check_save_agrees(world, root, step, items, options);
  // World rank 0 prepares the temporary directory and tells the others its name.
  std::exception_ptr failure;
  std::string temporary;
  if (rank == 0) {
    try {
      check_save_root(root);
      io::make_directories(root);
      remove_leftover_temporaries(root);
      temporary = join_path(root, temporary_name(step));
      io::make_directories(temporary);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  comm::throw_if_any_failed(world, failure);
  temporary = comm::broadcast_text(world, temporary, 0);
  failpoint("checkpoint.before_write", rank);

  json part;
  try {
    check_items(items);
    const std::string file_name = rank_file_name(rank);
    std::int64_t bytes = 0;
    part["blocks"] =
        write_rank_file(items, join_path(temporary, file_name), file_name, rank, bytes);
    part["file"] = bytes > 0 ? file_name : "";
    part["bytes"] = bytes;
  } catch (...) {
    failure = std::current_exception();
  }
  failpoint("checkpoint.after_write", rank);
  const auto clean_up_and_rethrow = [&] {
    if (rank == 0) {
      try {
        io::remove_all(temporary);
      } catch (const Error&) {  // the failure that brought us here is the one to report
      }
    }
  };
  try {
    comm::throw_if_any_failed(world, failure);
  } catch (...) {
    clean_up_and_rethrow();
    throw;
  }
  const std::vector<std::string> parts = comm::all_gather_text(world, part.dump());

  std::string directory;
  if (rank == 0) {
    try {
      const Index index = build_index(parts, step, options);
      failpoint("checkpoint.before_index", rank);
      io::File file = io::File::create(join_path(temporary, kIndexFile));
      const std::string text = index.to_json();
      file.write(std::as_bytes(std::span<const char>(text)));
      file.sync();
      file.close();
      io::sync_directory(temporary);
      failpoint("checkpoint.before_rename", rank);
      const std::string name = step_directory_name(root, step);
      directory = join_path(root, name);
      io::rename_durably(temporary, directory);
      failpoint("checkpoint.before_latest", rank);
      io::write_text_atomically(join_path(root, kLatestFile), name + "\n");
      failpoint("checkpoint.after_latest", rank);
      prune(root, options.keep, name);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  try {
    comm::throw_if_any_failed(world, failure);
  } catch (...) {
    clean_up_and_rethrow();
    throw;
  }
  return comm::broadcast_text(world, directory, 0);
}

namespace {

/// A file of the checkpoint as one rank reads it.
struct OpenFile {
  io::File file;
  SafetensorsHeader header;
};

/// Opens `name` once per load and checks its header against the index.
OpenFile& open_checked(std::map<std::string, OpenFile>& open, const std::string& directory,
                       const Index& index, const std::string& name, LoadStats& stats) {
  if (const auto it = open.find(name); it != open.end()) return it->second;
  const std::string path = join_path(directory, name);
  io::File file = io::File::open_read(path);
  SafetensorsHeader header = read_safetensors_header(path);
  const std::int64_t bytes = file.size();
  if (bytes != index.files.at(name)) {
    throw DataError(fmt::format("{} is {} bytes, but the index records {} ({})", path, bytes,
                                index.files.at(name),
                                bytes < index.files.at(name) ? "truncated" : "changed"));
  }
  ++stats.files;
  return open.emplace(name, OpenFile{std::move(file), std::move(header)}).first->second;
}

void check_entry(const OpenFile& file, const StoredTensor& tensor, const StoredBlock& block) {
  const SafetensorsEntry* entry = file.header.find(tensor.name);
  if (entry == nullptr || entry->dtype != tensor.dtype || entry->shape != block.shape ||
      entry->begin != block.begin || entry->end != block.end) {
    throw DataError(fmt::format(
        "{} does not match the index for tensor '{}': the index has a {} block {} at bytes "
        "[{}, {}), the file {}",
        file.file.path(), tensor.name, dtype_name(tensor.dtype), block.shape.to_string(),
        block.begin, block.end,
        entry == nullptr ? std::string("has no such entry")
                         : fmt::format("{} {} at [{}, {})", dtype_name(entry->dtype),
                                       entry->shape.to_string(), entry->begin, entry->end)));
  }
}

// Per stored block, what the verifiers read: bytes and the checksum as four 16-bit limbs, each
// summed exactly in an i64 all-reduce.
constexpr std::size_t kVerifyWords = 5;

// Bytes read (and written) per call: large enough for the disk, small enough that a checksum
// of the piece right after finds it in the cache.
constexpr std::int64_t kReadPiece = std::int64_t{1} << 20;

}  // namespace

namespace {

// One load on one rank: the index it reads and what the verifiers' reads add up per stored
// block (numbered in index order; first_block[t] is tensor t's first).
struct LoadState {
  std::string directory;
  std::string index_file;
  std::string index_text;
  Index index;
  std::vector<std::size_t> first_block;
  std::vector<std::uint64_t> checksum_parts;
  std::vector<std::int64_t> bytes_parts;
  std::map<std::string, OpenFile> open;
  LoadStats stats;
};

// Reads and parses the index of the checkpoint `path` resolves to.
void read_load_index(const std::string& path, LoadState& state) {
  state.directory = resolve(path);
  state.index_file = join_path(state.directory, kIndexFile);
  state.index_text = io::read_text(state.index_file, kMaxIndexBytes);
  state.index = parse_index(state.index_text, state.index_file);
  std::size_t blocks = 0;
  for (const StoredTensor& tensor : state.index.tensors) {
    state.first_block.push_back(blocks);
    blocks += tensor.blocks.size();
  }
  state.checksum_parts.assign(blocks, 0);
  state.bytes_parts.assign(blocks, 0);
}

// The stored tensor `request` names, checked against its dtype, shape and block.
const StoredTensor& requested_tensor(const LoadRequest& request, const LoadState& state) {
  const StoredTensor* tensor = state.index.find(request.name);
  if (tensor == nullptr) {
    throw DataError(
        fmt::format("checkpoint {} has no tensor '{}'", state.index_file, request.name));
  }
  if (tensor->dtype != request.dtype || tensor->shape != request.global_shape) {
    throw DataError(fmt::format("tensor '{}' in {} is {} {}, but {} {} is expected", request.name,
                                state.index_file, dtype_name(tensor->dtype),
                                tensor->shape.to_string(), dtype_name(request.dtype),
                                request.global_shape.to_string()));
  }
  const std::vector<std::int64_t> offset = full_offset(request.offset, request.global_shape.rank());
  if (std::string problem = outside(request.global_shape, offset, request.shape);
      !problem.empty()) {
    throw InvalidArgument(fmt::format("load of tensor '{}': {}", request.name, problem));
  }
  return *tensor;
}

// Reads the part of stored block `block_id` that overlaps `target` into `destination`; the
// elements copied. Long runs go in pieces, each checksummed while it is still in the cache.
std::int64_t read_overlap(const LoadRequest& request, const StoredTensor& tensor,
                          const StoredBlock& block, std::size_t block_id, const Layout& target,
                          std::byte* destination, LoadState& state) {
  const Layout stored{block.shape, block.offset};
  const Layout overlap = intersect(stored, target);
  if (overlap.numel() == 0) return 0;
  OpenFile& file = open_checked(state.open, state.directory, state.index, block.file, state.stats);
  check_entry(file, tensor, block);
  const std::int64_t base = file.header.data_start + block.begin;
  const auto element = static_cast<std::int64_t>(dtype_size(request.dtype));
  for_each_overlap_run(stored, target, overlap,
                       [&](std::int64_t from, std::int64_t to, std::int64_t count) {
                         std::int64_t position = from * element;
                         std::byte* into = destination + to * element;
                         for (std::int64_t left = count * element; left > 0;) {
                           const std::int64_t piece = std::min(left, kReadPiece);
                           const std::span<std::byte> bytes(into, static_cast<std::size_t>(piece));
                           file.file.read_at(base + position, bytes);
                           ++state.stats.reads;
                           if (request.verifier) {
                             state.checksum_parts[block_id] +=
                                 block_checksum(bytes, static_cast<std::uint64_t>(position));
                             state.bytes_parts[block_id] += piece;
                           }
                           position += piece;
                           into += piece;
                           left -= piece;
                         }
                       });
  return overlap.numel();
}

// This rank's block of one requested tensor, read from every stored block it overlaps.
Tensor read_request(const LoadRequest& request, LoadState& state) {
  const StoredTensor& tensor = requested_tensor(request, state);
  const std::vector<std::int64_t> offset = full_offset(request.offset, request.global_shape.rank());
  const Layout target{request.shape, offset};
  // Every element is read below (or the load fails), so the zero-fill can be skipped.
  Tensor out = Tensor::uninitialized(request.shape, request.dtype);
  std::byte* destination = out.numel() > 0 ? out.bytes().data() : nullptr;
  std::int64_t copied = 0;
  std::size_t block_id =
      state.first_block[static_cast<std::size_t>(&tensor - state.index.tensors.data())];
  for (const StoredBlock& block : tensor.blocks)
    copied += read_overlap(request, tensor, block, block_id++, target, destination, state);
  if (copied != out.numel()) {
    throw DataError(
        fmt::format("tensor '{}' in {}: the stored blocks hold {} of the {} "
                    "elements of block {} at {}",
                    request.name, state.index_file, copied, out.numel(), request.shape.to_string(),
                    offset_text(offset)));
  }
  state.stats.bytes_read += copied * static_cast<std::int64_t>(dtype_size(request.dtype));
  return out;
}

// Sums the verifiers' reads of each block over the ranks and checks every block read whole
// against its checksum (collective).
void verify_blocks(comm::Communicator& world, LoadState& state) {
  const std::size_t blocks = state.checksum_parts.size();
  Tensor sums = Tensor::zeros({static_cast<std::int64_t>(blocks * kVerifyWords)}, DType::i64);
  {
    auto words = sums.values<std::int64_t>();
    for (std::size_t b = 0; b < blocks; ++b) {
      words[b * kVerifyWords] = state.bytes_parts[b];
      for (std::size_t limb = 0; limb < 4; ++limb)
        words[b * kVerifyWords + 1 + limb] =
            static_cast<std::int64_t>((state.checksum_parts[b] >> (16 * limb)) & 0xFFFF);
    }
  }
  if (blocks > 0)
    world.all_reduce(sums, {.op = ReduceOp::sum, .mode = comm::ReductionMode::ordered});
  const auto words = std::as_const(sums).values<std::int64_t>();
  std::size_t b = 0;
  for (const StoredTensor& tensor : state.index.tensors) {
    for (const StoredBlock& block : tensor.blocks) {
      const std::int64_t read = words[b * kVerifyWords];
      if (read == block.end - block.begin && read > 0) {
        std::uint64_t checksum = 0;
        for (std::size_t limb = 0; limb < 4; ++limb)
          checksum += static_cast<std::uint64_t>(words[b * kVerifyWords + 1 + limb]) << (16 * limb);
        if (checksum != block.checksum) {
          throw DataError(fmt::format(
              "checksum mismatch in {}: tensor '{}', block {} at {} reads as {}, the index "
              "records {} (the file is corrupt)",
              join_path(state.directory, block.file), tensor.name, block.shape.to_string(),
              offset_text(block.offset), digest_hex(checksum), digest_hex(block.checksum)));
        }
        ++state.stats.blocks_verified;
      }
      ++b;
    }
  }
}

}  // namespace

std::vector<Tensor> load(comm::Communicator& world, const std::string& path,
                         std::span<const LoadRequest> requests, LoadStats* stats_out) {
  LoadState state;
  std::exception_ptr failure;
  try {
    read_load_index(path, state);
  } catch (...) {
    failure = std::current_exception();
  }
  comm::throw_if_any_failed(world, failure);
  Digest64 index_digest;
  index_digest.update(state.index_text);
  comm::check_same_on_every_rank(
      world, "the checkpoint index",
      fmt::format("{} (index digest {})", state.directory, digest_hex(index_digest.finish())));
  std::vector<Tensor> loaded;
  try {
    for (const LoadRequest& request : requests)
      loaded.push_back(read_request(request, state));
  } catch (...) {
    failure = std::current_exception();
  }
  state.open.clear();  // the files close before the ranks wait for each other
  comm::throw_if_any_failed(world, failure);
  verify_blocks(world, state);
  if (stats_out != nullptr) *stats_out = state.stats;
  return loaded;
}

std::vector<std::string> reconcile(const std::string& directory, const Index& index,
                                   std::int64_t* files_read) {
  std::vector<std::string> problems;
  std::map<std::string, SafetensorsHeader> headers;
  for (const auto& [name, bytes] : index.files) {
    const std::string file = join_path(directory, name);
    try {
      const io::File open = io::File::open_read(file);
      if (const std::int64_t size = open.size(); size != bytes) {
        problems.push_back(fmt::format("{} is {} bytes, but the index records {} ({})", file, size,
                                       bytes, size < bytes ? "truncated" : "changed"));
        continue;
      }
      headers.emplace(name, read_safetensors_header(file));
    } catch (const DataError& error) {
      problems.push_back(error.what());
    }
  }
  if (files_read != nullptr) *files_read = static_cast<std::int64_t>(headers.size());
  // How often each entry of each file is referenced, in the order of its header's by_name.
  std::map<std::string, std::vector<int>> references;
  for (const auto& [name, header] : headers)
    references[name].assign(header.entries.size(), 0);
  for (const StoredTensor& tensor : index.tensors) {
    for (const StoredBlock& block : tensor.blocks) {
      const auto header = headers.find(block.file);
      if (header == headers.end()) continue;  // its file's problem is reported
      const SafetensorsEntry* entry = header->second.find(tensor.name);
      if (entry != nullptr)
        ++references[block.file][static_cast<std::size_t>(entry - header->second.entries.data())];
      if (entry == nullptr || entry->dtype != tensor.dtype || entry->shape != block.shape ||
          entry->begin != block.begin || entry->end != block.end) {
        problems.push_back(fmt::format(
            "{} does not match the index for tensor '{}': the index has a {} block {} at bytes "
            "[{}, {}), the file {}",
            join_path(directory, block.file), tensor.name, dtype_name(tensor.dtype),
            block.shape.to_string(), block.begin, block.end,
            entry == nullptr ? std::string("has no such entry")
                             : fmt::format("{} {} at [{}, {})", dtype_name(entry->dtype),
                                           entry->shape.to_string(), entry->begin, entry->end)));
      }
    }
  }
  for (const auto& [name, header] : headers) {
    const std::vector<int>& counts = references[name];
    for (std::size_t e = 0; e < header.entries.size(); ++e) {
      if (counts[e] == 1) continue;
      const SafetensorsEntry& entry = header.entries[e];
      problems.push_back(fmt::format(
          "{} holds tensor '{}' ({} {} at bytes [{}, {})), which {} of the index references",
          join_path(directory, name), entry.name, dtype_name(entry.dtype), entry.shape.to_string(),
          entry.begin, entry.end,
          counts[e] == 0 ? "no block" : fmt::format("{} blocks", counts[e])));
    }
  }
  return problems;
}

namespace {

/// The first NaN or infinity among `bytes` of a `dtype` block (which start at byte `at` of the
/// block): its element index in the block and its value; nullopt for integers and finite data.
std::optional<std::pair<std::int64_t, double>> first_non_finite(std::span<const std::byte> bytes,
                                                                DType dtype, std::int64_t at) {
  const auto size = static_cast<std::int64_t>(dtype_size(dtype));
  const auto count = static_cast<std::int64_t>(bytes.size()) / size;
  const auto value = [&](std::int64_t i) -> double {
    const std::byte* p = bytes.data() + i * size;
    switch (dtype) {
      case DType::f64: {
        double v = 0;
        std::memcpy(&v, p, sizeof v);
        return v;
      }
      case DType::f32: {
        float v = 0;
        std::memcpy(&v, p, sizeof v);
        return v;
      }
      case DType::bf16: {
        BFloat16 v;
        std::memcpy(&v, p, sizeof v);
        return to_float(v);
      }
      default: {
        Float16 v;
        std::memcpy(&v, p, sizeof v);
        return to_float(v);
      }
    }
  };
  if (dtype != DType::f64 && dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return std::nullopt;
  for (std::int64_t i = 0; i < count; ++i)
    if (const double v = value(i); !std::isfinite(v)) return std::pair{at / size + i, v};
  return std::nullopt;
}

}  // namespace

VerifyReport verify(const std::string& path) {
  VerifyReport report;
  report.directory = resolve(path);
  const Index index = read_index(report.directory);
  report.problems = reconcile(report.directory, index, &report.files);
  std::map<std::string, OpenFile> files;
  for (const auto& [name, bytes] : index.files) {
    const std::string file = join_path(report.directory, name);
    try {
      OpenFile open{io::File::open_read(file), read_safetensors_header(file)};
      if (open.file.size() == bytes) files.emplace(name, std::move(open));
    } catch (const DataError&) {  // NOLINT(bugprone-empty-catch): reconcile() reported it
    }
  }
  std::vector<std::byte> piece;
  for (const StoredTensor& tensor : index.tensors) {
    for (const StoredBlock& block : tensor.blocks) {
      ++report.blocks;
      const auto file = files.find(block.file);
      if (file == files.end()) continue;  // its file's problem is reported
      const SafetensorsEntry* entry = file->second.header.find(tensor.name);
      if (entry == nullptr || entry->begin != block.begin || entry->end != block.end) continue;
      try {
        std::uint64_t checksum = 0;
        std::optional<std::pair<std::int64_t, double>> non_finite;
        for (std::int64_t at = 0; at < block.end - block.begin; at += kReadPiece) {
          piece.resize(
              static_cast<std::size_t>(std::min(kReadPiece, block.end - block.begin - at)));
          file->second.file.read_at(file->second.header.data_start + block.begin + at, piece);
          checksum += block_checksum(piece, static_cast<std::uint64_t>(at));
          if (!non_finite) non_finite = first_non_finite(piece, tensor.dtype, at);
        }
        if (non_finite) {
          report.problems.push_back(fmt::format(
              "{}: tensor '{}', block {} at {} holds {} at element {} of the block: stored "
              "values must be finite",
              file->second.file.path(), tensor.name, block.shape.to_string(),
              offset_text(block.offset), non_finite->second, non_finite->first));
        }
        report.bytes += block.end - block.begin;
        if (checksum != block.checksum) {
          report.problems.push_back(fmt::format(
              "checksum mismatch in {}: tensor '{}', block {} at {} reads as {}, the index "
              "records {}",
              file->second.file.path(), tensor.name, block.shape.to_string(),
              offset_text(block.offset), digest_hex(checksum), digest_hex(block.checksum)));
        }
      } catch (const DataError& error) {
        report.problems.push_back(error.what());
      }
    }
  }
  return report;
}

namespace {

/// `spec` with every Partial placement made Replicate: what a Partial tensor is saved and loaded
/// as.
PlacementSpec reduced_spec(const PlacementSpec& spec) {
  std::vector<Placement> placements = spec.placements();
  for (Placement& placement : placements)
    if (placement.is_partial()) placement = Placement::replicate();
  return PlacementSpec(placements, spec.shard_levels());
}

/// True when `rank` sits at coordinate 0 of every non-Shard mesh dim of `spec`: of the ranks
/// holding the same block, the one that writes and verifies it.
bool is_first_holder(const DeviceMesh& mesh, const PlacementSpec& spec, std::int64_t rank) {
  const std::vector<std::int64_t> coordinates = mesh.coordinates(rank);
  for (const int dim : non_shard_mesh_dims(spec))
    if (coordinates[static_cast<std::size_t>(dim)] != 0) return false;
  return true;
}

}  // namespace

SaveItem save_item(const dtensor::DTensor& tensor, std::string name) {
  const PlacementSpec spec = reduced_spec(tensor.spec());
  std::optional<dtensor::DTensor> reduced;
  if (!tensor.spec().partial_mesh_dims().empty()) reduced = tensor.redistribute(spec);
  comm::MeshGroups& groups = tensor.groups();
  const Layout layout = local_layout(groups.mesh(), spec, tensor.global_shape(), groups.rank());
  return {std::move(name), tensor.global_shape(), layout.global_offset,
          reduced ? reduced->local() : tensor.local(),
          is_first_holder(groups.mesh(), spec, groups.rank())};
}

LoadRequest load_request(std::string name, const DeviceMesh& mesh, const PlacementSpec& spec,
                         const Shape& global_shape, DType dtype, std::int64_t rank) {
  const PlacementSpec loaded = reduced_spec(spec);
  const Layout layout = local_layout(mesh, loaded, global_shape, rank);
  return {std::move(name),      global_shape,       dtype,
          layout.global_offset, layout.local_shape, is_first_holder(mesh, loaded, rank)};
}

}  // namespace meshtensor::checkpoint
