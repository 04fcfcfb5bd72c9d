#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <meshtensor/nn/decode.hpp>
#include <meshtensor/nn/decoder_spec.hpp>
#include <meshtensor/nn/module.hpp>

namespace meshtensor::nn {

/// What training, generation and the parallel plans need of a decoder-only language model over
/// i64 tokens [batch, sequence] -> f32 logits [batch, sequence, vocabulary], whatever its spec. Its
/// units are the natural parameter groups and pipeline pieces: the embedding, every block and the
/// head, in forward order.
class Decoder : public Module {
 public:
  /// The embedding, every block and the head, in forward order.
  virtual std::vector<Module*> units() = 0;
  /// Every unit's parameters, in units() order.
  std::vector<Parameter*> parameters() override;
  /// The units as parameter groups (FSDP groups): modules whose parameters must gather, reduce
  /// and step together because they share one (a tied head and the embedding) form one group.
  /// By default every unit alone.
  virtual std::vector<std::vector<Module*>> parameter_groups();
  /// Exact mode's sums, whose bits do not depend on the tensor-parallel degree
  /// (TransformerDecoder:: set_exact_sums).
  virtual void set_exact_sums(bool on) = 0;
  /// Whether set_exact_sums is on.
  virtual bool exact_sums() const = 0;
  /// Context parallelism (null: whole sequences): forward takes the tokens of the positions
  /// `split` gives this rank, embeds and rotates them at those positions and attends over the
  /// whole sequence through `split`; every row has the bits it has in the whole sequence. It
  /// must outlive the model or be removed first.
  virtual void set_sequence_split(SequenceSplit* split) = 0;
  /// One key/value cache per block for `slots` sequences of up to the whole context, sized for
  /// the key/value heads this rank computes; a slot holds memory once reserved (reserve_slot).
  virtual std::vector<KeyValueCache> make_caches(std::int64_t slots) = 0;
  /// Incremental forward of the rows `rows` places with the keys and values of earlier
  /// positions in `caches`: logits [rows, vocabulary], each row's the bits forward() gives that
  /// position of its whole sequence.
  virtual Tensor decode(const Tensor& tokens, const DecodeRows& rows,
                        std::vector<KeyValueCache>& caches) = 0;
  /// Longest sequence.
  virtual std::int64_t context() const = 0;
  /// Tokens of the vocabulary.
  virtual std::int64_t vocabulary() const = 0;
  /// Blocks.
  virtual std::int64_t layers() const = 0;
  /// Features of the residual stream.
  virtual std::int64_t dim() const = 0;
  /// The spec the model was built from.
  virtual DecoderSpec decoder_spec() const = 0;
  /// The model text its config parses from ("gpt:...", "llama:...").
  virtual std::string config_text() const = 0;
};

/// One key/value cache per layer for `slots` sequences of up to `context` positions, layer l
/// holding heads[l] heads of `head_dim` values; no slot reserved yet (reserve_slot).
std::vector<KeyValueCache> make_layer_caches(std::int64_t slots,
                                             const std::vector<std::int64_t>& heads,
                                             std::int64_t head_dim, std::int64_t context);

}  // namespace meshtensor::nn
