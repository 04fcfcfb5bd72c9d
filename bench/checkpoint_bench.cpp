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

CheckpointBenchResult run_checkpoint_bench(const CheckpointBenchConfig& config) {
  if (config.ranks < 2 || config.ranks % 2 != 0)
    throw InvalidArgument(
        fmt::format("bench checkpoint needs an even number of ranks >= 2, not {}", config.ranks));
  if (config.megabytes < 1)
    throw InvalidArgument(fmt::format("--mib {} is below 1", config.megabytes));
  const std::vector<Shape> shapes = state_shapes(config.megabytes);
  std::int64_t total = 0;
  for (const Shape& shape : shapes)
    total += shape.numel() * 4;
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
  const auto cleanup = std::unique_ptr<const std::string, void (*)(const std::string*)>(
      &root, [](const std::string* path) {
        std::error_code ignored;
        std::filesystem::remove_all(*path, ignored);
      });
  const std::filesystem::space_info space = std::filesystem::space(root, error);
  if (!error && static_cast<double>(space.available) < 2.0 * static_cast<double>(total)) {
    throw ResourceError(
        fmt::format("bench checkpoint --mib {} writes about {} to {}, but only {} is free there",
                    config.megabytes, format_bytes(2.0 * static_cast<double>(total)), root,
                    format_bytes(static_cast<double>(space.available))));
  }

  CheckpointBenchResult result;
  result.tensors = static_cast<std::int64_t>(shapes.size());
  const DeviceMesh flat({config.ranks});
  const DeviceMesh hsdp({2, config.ranks / 2});
  const PlacementSpec shard0 = parse_spec("S0");
  const PlacementSpec shard1 = parse_spec("S1");
  const PlacementSpec replicate_shard0 = parse_spec("R,S0");
  const PlacementSpec nested_shard0 = parse_spec("S0,S0");

  std::vector<double> write_s, read_s, fresh_s, discard_s, save_s, same_s, nested_s, other_s,
      hsdp_s;
  std::mutex mutex;
  const auto requests_for = [&](const DeviceMesh& mesh, const PlacementSpec& spec, int rank) {
    std::vector<checkpoint::LoadRequest> requests;
    for (std::size_t t = 0; t < shapes.size(); ++t)
      requests.push_back(checkpoint::load_request(fmt::format("state.{}", t), mesh, spec, shapes[t],
                                                  DType::f32, rank));
    return requests;
  };
  const auto record_reads = [&](CheckpointTiming& timing, int rank,
                                const checkpoint::LoadStats& stats,
                                const std::vector<checkpoint::LoadRequest>& requests) {
    std::int64_t target = 0;
    for (const auto& r : requests)
      target += r.shape.numel() * 4;
    const std::lock_guard lock(mutex);
    timing.bytes_read_per_rank.resize(static_cast<std::size_t>(config.ranks));
    timing.target_bytes_per_rank.resize(static_cast<std::size_t>(config.ranks));
    timing.bytes_read_per_rank[static_cast<std::size_t>(rank)] = stats.bytes_read;
    timing.target_bytes_per_rank[static_cast<std::size_t>(rank)] = target;
  };

  for (int repeat = 0; repeat < config.repeats; ++repeat) {
    comm::run_threads(config.ranks, [&](comm::Communicator& world) {
      const int rank = world.rank();
      // This rank's Shard(0) blocks, filled with a pattern (the values do not matter).
      std::vector<checkpoint::SaveItem> items;
      for (std::size_t t = 0; t < shapes.size(); ++t) {
        const Layout block = local_layout(flat, shard0, shapes[t], rank);
        Tensor data = Tensor::uninitialized(block.local_shape, DType::f32);
        auto values = data.values<float>();
        for (std::size_t i = 0; i < values.size(); ++i)
          values[i] = static_cast<float>((i * 2654435761u + t) % 1000003u);
        items.push_back({fmt::format("state.{}", t), shapes[t], block.global_offset, data, true});
      }
      if (rank == 0) {
        // The sequential baseline writes rank 0's first block over and over, as dd would.
        const std::string file = root + "/baseline.bin";
        const auto source = items.front().data.bytes();
        write_s.push_back(
            baseline_write(file, source.first(std::min(source.size(), kBaselineChunk)), total));
        // Memory already touched, as the loads below find theirs after a first untimed load.
        Tensor memory = Tensor::zeros(Shape{total}, DType::u8);
        read_s.push_back(baseline_read(file, total, memory.bytes()));
        fresh_s.push_back(
            baseline_read(file, total, Tensor::uninitialized(Shape{total}, DType::u8).bytes()));
        discard_s.push_back(baseline_read(file, total, memory.bytes().first(kBaselineChunk)));
        std::filesystem::remove(file);
      }
      world.barrier();
      const std::string directory = root + fmt::format("/run-{}", repeat);
      const double saved = time_ranks(world, [&] { checkpoint::save(world, directory, 1, items); });
      items.clear();  // the loads below allocate their own
      const auto timed_load = [&](const DeviceMesh& mesh, const PlacementSpec& spec,
                                  CheckpointTiming& timing) {
        const auto requests = requests_for(mesh, spec, rank);
        checkpoint::LoadStats stats;
        const double seconds =
            time_ranks(world, [&] { checkpoint::load(world, directory, requests, &stats); });
        record_reads(timing, rank, stats, requests);
        return seconds;
      };
      // One untimed load first: every timed load then finds its memory in the allocator, as the
      // baseline read finds its buffer touched.
      checkpoint::load(world, directory, requests_for(flat, shard0, rank));
      const double same = timed_load(flat, shard0, result.load_same);
      const double nested = timed_load(hsdp, nested_shard0, result.load_nested);
      const double other = timed_load(flat, shard1, result.load_other_dim);
      const double mesh2 = timed_load(hsdp, replicate_shard0, result.load_hsdp);
      if (rank == 0) {
        save_s.push_back(saved);
        same_s.push_back(same);
        nested_s.push_back(nested);
        other_s.push_back(other);
        hsdp_s.push_back(mesh2);
        std::filesystem::remove_all(directory);
      }
    });
  }
  const auto finish = [&](CheckpointTiming& timing, const char* name,
                          const std::vector<double>& seconds, std::int64_t bytes) {
    timing.name = name;
    timing.seconds = median(seconds);
    timing.bytes = bytes;
  };
  finish(result.baseline_write, "sequential write + fsync (dd)", write_s, total);
  finish(result.baseline_read, "sequential read into touched memory", read_s, total);
  finish(result.baseline_fresh, "sequential read into new memory", fresh_s, total);
  finish(result.baseline_discard, "sequential read, discarded (dd)", discard_s, total);
  finish(result.save, "save (a file per rank, fsync, rename)", save_s, total);
  finish(result.load_same, "load, same layout", same_s, total);
  finish(result.load_nested, "load onto 2 x n (S0, S0): uneven", nested_s, total);
  finish(result.load_other_dim, "load onto Shard(1)", other_s, total);
  std::int64_t hsdp_bytes = 0;
  for (const std::int64_t b : result.load_hsdp.bytes_read_per_rank)
    hsdp_bytes += b;
  finish(result.load_hsdp, "load onto 2 x n (R, S0)", hsdp_s, hsdp_bytes);
  return result;
}

}  // namespace meshtensor::bench
