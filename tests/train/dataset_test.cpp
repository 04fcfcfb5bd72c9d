#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <unistd.h>
#include <vector>
#include <zlib.h>

#include <gtest/gtest.h>

#include <meshtensor/core/error.hpp>
#include <meshtensor/train/dataset.hpp>

namespace meshtensor::train {
namespace {

namespace fs = std::filesystem;

std::vector<std::uint8_t> idx_bytes(std::vector<std::int32_t> dims, std::int64_t data_bytes,
                                    std::uint8_t type = 0x08) {
  std::vector<std::uint8_t> out = {0, 0, type, static_cast<std::uint8_t>(dims.size())};
  for (std::int32_t d : dims)
    for (int shift = 24; shift >= 0; shift -= 8)
      out.push_back(static_cast<std::uint8_t>(d >> shift));
  for (std::int64_t i = 0; i < data_bytes; ++i)
    out.push_back(static_cast<std::uint8_t>(i % 10));
  return out;
}

class DataDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("meshtensor-data-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    write("train-images-idx3-ubyte", idx_bytes({6, 2, 3}, 36), true);
    write("train-labels-idx1-ubyte", idx_bytes({6}, 6), true);
    write("t10k-images-idx3-ubyte", idx_bytes({4, 2, 3}, 24), false);
    write("t10k-labels-idx1-ubyte", idx_bytes({4}, 4), false);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const std::string& name, const std::vector<std::uint8_t>& bytes, bool gzip) {
    fs::remove(dir_ / name);
    fs::remove(dir_ / (name + ".gz"));
    if (gzip) {
      gzFile file = gzopen((dir_ / (name + ".gz")).c_str(), "wb");
      gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
      gzclose(file);
    } else {
      std::ofstream(dir_ / name, std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()),
                 static_cast<std::streamsize>(bytes.size()));
    }
  }

  void expect_error(const std::string& fragment) {
    try {
      load_dataset(dir_.string());
      FAIL() << "no error, expected one naming: " << fragment;
    } catch (const DataError& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  }

  fs::path dir_;
};

TEST_F(DataDir, ReadsGzipAndPlainFiles) {
  const Dataset data = load_dataset(dir_.string());
  EXPECT_EQ(data.train.count, 6);
  EXPECT_EQ(data.train.features(), 6);
  EXPECT_EQ(data.test.count, 4);
  EXPECT_EQ(data.train.pixels.size(), 36u);
  EXPECT_EQ(data.train.labels, (std::vector<std::uint8_t>{0, 1, 2, 3, 4, 5}));
}

TEST_F(DataDir, MissingFileIsNamed) {
  fs::remove(dir_ / "t10k-labels-idx1-ubyte");
  expect_error("t10k-labels-idx1-ubyte[.gz]: no such file");
}

TEST_F(DataDir, BadMagicIsNamed) {
  auto bytes = idx_bytes({6}, 6);
  bytes[0] = 0x1f;
  bytes[1] = 0x00;
  write("train-labels-idx1-ubyte", bytes, false);
  expect_error("train-labels-idx1-ubyte: bad magic 1f00");
}

TEST_F(DataDir, WrongElementTypeAndDimCountAreNamed) {
  write("train-labels-idx1-ubyte", idx_bytes({6}, 24, 0x0d), true);
  expect_error("element type 0x0d is not unsigned byte");
  write("train-labels-idx1-ubyte", idx_bytes({6, 1}, 6), true);
  expect_error("2 dims where 1 were expected");
}

TEST_F(DataDir, TruncatedDataIsNamed) {
  write("train-images-idx3-ubyte", idx_bytes({6, 2, 3}, 30), true);
  expect_error(
      "train-images-idx3-ubyte.gz: truncated: the dims need 36 bytes of data, the file has 30");
}

TEST_F(DataDir, TruncatedGzipStreamIsNamed) {
  gzFile file = gzopen((dir_ / "t.gz").c_str(), "wb");
  const auto bytes = idx_bytes({6, 2, 3}, 36);
  gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(file);
  std::ifstream in(dir_ / "t.gz", std::ios::binary);
  std::vector<char> content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  content.resize(content.size() - 12);
  std::ofstream(dir_ / "train-images-idx3-ubyte.gz", std::ios::binary)
      .write(content.data(), static_cast<std::streamsize>(content.size()));
  expect_error("gzip stream is truncated");
}

TEST_F(DataDir, CorruptGzipStreamIsNamed) {
  std::vector<std::uint8_t> bytes = {0x1f, 0x8b, 0x08, 0,    0,    0,    0,   0,
                                     0,    3,    0xff, 0xff, 0xff, 0xff, 0xff};
  write("train-images-idx3-ubyte", bytes, false);
  expect_error("bad gzip stream");
}

TEST_F(DataDir, CountMismatchAndBadLabelsAreNamed) {
  write("train-labels-idx1-ubyte", idx_bytes({5}, 5), true);
  expect_error("holds 6 images but");
  auto labels = idx_bytes({6}, 6);
  labels.back() = 12;
  write("train-labels-idx1-ubyte", labels, true);
  expect_error("label 12 of sample 5 is not below 10");
}

TEST(Idx, ParsesEveryPrefixOfAFileWithoutCrashing) {
  const auto bytes = idx_bytes({3, 2, 2}, 12);
  for (std::size_t length = 0; length < bytes.size(); ++length) {
    EXPECT_THROW(parse_idx(std::as_bytes(std::span(bytes.data(), length)), 3, "prefix"), DataError);
  }
  EXPECT_EQ(parse_idx(std::as_bytes(std::span(bytes)), 3, "whole").data.size(), 12u);
}

TEST(EpochOrder, IsAPermutationThatDependsOnSeedAndEpochOnly) {
  const auto order = epoch_order(1000, 7, 0);
  EXPECT_EQ(std::set<std::int64_t>(order.begin(), order.end()).size(), 1000u);
  EXPECT_EQ(order, epoch_order(1000, 7, 0));
  EXPECT_NE(order, epoch_order(1000, 7, 1));
  EXPECT_NE(order, epoch_order(1000, 8, 0));
}

}  // namespace
}  // namespace meshtensor::train
