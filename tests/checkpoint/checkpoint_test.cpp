// Checkpoints on the threads backend: the safetensors format and its reader's checks, the
// composable checksum, saving from and loading onto any layout, crash-safe directories and the
// errors of bad checkpoints.
#include <filesystem>
#include <fstream>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <meshtensor/checkpoint/checkpoint.hpp>
#include <meshtensor/checkpoint/checksum.hpp>
#include <meshtensor/checkpoint/safetensors.hpp>
#include <meshtensor/comm/mesh_groups.hpp>
#include <meshtensor/comm/threads_backend.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/parse.hpp>

#include "support/error_message.hpp"

namespace meshtensor::checkpoint {
namespace {

namespace fs = std::filesystem;
using testing::error_message;

/// A fresh directory under the system's temporary directory, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device entropy;
    path_ = fs::temp_directory_path() / fmt::format("meshtensor-checkpoint-{:08x}", entropy());
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string str() const { return path_.string(); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

std::span<const std::byte> as_bytes(const std::string& text) {
  return std::as_bytes(std::span<const char>(text));
}

// ---- safetensors ----

std::string make_file(std::vector<SafetensorsEntry> entries) {
  std::string file = encode_safetensors_header(entries, {{"k", "v"}});
  file.append(static_cast<std::size_t>(entries.empty() ? 0 : entries.back().end), 'x');
  return file;
}

std::string with_header(const std::string& json, std::int64_t data_bytes) {
  std::string file(8, '\0');
  for (std::size_t i = 0; i < 8; ++i)
    file[i] = static_cast<char>((json.size() >> (8 * i)) & 0xFF);
  return file + json + std::string(static_cast<std::size_t>(data_bytes), 'x');
}

TEST(Safetensors, EncodesAndParsesBack) {
  const std::string file =
      make_file({{"w", DType::f32, Shape{2, 3}, 0, 0}, {"b", DType::bf16, Shape{3}, 0, 0}});
  const SafetensorsHeader header = parse_safetensors_file(as_bytes(file), "f");
  EXPECT_EQ(header.data_start % 8, 0);  // the data starts aligned
  ASSERT_EQ(header.entries.size(), 2u);
  EXPECT_EQ(header.entries[0], (SafetensorsEntry{"w", DType::f32, Shape{2, 3}, 0, 24}));
  EXPECT_EQ(header.entries[1], (SafetensorsEntry{"b", DType::bf16, Shape{3}, 24, 30}));
  EXPECT_EQ(header.metadata.at("k"), "v");
  EXPECT_EQ(header.data_start + header.data_bytes, static_cast<std::int64_t>(file.size()));
  EXPECT_EQ(file.substr(8, 1), "{");
}

TEST(Safetensors, RefusesWhatTheSpecificationForbids) {
  const auto error = [](const std::string& file) {
    return error_message([&] { parse_safetensors_file(as_bytes(file), "x.safetensors"); });
  };
  const std::string good = make_file({{"w", DType::f32, Shape{2}, 0, 0}});
  EXPECT_NE(error(good.substr(0, good.size() - 1)).find("truncated"), std::string::npos);
  EXPECT_NE(error(good + "z").find("trailing bytes"), std::string::npos);
  EXPECT_NE(error("abc").find("shorter than the 8-byte"), std::string::npos);
  EXPECT_NE(error(std::string(8, '\xff') + "{}").find("header length"), std::string::npos);
  EXPECT_NE(error(with_header("[1]", 0)).find("does not start with '{'"), std::string::npos);
  EXPECT_NE(error(with_header("{\"w\":", 0)).find("not a JSON object"), std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                              8))
                .find("'w' appears twice"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"Q7","shape":[1],"data_offsets":[0,4]}})", 4))
                .find("'Q7'"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4))
                .find("do not hold the 8 bytes"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4))
                .find("not a size >= 0"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})", 2))
                .find("starts at byte 1 of the data, expected 0 (gap)"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                              R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                              3))
                .find("overlap"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"__metadata__":{"a":1}})", 0)).find("not a string"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1))
                .find("exactly dtype, shape and data_offsets"),
            std::string::npos);
  EXPECT_NE(error(with_header(R"({"w":{"dtype":"U8","shape":[1e30],"data_offsets":[0,1]}})", 1))
                .find("tensor 'w'"),
            std::string::npos);
}

TEST(Safetensors, ScalarsAndEmptyTensorsAreValid) {
  const std::string file =
      make_file({{"s", DType::i64, Shape{}, 0, 0}, {"e", DType::f32, Shape{0, 4}, 0, 0}});
  const SafetensorsHeader header = parse_safetensors_file(as_bytes(file), "f");
  EXPECT_EQ(header.find("s")->end, 8);
  EXPECT_EQ(header.find("e")->begin, header.find("e")->end);
}

// ---- checksum ----

TEST(Checksum, AnyPartitionSumsToTheWhole) {
  std::mt19937_64 random(7);
  std::vector<std::byte> bytes(1001);
  for (auto& b : bytes)
    b = static_cast<std::byte>(random());
  const std::uint64_t whole = block_checksum(bytes);
  for (int round = 0; round < 50; ++round) {
    std::size_t at = 0;
    std::uint64_t sum = 0;
    while (at < bytes.size()) {
      const std::size_t n = std::min<std::size_t>(random() % 40, bytes.size() - at);
      sum += block_checksum(std::span(bytes).subspan(at, n), at);
      at += n;
    }
    EXPECT_EQ(sum, whole);
  }
  for (std::size_t i = 0; i < bytes.size(); i += 97) {
    auto changed = bytes;
    changed[i] ^= std::byte{0x10};
    EXPECT_NE(block_checksum(changed), whole) << i;
  }
  auto swapped = bytes;
  std::swap_ranges(swapped.begin(), swapped.begin() + 8, swapped.begin() + 8);
  EXPECT_NE(block_checksum(swapped), whole);
}

// ---- save and load on layouts ----

struct Named {
  std::string name;
  Tensor global;
};

/// Tensors of uneven sizes in several dtypes.
std::vector<Named> sample_tensors() {
  return {{"layer.weight", Tensor::random_normal(Shape{13, 7}, DType::f32, 1)},
          {"layer.bias", Tensor::random_normal(Shape{5}, DType::bf16, 2)},
          {"moments", Tensor::random_normal(Shape{3, 5, 2}, DType::f64, 3)},
          {"counts", Tensor::random_int(Shape{9, 2}, DType::i64, 4, -1000, 1000)}};
}

/// A layout: a mesh and the spec of a tensor of rank `rank` on it.
struct Placing {
  std::string mesh;
  std::string spec_1d;  // for 1-D tensors
  std::string spec_nd;  // for the others
  const std::string& spec(int rank) const { return rank == 1 ? spec_1d : spec_nd; }
};

const Placing kFsdp8{"8", "S0", "S0"};
const Placing kHsdp2x2{"2x2", "R,S0", "R,S0"};
const Placing kDdp3{"3", "R", "R"};
const Placing kOne{"1", "R", "R"};
const Placing kDim1On4{"4", "S0", "S1"};
const Placing kTwoDims{"2x3", "S0,S0", "S1,S0"};

void save_on(const Placing& placing, const std::vector<Named>& tensors, const std::string& root,
             std::int64_t step) {
  const DeviceMesh mesh = parse_mesh(placing.mesh);
  comm::run_threads(static_cast<int>(mesh.size()), [&](comm::Communicator& world) {
    auto groups = std::make_shared<comm::MeshGroups>(
        mesh, std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
    std::vector<SaveItem> items;
    for (const Named& t : tensors) {
      const auto dt =
          dtensor::distribute(t.global, groups, parse_spec(placing.spec(t.global.rank())));
      items.push_back(save_item(dt, t.name));
    }
    save(world, root, step, items);
  });
}

/// Loads every tensor onto `placing` and checks each rank's block against the global tensor
/// and that it read exactly its blocks' bytes.
void load_and_check(const Placing& placing, const std::vector<Named>& tensors,
                    const std::string& path) {
  const DeviceMesh mesh = parse_mesh(placing.mesh);
  comm::run_threads(static_cast<int>(mesh.size()), [&](comm::Communicator& world) {
    std::vector<LoadRequest> requests;
    std::int64_t wanted = 0;
    for (const Named& t : tensors) {
      requests.push_back(load_request(t.name, mesh, parse_spec(placing.spec(t.global.rank())),
                                      t.global.shape(), t.global.dtype(), world.rank()));
      wanted +=
          requests.back().shape.numel() * static_cast<std::int64_t>(dtype_size(t.global.dtype()));
    }
    LoadStats stats;
    const std::vector<Tensor> loaded = load(world, path, requests, &stats);
    ASSERT_EQ(loaded.size(), tensors.size());
    for (std::size_t i = 0; i < tensors.size(); ++i) {
      const Layout layout{requests[i].shape, requests[i].offset};
      EXPECT_TRUE(loaded[i].bitwise_equal(local_view(tensors[i].global, layout).contiguous()))
          << tensors[i].name << " on " << placing.mesh << " rank " << world.rank();
    }
    EXPECT_EQ(stats.bytes_read, wanted) << placing.mesh << " rank " << world.rank();
  });
}

TEST(Reshard, FsdpThenHsdpThenDdpThenOneRankWithUnevenShapes) {
  const TempDir dir;
  const std::vector<Named> tensors = sample_tensors();
  const Placing chain[] = {kFsdp8, kHsdp2x2, kDdp3, kOne, kDim1On4, kTwoDims, kFsdp8};
  save_on(chain[0], tensors, dir / "0", 1);
  for (std::size_t i = 1; i < std::size(chain); ++i) {
    // The previous layout's checkpoint loads onto this one, which saves its own.
    load_and_check(chain[i], tensors, dir / std::to_string(i - 1));
    save_on(chain[i], tensors, dir / std::to_string(i), static_cast<std::int64_t>(i + 1));
  }
  // And the first checkpoint loads directly onto every layout.
  for (const Placing& placing : chain)
    load_and_check(placing, tensors, dir / "0");
}

TEST(Reshard, EveryStoredBlockIsVerifiedOnAnyLayout) {
  const TempDir dir;
  const std::vector<Named> tensors = sample_tensors();
  save_on(kFsdp8, tensors, dir.str(), 3);
  const Index index = read_index(dir.str());
  std::int64_t blocks = 0;
  for (const StoredTensor& t : index.tensors)
    blocks += static_cast<std::int64_t>(t.blocks.size());
  for (const Placing& placing : {kDim1On4, kHsdp2x2, kDdp3}) {
    const DeviceMesh mesh = parse_mesh(placing.mesh);
    comm::run_threads(static_cast<int>(mesh.size()), [&](comm::Communicator& world) {
      std::vector<LoadRequest> requests;
      for (const Named& t : tensors)
        requests.push_back(load_request(t.name, mesh, parse_spec(placing.spec(t.global.rank())),
                                        t.global.shape(), t.global.dtype(), world.rank()));
      LoadStats stats;
      load(world, dir.str(), requests, &stats);
      EXPECT_EQ(stats.blocks_verified, blocks);
    });
  }
}

TEST(Save, WritesOneFilePerOwningRankAndAnIndex) {
  const TempDir dir;
  const std::vector<Named> tensors = sample_tensors();
  save_on(kHsdp2x2, tensors, dir.str(), 7);
  const std::string checkpoint = resolve(dir.str());
  EXPECT_EQ(fs::path(checkpoint).filename(), "step-00000007");
  EXPECT_EQ(file_bytes(dir / "LATEST"), "step-00000007\n");
  // Only the first replica writes: ranks 0 and 1 of the 2x2 mesh.
  EXPECT_TRUE(fs::exists(fs::path(checkpoint) / "rank-00000.safetensors"));
  EXPECT_TRUE(fs::exists(fs::path(checkpoint) / "rank-00001.safetensors"));
  EXPECT_FALSE(fs::exists(fs::path(checkpoint) / "rank-00002.safetensors"));
  const Index index = read_index(dir.str());
  EXPECT_EQ(index.step, 7);
  EXPECT_EQ(index.world_size, 4);
  const StoredTensor* weight = index.find("layer.weight");
  ASSERT_NE(weight, nullptr);
  EXPECT_EQ(weight->shape, (Shape{13, 7}));
  ASSERT_EQ(weight->blocks.size(), 2u);
  EXPECT_EQ(weight->blocks[1].offset, (std::vector<std::int64_t>{7, 0}));
  EXPECT_EQ(weight->blocks[1].shape, (Shape{6, 7}));
  const VerifyReport report = verify(dir.str());
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
  EXPECT_EQ(report.blocks, 8);
  // Each file is valid safetensors on its own.
  const SafetensorsHeader header =
      read_safetensors_header((fs::path(checkpoint) / "rank-00001.safetensors").string());
  EXPECT_EQ(header.find("layer.weight")->shape, (Shape{6, 7}));
  EXPECT_EQ(header.metadata.at("format"), "meshtensor");
}

TEST(Save, PartialTensorsAreReducedAndScalarsKept) {
  const TempDir dir;
  const DeviceMesh mesh({2, 2});
  comm::run_threads(4, [&](comm::Communicator& world) {
    auto groups = std::make_shared<comm::MeshGroups>(
        mesh, std::shared_ptr<comm::Communicator>(&world, [](comm::Communicator*) {}));
    // Every rank holds 1 + rank: the sum over the partial dim 1 is (1+2r0*2) + (2+2r0*2).
    const auto partial = dtensor::from_local(Tensor::full(Shape{3}, DType::f32, 1.0 + world.rank()),
                                             groups, parse_spec("S0,P"), Shape{6});
    const auto scalar = dtensor::from_local(Tensor::full(Shape{}, DType::i64, 42), groups,
                                            parse_spec("R,R"), Shape{});
    const SaveItem items[] = {save_item(partial, "p"), save_item(scalar, "step")};
    save(world, dir.str(), 1, items);
  });
  comm::run_threads(1, [&](comm::Communicator& world) {
    const LoadRequest requests[] = {{"p", Shape{6}, DType::f32, {}, Shape{6}, true},
                                    {"step", Shape{}, DType::i64, {}, Shape{}, true}};
    const std::vector<Tensor> loaded = load(world, dir.str(), requests);
    EXPECT_EQ(loaded[0].values<float>()[0], 3.0f);  // ranks 0 and 1
    EXPECT_EQ(loaded[0].values<float>()[5], 7.0f);  // ranks 2 and 3
    EXPECT_EQ(loaded[1].values<std::int64_t>()[0], 42);
  });
}

TEST(Save, LatestMovesOnlyAfterACompleteSaveAndKeepPrunes) {
  const TempDir dir;
  const std::vector<Named> tensors = sample_tensors();
  save_on(kFsdp8, tensors, dir.str(), 5);
  save_on(kFsdp8, tensors, dir.str(), 5);  // the same step again gets a new name
  EXPECT_EQ(file_bytes(dir / "LATEST"), "step-00000005.1\n");
  comm::run_threads(2, [&](comm::Communicator& world) {
    SaveOptions options;
    options.keep = 2;
    options.metadata["run"] = "unit";
    const SaveItem item{
        "x", Shape{4}, {world.rank() * 2}, Tensor::full(Shape{2}, DType::f32, 1), true};
    save(world, dir.str(), 9, std::span(&item, 1), options);
  });
  EXPECT_FALSE(fs::exists(dir / "step-00000005"));
  EXPECT_TRUE(fs::exists(dir / "step-00000005.1"));
  EXPECT_TRUE(fs::exists(dir / "step-00000009"));
  EXPECT_EQ(read_index(dir.str()).metadata.at("run"), "unit");
}

TEST(Save, BlocksThatDoNotTileFailOnEveryRankAndCommitNothing) {
  const TempDir dir;
  save_on(kOne, sample_tensors(), dir.str(), 1);
  const auto attempt = [&](std::int64_t second_offset, std::int64_t second_size) {
    std::vector<std::string> errors(2);
    try {
      comm::run_threads(2, [&](comm::Communicator& world) {
        const std::int64_t offset = world.rank() == 0 ? 0 : second_offset;
        const std::int64_t size = world.rank() == 0 ? 5 : second_size;
        const SaveItem item{"x", Shape{10}, {offset}, Tensor::zeros(Shape{size}, DType::f32), true};
        errors[static_cast<std::size_t>(world.rank())] =
            error_message([&] { save(world, dir.str(), 2, std::span(&item, 1)); });
      });
    } catch (const Error&) {
    }
    EXPECT_EQ(errors[0], errors[1]);
    return errors[0];
  };
  EXPECT_NE(attempt(4, 5).find("overlap"), std::string::npos);
  EXPECT_NE(attempt(5, 4).find("cover 9 of its 10 elements"), std::string::npos);
  EXPECT_NE(attempt(8, 5).find("lies outside 10"), std::string::npos);
  EXPECT_EQ(file_bytes(dir / "LATEST"), "step-00000001\n");
  EXPECT_EQ(fs::directory_iterator(dir.str()) == fs::directory_iterator(), false);
  for (const auto& entry : fs::directory_iterator(dir.str()))
    EXPECT_TRUE(entry.path().filename() == "LATEST" || entry.path().filename() == "step-00000001")
        << entry.path();
}

// ---- errors on load ----

/// Loads the sample tensors on 4 ranks as S0 / S1; returns each rank's error message.
std::vector<std::string> load_errors(const std::string& path, std::vector<Named> tensors) {
  std::vector<std::string> errors(4);
  const DeviceMesh mesh({4});
  comm::run_threads(4, [&](comm::Communicator& world) {
    std::vector<LoadRequest> requests;
    for (const Named& t : tensors)
      requests.push_back(load_request(t.name, mesh, parse_spec(kDim1On4.spec(t.global.rank())),
                                      t.global.shape(), t.global.dtype(), world.rank()));
    std::vector<Tensor> loaded;
    errors[static_cast<std::size_t>(world.rank())] =
        error_message([&] { loaded = load(world, path, requests); });
    if (errors[static_cast<std::size_t>(world.rank())] != "no error") {
      EXPECT_TRUE(loaded.empty());  // nothing half-loaded
    }
  });
  for (const std::string& e : errors)
    EXPECT_EQ(e, errors[0]);
  return errors;
}

class LoadErrors : public ::testing::Test {
 protected:
  void SetUp() override {
    save_on(kFsdp8, tensors_, dir_.str(), 4);
    checkpoint_ = resolve(dir_.str());
  }
  std::string rank_file(int rank) const {
    return (fs::path(checkpoint_) / fmt::format("rank-{:05d}.safetensors", rank)).string();
  }
  TempDir dir_;
  std::vector<Named> tensors_ = sample_tensors();
  std::string checkpoint_;
};

TEST_F(LoadErrors, MissingTensorWrongShapeWrongDtype) {
  auto missing = tensors_;
  missing.push_back({"nowhere", Tensor::zeros(Shape{2}, DType::f32)});
  EXPECT_NE(load_errors(dir_.str(), missing)[0].find("has no tensor 'nowhere'"), std::string::npos);
  auto shape = tensors_;
  shape[0].global = Tensor::zeros(Shape{13, 8}, DType::f32);
  EXPECT_NE(load_errors(dir_.str(), shape)[0].find("tensor 'layer.weight'"), std::string::npos);
  EXPECT_NE(load_errors(dir_.str(), shape)[0].find("is f32 13x7, but f32 13x8 is expected"),
            std::string::npos)
      << load_errors(dir_.str(), shape)[0];
  auto dtype = tensors_;
  dtype[1].global = Tensor::zeros(Shape{5}, DType::f32);
  EXPECT_NE(load_errors(dir_.str(), dtype)[0].find("is bf16 5, but f32 5 is expected"),
            std::string::npos);
}

TEST_F(LoadErrors, TruncatedFile) {
  const std::string bytes = file_bytes(rank_file(3));
  write_bytes(rank_file(3), bytes.substr(0, bytes.size() - 3));
  const std::string error = load_errors(dir_.str(), tensors_)[0];
  EXPECT_NE(error.find("rank-00003.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("truncated"), std::string::npos) << error;
  EXPECT_FALSE(verify(dir_.str()).problems.empty());
}

TEST_F(LoadErrors, CorruptDataFailsTheChecksumEvenWhenEachRankReadsPart) {
  std::string bytes = file_bytes(rank_file(2));
  bytes[bytes.size() - 5] ^= 0x01;  // inside the last block of rank 2's file
  write_bytes(rank_file(2), bytes);
  const std::string error = load_errors(dir_.str(), tensors_)[0];
  EXPECT_NE(error.find("checksum mismatch"), std::string::npos) << error;
  EXPECT_NE(error.find("rank-00002.safetensors"), std::string::npos) << error;
  EXPECT_NE(error.find("tensor '"), std::string::npos) << error;
  const VerifyReport report = verify(dir_.str());
  ASSERT_EQ(report.problems.size(), 1u);
  EXPECT_NE(report.problems[0].find("checksum mismatch"), std::string::npos);
}

TEST_F(LoadErrors, CorruptHeaderIndexAndMissingFile) {
  std::string bytes = file_bytes(rank_file(1));
  bytes[8] = '[';
  write_bytes(rank_file(1), bytes);
  std::string error = load_errors(dir_.str(), tensors_)[0];
  EXPECT_NE(error.find("rank-00001.safetensors is not a valid safetensors file"), std::string::npos)
      << error;
  fs::remove(rank_file(1));
  error = load_errors(dir_.str(), tensors_)[0];
  EXPECT_NE(error.find("cannot open"), std::string::npos) << error;
  EXPECT_NE(error.find("rank-00001.safetensors"), std::string::npos) << error;
  write_bytes((fs::path(checkpoint_) / "index.json").string(), "{\"format\": 3}");
  error = load_errors(dir_.str(), tensors_)[0];
  EXPECT_NE(error.find("index.json is not a checkpoint index"), std::string::npos) << error;
  EXPECT_NE(load_errors(dir_ / "elsewhere", tensors_)[0].find("no checkpoint at"),
            std::string::npos);
}

TEST(Index, RoundTripsAndRefusesBadBlocks) {
  Index index;
  index.step = 3;
  index.world_size = 2;
  index.files["rank-00000.safetensors"] = 100;
  index.tensors.push_back(
      {"w", DType::f32, Shape{4}, {{"rank-00000.safetensors", {0}, Shape{4}, 0, 16, 0xabc}}});
  const Index back = parse_index(index.to_json(), "i");
  EXPECT_EQ(back.to_json(), index.to_json());
  auto edited = nlohmann::json::parse(index.to_json());
  edited["tensors"]["w"]["blocks"][0]["offset"] = {1};
  EXPECT_NE(error_message([&] { parse_index(edited.dump(), "i"); }).find("lies outside 4"),
            std::string::npos);
  auto escaping = nlohmann::json::parse(index.to_json());
  escaping["files"]["../x"] = {{"bytes", 100}};
  EXPECT_NE(error_message([&] { parse_index(escaping.dump(), "i"); }).find("not a plain file name"),
            std::string::npos);
}

}  // namespace
}  // namespace meshtensor::checkpoint
