#pragma once
// Text generation on the FSDP model (the families that generate: T5 from its sources, Llama from
// prompts cut from its samples): every unit gathered once for all the decoding batches
// (FsdpEngine::unshard_all), not once per generated token; each rank decodes its contiguous slice
// of the samples, as evaluation splits batches.
#include <cstdint>
#include <string>
#include <vector>

#include "models/generate.h"
#include "train/rouge.h"

namespace fsdp {

class FsdpEngine;
class MemoryTracker;
class Dataset;
class Model;
class Seq2SeqDataset;

struct GenerationOptions {
  GenerateOptions search;
  int64_t batch_size = 16;  // samples per rank per decoding batch
  int64_t prompt_len = 0;   // > 0: a sample's first prompt_len input tokens are its prompt (causal LMs),
                            // unless the data gives the sample its own (Dataset::prompt_tokens)
  int rank = 0, world_size = 1;
  bool progress = false;  // a bar on this rank's terminal
};

// Samples [0, count) of `data` decoded (from their inputs, or their first o.prompt_len input
// tokens); every rank calls it. Rank 0 gets every sample's ids in order, the others an empty list.
std::vector<std::vector<int32_t>> generate_samples(Model& model, FsdpEngine& engine, const Dataset& data, int64_t count,
                                                   const GenerationOptions& o, MemoryTracker& mem);

struct RougeResult {
  RougeScores mean;    // F-measures averaged over the samples
  int64_t count = 0;   // samples scored
  double seconds = 0;  // decoding and scoring
};
// ROUGE of the decoded samples [0, count) against their reference texts; every rank calls it and
// gets the result.
RougeResult rouge_of_samples(Model& model, FsdpEngine& engine, const Seq2SeqDataset& data, int64_t count,
                             const GenerationOptions& o, MemoryTracker& mem);

// One JSON line of `fsdp_app --generate`: {"index":..., "source":..., "reference":...,
// "generated":..., "generated_ids":[...]} (texts JSON-escaped).
std::string generation_json(int64_t index, const Seq2SeqDataset& data, const std::vector<int32_t>& ids);
// A causal LM's line: {"index", "prompt_ids", "reference_ids" (the sample's labelled tokens after
// the prompt), "generated_ids"}, and "prompt", "reference" and "generated" as text: decoded by
// the data's tokenizer (causal_lm data), or with raw byte tokens (bytes true) as bytes (invalid
// UTF-8 as U+FFFD). A sample with a prompt of its own (fine-tuning data) uses that prompt.
std::string lm_generation_json(int64_t index, const Dataset& data, int64_t prompt_len, bool bytes,
                               const std::vector<int32_t>& ids);

}  // namespace fsdp
