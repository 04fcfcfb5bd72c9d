#include "checkpoint_bench.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <unistd.h>

#include <fmt/format.h>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/core/error.hpp>
#include <meshtensor/core/memory.hpp>
#include <meshtensor/mesh/layout.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "timing.hpp"

namespace meshtensor::bench {

namespace {

constexpr std::int64_t kColumns = 4096;
// Just under 64 MiB of f32 per tensor; the odd row count makes the shards uneven, so that a
// nested split over a 2-D mesh puts its boundaries elsewhere than the flat one.
constexpr std::int64_t kRowsPerTensor = 4093;
constexpr std::size_t kBaselineChunk = std::size_t{8} << 20;

[[noreturn]] void fail(const std::string& what, const std::string& path) {
  throw DataError(fmt::format("{} {}: {}", what, path, std::strerror(errno)));
}

/// The shapes of the state: 4096-column f32 matrices adding up to `megabytes`; the last one has
/// fewer rows when the total is not a multiple of 64 MiB.
std::vector<Shape> state_shapes(std::int64_t megabytes) {
  const std::int64_t rows =
      megabytes * (std::int64_t{1} << 20) / (kColumns * 4) * kRowsPerTensor / 4096;
  std::vector<Shape> shapes;
  for (std::int64_t done = 0; done < rows; done += kRowsPerTensor)
    shapes.push_back(Shape{std::min(kRowsPerTensor, rows - done), kColumns});
  return shapes;
}

double baseline_write(const std::string& path, std::span<const std::byte> source,
                      std::int64_t bytes) {
  return time_once([&] {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) fail("cannot create", path);
    for (std::int64_t done = 0; done < bytes;) {
      const auto n = static_cast<std::size_t>(
          std::min<std::int64_t>(bytes - done, static_cast<std::int64_t>(source.size())));
      const ssize_t wrote = ::write(fd, source.data(), n);
      if (wrote <= 0) fail("cannot write", path);
      done += wrote;
    }
    if (::fsync(fd) != 0) fail("cannot sync", path);
    ::close(fd);
  });
}

/// Reads the file in 8 MiB pieces into `into` (all of it, kept) or, when `into` is smaller than
/// the file, into its first piece over and over (dd's reused buffer).
double baseline_read(const std::string& path, std::int64_t bytes, std::span<std::byte> into) {
  const bool keep = static_cast<std::int64_t>(into.size()) >= bytes;
  return time_once([&] {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail("cannot open", path);
    for (std::int64_t done = 0; done < bytes;) {
      const auto n = static_cast<std::size_t>(std::min<std::int64_t>(bytes - done, kBaselineChunk));
      const ssize_t got = ::read(fd, into.data() + (keep ? done : 0), n);
      if (got <= 0) fail("cannot read", path);
      done += got;
    }
    ::close(fd);
  });
}

/// Times `body` on every rank between two barriers; world rank 0's wall time.
double time_ranks(comm::Communicator& world, const std::function<void()>& body) {
  world.barrier();
  const auto start = std::chrono::steady_clock::now();
  body();
  world.barrier();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

namespace {

/// Creates a fresh directory for the run under config.directory (default: the temporary
/// directory), after checking that memory and disk hold `total` bytes as the run needs them.
std::string make_bench_directory(const CheckpointBenchConfig& config, std::int64_t total) {
  std::random_device entropy;
  const std::string root =
      (std::filesystem::path(config.directory.empty()
                                 ? std::filesystem::temp_directory_path().string()
                                 : config.directory) /
       fmt::format("meshtensor-bench-checkpoint-{:08x}", entropy()))
          .string();
  // The state, a loaded copy and the baselines' buffers live at once; two copies go to disk.
  require_memory(3.0 * static_cast<double>(total),
                 fmt::format("bench checkpoint --mib {}", config.megabytes));
  std::error_code error;
  std::filesystem::create_directories(root, error);
  if (error) {
    throw DataError(fmt::format("bench checkpoint: cannot create a directory in {}: {}",
                                std::filesystem::path(root).parent_path().string(),
                                error.message()));
  }
  const std::filesystem::space_info space = std::filesystem::space(root, error);
  if (!error && static_cast<double>(space.available) < 2.0 * static_cast<double>(total)) {
    std::filesystem::remove_all(root, error);
    throw ResourceError(
        fmt::format("bench checkpoint --mib {} writes about {} to {}, but only {} is free there",
                    config.megabytes, format_bytes(2.0 * static_cast<double>(total)), root,
                    format_bytes(static_cast<double>(space.available))));
  }
  return root;
}

/// This rank's Shard(0) blocks of every tensor, filled with a pattern (the values do not
/// matter).
std::vector<checkpoint::SaveItem> shard_items(const std::vector<Shape>& shapes,
                                              const DeviceMesh& flat, int rank) {
  std::vector<checkpoint::SaveItem> items;
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const Layout block = local_layout(flat, parse_spec("S0"), shapes[t], rank);
    Tensor data = Tensor::uninitialized(block.local_shape, DType::f32);
    auto values = data.values<float>();
    for (std::size_t i = 0; i < values.size(); ++i)
      values[i] = static_cast<float>((i * 2654435761u + t) % 1000003u);
    items.push_back({fmt::format("state.{}", t), shapes[t], block.global_offset, data, true});
  }
  return items;
}

/// The rounds of `bench checkpoint`: each saves the state and loads it onto four layouts, with
/// the sequential baselines on rank 0; medians at the end.
class CheckpointBenchRun {
 public:
  CheckpointBenchRun(const CheckpointBenchConfig& config, std::vector<Shape> shapes,
                     std::int64_t total, std::string root)
      : config_(config),
        shapes_(std::move(shapes)),
        total_(total),
        root_(std::move(root)),
        flat_({config.ranks}),
        hsdp_({2, config.ranks / 2}) {}

  /// One round on every rank of `world`.
  void round(comm::Communicator& world, int repeat) {
    const int rank = world.rank();
    std::vector<checkpoint::SaveItem> items = shard_items(shapes_, flat_, rank);
    if (rank == 0) time_baselines(items.front().data.bytes());
    world.barrier();
    const std::string directory = root_ + fmt::format("/run-{}", repeat);
    const double saved = time_ranks(world, [&] { checkpoint::save(world, directory, 1, items); });
    items.clear();  // the loads below allocate their own
    // One untimed load first: every timed load then finds its memory in the allocator, as the
    // baseline read finds its buffer touched.
    checkpoint::load(world, directory, requests_for(flat_, parse_spec("S0"), rank));
    const double same = timed_load(world, directory, flat_, "S0", result_.load_same);
    const double nested = timed_load(world, directory, hsdp_, "S0,S0", result_.load_nested);
    const double other = timed_load(world, directory, flat_, "S1", result_.load_other_dim);
    const double mesh2 = timed_load(world, directory, hsdp_, "R,S0", result_.load_hsdp);
    if (rank != 0) return;
    save_s_.push_back(saved);
    same_s_.push_back(same);
    nested_s_.push_back(nested);
    other_s_.push_back(other);
    hsdp_s_.push_back(mesh2);
    std::filesystem::remove_all(directory);
  }

  /// The medians of every round.
  CheckpointBenchResult finish() {
    result_.tensors = static_cast<std::int64_t>(shapes_.size());
    const auto set = [&](CheckpointTiming& timing, const char* name,
                         const std::vector<double>& seconds, std::int64_t bytes) {
      timing.name = name;
      timing.seconds = median(seconds);
      timing.bytes = bytes;
    };
    set(result_.baseline_write, "sequential write + fsync (dd)", write_s_, total_);
    set(result_.baseline_read, "sequential read into touched memory", read_s_, total_);
    set(result_.baseline_fresh, "sequential read into new memory", fresh_s_, total_);
    set(result_.baseline_discard, "sequential read, discarded (dd)", discard_s_, total_);
    set(result_.save, "save (a file per rank, fsync, rename)", save_s_, total_);
    set(result_.load_same, "load, same layout", same_s_, total_);
    set(result_.load_nested, "load onto 2 x n (S0, S0): uneven", nested_s_, total_);
    set(result_.load_other_dim, "load onto Shard(1)", other_s_, total_);
    std::int64_t hsdp_bytes = 0;
    for (const std::int64_t b : result_.load_hsdp.bytes_read_per_rank)
      hsdp_bytes += b;
    set(result_.load_hsdp, "load onto 2 x n (R, S0)", hsdp_s_, hsdp_bytes);
    return result_;
  }

 private:
  /// The sequential baselines: rank 0's first block written over and over, as dd would, then
  /// read back into touched memory, into new memory and into one reused buffer.
  void time_baselines(std::span<const std::byte> source) {
    const std::string file = root_ + "/baseline.bin";
    write_s_.push_back(
        baseline_write(file, source.first(std::min(source.size(), kBaselineChunk)), total_));
    // Memory already touched, as the loads find theirs after a first untimed load.
    Tensor memory = Tensor::zeros(Shape{total_}, DType::u8);
    read_s_.push_back(baseline_read(file, total_, memory.bytes()));
    fresh_s_.push_back(
        baseline_read(file, total_, Tensor::uninitialized(Shape{total_}, DType::u8).bytes()));
    discard_s_.push_back(baseline_read(file, total_, memory.bytes().first(kBaselineChunk)));
    std::filesystem::remove(file);
  }

  std::vector<checkpoint::LoadRequest> requests_for(const DeviceMesh& mesh,
                                                    const PlacementSpec& spec, int rank) const {
    std::vector<checkpoint::LoadRequest> requests;
    for (std::size_t t = 0; t < shapes_.size(); ++t) {
      requests.push_back(checkpoint::load_request(fmt::format("state.{}", t), mesh, spec,
                                                  shapes_[t], DType::f32, rank));
    }
    return requests;
  }

  /// Loads the checkpoint onto `spec` over `mesh` on every rank; the seconds it took, and the
  /// bytes each rank read against those it holds in `timing`.
  double timed_load(comm::Communicator& world, const std::string& directory, const DeviceMesh& mesh,
                    const char* spec, CheckpointTiming& timing) {
    const int rank = world.rank();
    const auto requests = requests_for(mesh, parse_spec(spec), rank);
    checkpoint::LoadStats stats;
    const double seconds =
        time_ranks(world, [&] { checkpoint::load(world, directory, requests, &stats); });
    std::int64_t target = 0;
    for (const auto& r : requests)
      target += r.shape.numel() * 4;
    const std::lock_guard lock(mutex_);
    timing.bytes_read_per_rank.resize(static_cast<std::size_t>(config_.ranks));
    timing.target_bytes_per_rank.resize(static_cast<std::size_t>(config_.ranks));
    timing.bytes_read_per_rank[static_cast<std::size_t>(rank)] = stats.bytes_read;
    timing.target_bytes_per_rank[static_cast<std::size_t>(rank)] = target;
    return seconds;
  }

  const CheckpointBenchConfig& config_;
  std::vector<Shape> shapes_;
  std::int64_t total_ = 0;
  std::string root_;
  DeviceMesh flat_;
  DeviceMesh hsdp_;
  CheckpointBenchResult result_;
  std::mutex mutex_;
  std::vector<double> write_s_, read_s_, fresh_s_, discard_s_, save_s_, same_s_, nested_s_,
      other_s_, hsdp_s_;
};

}  // namespace

CheckpointBenchResult run_checkpoint_bench(const CheckpointBenchConfig& config) {
  if (config.ranks < 2 || config.ranks % 2 != 0)
    throw InvalidArgument(
        fmt::format("bench checkpoint needs an even number of ranks >= 2, not {}", config.ranks));
  if (config.megabytes < 1)
    throw InvalidArgument(fmt::format("--mib {} is below 1", config.megabytes));
  std::vector<Shape> shapes = state_shapes(config.megabytes);
  std::int64_t total = 0;
  for (const Shape& shape : shapes)
    total += shape.numel() * 4;
  const std::string root = make_bench_directory(config, total);
  const auto cleanup = std::unique_ptr<const std::string, void (*)(const std::string*)>(
      &root, [](const std::string* path) {
        std::error_code ignored;
        std::filesystem::remove_all(*path, ignored);
      });
  CheckpointBenchRun run(config, std::move(shapes), total, root);
  for (int repeat = 0; repeat < config.repeats; ++repeat)
    comm::run_threads(config.ranks, [&](comm::Communicator& world) { run.round(world, repeat); });
  return run.finish();
}

}  // namespace meshtensor::bench
