#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include <meshtensor/comm/communicator.hpp>
#include <meshtensor/core/shape.hpp>
#include <meshtensor/core/tensor.hpp>
#include <meshtensor/dtensor/dtensor.hpp>
#include <meshtensor/mesh/layout.hpp>

namespace meshtensor::checkpoint {

/// One block of a global tensor that this rank holds, to be saved.
struct SaveItem {
  std::string name;                  ///< the tensor's name, unique in the checkpoint
  Shape global_shape;                ///< the whole tensor's shape
  std::vector<std::int64_t> offset;  ///< the block's first element in it (empty: the origin)
  Tensor data;                       ///< the block; its shape is the block's extent
  bool owner = true;  ///< false on the other ranks of a replica set: one rank writes each block
};

/// How save() names and keeps checkpoints.
struct SaveOptions {
  std::map<std::string, std::string> metadata;  ///< kept in the index, e.g. the run's config
  int keep = 0;  ///< after saving, remove all but the newest `keep` checkpoints (0: keep all)
};

/// Name of the index file inside a checkpoint directory.
inline constexpr char kIndexFile[] = "index.json";
/// Name of the file under a checkpoint root that names the newest complete checkpoint.
inline constexpr char kLatestFile[] = "LATEST";
/// Largest index file read (an index of about a million blocks).
inline constexpr std::int64_t kMaxIndexBytes = std::int64_t{256} << 20;

/// Refuses, with InvalidArgument naming the path, a `root` that save() must not write into: a
/// path that is not a directory, a directory holding an index.json (a checkpoint directory, or
/// someone's file that would hide the checkpoints from a resume), or one whose LATEST is not a
/// pointer that a save wrote. A missing root is fine. save() checks it too; a trainer calls it
/// before training so that a bad root fails before any work.
void check_save_root(const std::string& root);

/// Saves a checkpoint of step `step` under the directory `root` (created when missing);
/// collective over `world`, which must be every rank holding a block. Each rank that owns
/// blocks writes them to its own safetensors file `rank-NNNNN.safetensors` (one entry per block,
/// named after its tensor); world rank 0 writes `index.json` naming for every tensor its global
/// shape, dtype and the file, global offset, extent, byte range and checksum of every block.
///
/// Crash safety: everything is written into a temporary directory under `root` and synced
/// (fsync of every file and directory); only when every rank has written does world rank 0 check
/// that the owners' blocks tile every tensor exactly once, rename the directory to
/// `step-NNNNNNNN` (a suffix ".N" when that name is taken) and then replace `LATEST` with its
/// name (write, sync, rename). A rank killed at any moment leaves the previous checkpoint and
/// `LATEST` as they were; leftovers of interrupted saves (directories named as the save names its
/// temporaries that hold only files a save writes) are removed by the next save; nothing else
/// under `root` is touched. Bad input
/// (overlapping or missing blocks, dtypes or shapes that differ between ranks) and write errors
/// throw on every rank, and nothing is renamed. Returns the new checkpoint's directory.
std::string save(comm::Communicator& world, const std::string& root, std::int64_t step,
                 std::span<const SaveItem> items, const SaveOptions& options = {});

/// One block this rank wants from a checkpoint.
struct LoadRequest {
  std::string name;
  Shape global_shape;  ///< what the checkpoint must hold (else DataError)
  DType dtype = DType::f32;
  std::vector<std::int64_t> offset;  ///< the block's first element (empty: the origin)
  Shape shape;                       ///< the block's extent
  /// True on one rank of each set holding the same block: the reads of these ranks together
  /// check each stored block's checksum without anyone reading a byte twice.
  bool verifier = true;
};

/// What a load() read on this rank.
struct LoadStats {
  std::int64_t bytes_read = 0;       ///< data bytes read: the bytes of this rank's target blocks
  std::int64_t reads = 0;            ///< read calls for data
  std::int64_t files = 0;            ///< files opened (headers checked)
  std::int64_t blocks_verified = 0;  ///< stored blocks whose checksum the ranks checked together
};

/// Loads the blocks of `requests` from the checkpoint `path` (a checkpoint directory, or a root
/// whose `LATEST` names one); collective over `world`. Each rank reads exactly the byte ranges of
/// the stored blocks that overlap its target blocks, so a checkpoint loads onto any mesh, world
/// size or sharding. Stored blocks whose bytes the verifiers read in full are checked against
/// their checksums. Returns one new tensor per request; on any error (a missing tensor, another
/// shape or dtype, a file missing, truncated or not matching the index, a checksum mismatch, on
/// any rank) every rank throws DataError naming the tensor and the file, and returns nothing.
std::vector<Tensor> load(comm::Communicator& world, const std::string& path,
                         std::span<const LoadRequest> requests, LoadStats* stats = nullptr);

/// A block as the index records it.
struct StoredBlock {
  std::string file;                  ///< safetensors file in the checkpoint directory
  std::vector<std::int64_t> offset;  ///< first element in the global tensor
  Shape shape;                       ///< extent
  std::int64_t begin = 0;            ///< data_offsets in the file's data section
  std::int64_t end = 0;
  std::uint64_t checksum = 0;  ///< block_checksum of its bytes
};

/// A tensor as the index records it.
struct StoredTensor {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::vector<StoredBlock> blocks;
  /// Bytes of the whole tensor.
  std::int64_t nbytes() const;
};

/// The index of a checkpoint.
struct Index {
  std::int64_t step = 0;
  std::int64_t world_size = 0;  ///< ranks that saved it
  std::map<std::string, std::string> metadata;
  std::map<std::string, std::int64_t> files;  ///< file name -> bytes
  std::vector<StoredTensor> tensors;          ///< sorted by name
  /// The tensor named `name`, or nullptr.
  const StoredTensor* find(const std::string& name) const;
  /// The index as JSON text (the format of index.json).
  std::string to_json() const;
};

/// The checksum of an index's metadata (its "metadata_checksum"), so that metadata which is
/// read before any tensor (a model's architecture) is covered like the tensors' bytes.
std::uint64_t metadata_checksum(const std::map<std::string, std::string>& metadata);

/// Parses index JSON text (`file` names it in errors): DataError unless it is a valid index
/// whose blocks lie inside their tensors and name plain files of the directory, and whose
/// metadata matches its checksum (version 2; version 1 indexes have none).
Index parse_index(const std::string& text, const std::string& file);

/// The checkpoint directory `path` names: `path` when it holds index.json, else the directory
/// `path/LATEST` names. DataError when neither is there.
std::string resolve(const std::string& path);

/// The index of the checkpoint `path` names (see resolve()).
Index read_index(const std::string& path);

/// What verify() found.
struct VerifyReport {
  std::string directory;
  std::int64_t files = 0;
  std::int64_t blocks = 0;
  std::int64_t bytes = 0;
  std::vector<std::string> problems;  ///< empty: the checkpoint is intact
};

/// Reconciles the index of the checkpoint directory `directory` with its files, reading only
/// their headers: every file the index lists is there with its recorded size and a valid
/// safetensors header, every block matches an entry of its file (dtype, shape, byte range inside
/// the file), and every entry of every file is referenced by exactly one block. Returns the
/// problems found (each naming the file and the tensor); empty when they agree. `files_read`
/// counts the files whose header was read.
std::vector<std::string> reconcile(const std::string& directory, const Index& index,
                                   std::int64_t* files_read = nullptr);

/// Checks a whole checkpoint on its own, without a communicator: reconcile(), then every
/// block's bytes against its checksum (each tensor's blocks tiling it is checked when the index
/// is read). Problems are collected (each naming the tensor and the file), not thrown; a missing
/// or unreadable index throws DataError.
VerifyReport verify(const std::string& path);

/// The SaveItem of a DTensor: its local block, owned by the rank at coordinate 0 of every
/// non-Shard mesh dim. A Partial tensor is reduced first (collective over its mesh then).
SaveItem save_item(const dtensor::DTensor& tensor, std::string name);

/// The LoadRequest of `name` as a tensor of `global_shape` and `dtype` placed by `spec` on
/// `mesh`, for `rank` (Partial placements load as Replicate).
LoadRequest load_request(std::string name, const DeviceMesh& mesh, const PlacementSpec& spec,
                         const Shape& global_shape, DType dtype, std::int64_t rank);

}  // namespace meshtensor::checkpoint
