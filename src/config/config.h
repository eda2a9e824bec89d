#pragma once
// The input file (YAML) as typed structs. Every key is validated: unknown keys, wrong types and
// out-of-range values throw ConfigError whose message starts with "FILE:LINE: key.path: ".
// `--set dotted.key=value` overrides are applied to the YAML tree before validation, and an
// error in one names "--set dotted.key".
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "comm/device_buffers.h"
#include "config/enums.h"
#include "models/family.h"
#include "optim/optimizer_config.h"
#include "tensor/dtype.h"
#include "tensor/error.h"
#include "tensor/matmul_precision.h"
#include "tensor/tensor.h"  // Device

namespace fsdp {

class ConfigError : public Error {
 public:
  using Error::Error;
};

struct ModelConfig {
  std::string kind = "mnist_cnn";  // a registered family's name (models/family.h)
  // "" = none; an HDF5 file with /model/<state_dict name> datasets, a .safetensors file, or a
  // Hugging Face model folder (config.json fills the model keys: config/hf_config.h)
  std::string init_from;
  // A Hugging Face hub model of the family whose keys this sets (ModelFamily::presets); keys given
  // beside it override. "" = none.
  std::string preset;
  // Every key of the family, set (given, from init_from's config.json or a preset, or its
  // default) and of its type; no key of another family.
  ModelArgs args;
  bool operator==(const ModelConfig&) const = default;
  const ModelFamily& family() const { return family_of(kind); }
};

struct DataConfig {
  DataKind kind = DataKind::fashion_mnist;
  std::string path;                  // fashion_mnist: dir (default Debian's); text: file/folder
  double eval_fraction = 0.05;       // text: tail of the corpus held out, in (0, 1)
  int64_t synthetic_samples = 1024;  // synthetic: train samples (eval gets a quarter)
  // seq2seq: a CSV file (header row; name ending in .csv) or JSON lines; `source`/`target` name
  // its columns/fields. Tokens: bytes (ByT5's ids: byte + 3, pad 0, eos 1) or, with `tokenizer`,
  // a SentencePiece model's (T5's pad 0, eos 1); truncated to the lengths with eos kept.
  std::string source = "text";
  std::string target = "headline";
  int64_t source_len = 512;
  int64_t target_len = 150;
  std::string tokenizer;              // "" = bytes; else a SentencePiece model file (spiece.model)
  std::string eval_path;              // seq2seq: a validation file ("" = the tail of path, eval_fraction)
  TextClean clean = TextClean::none;  // wikihow: the FSDP tutorial's WikiHow clean-up
  bool loss_on_padding = false;       // labels pad (not -100) after eos: the tutorial's loss
  // causal_lm (data/data.h's CausalLmOptions): pretraining rows are lines or the JSON field
  // `field`; sft reads JSON lines {prompt, response} under these names, padded or packed.
  std::string field = "text";
  bool sft = false;
  bool pack = false;
  std::string prompt = "prompt", response = "response";
};

// train.eval_every: after each epoch ('epoch'), never ('never'), or every `steps` steps.
struct EvalEvery {
  enum class When { epoch, never, steps } when = When::epoch;
  int64_t steps = 0;  // When::steps: >= 1
  bool never() const { return when == When::never; }
  // Whether an evaluation follows the step that made `steps_done` steps.
  bool due(int64_t steps_done, bool epoch_end) const {
    return when == When::epoch ? epoch_end : when == When::steps && steps_done % steps == 0;
  }
  std::string text() const;  // as written: "epoch", "never" or the count
};

struct TrainConfig {
  int64_t batch_size = 64;  // per rank
  // > 0: the global batch, whatever the world size (batch_size becomes this / ranks): the same
  // recipe, and the same losses, at any number of ranks.
  int64_t global_batch_size = 0;
  int64_t epochs = 1;
  int64_t steps = 0;             // > 0: stop after this many steps in total
  int64_t stop_after_steps = 0;  // > 0: this launch runs at most this many steps, saves, exits
                                 // (a job chunked to fit a wall-time limit; the rest on resume)
  uint64_t seed = 1;
  int64_t grad_accum = 1;
  double clip_grad_norm = 0.0;  // 0 = off
  OptimizerConfig optimizer;
  SchedulerConfig scheduler;
  EvalEvery eval_every;
  int64_t eval_batch_size = 1000;
  bool dropout = true;
  bool shuffle = true;
  int64_t threads = 0;          // 0 = leave OpenBLAS/OpenMP defaults
  Device device = Device::cpu;  // where tensors live and kernels run
  // f32 GEMM operands as they are (highest), rounded to TF32 (high) or to bf16 (medium), f32
  // accumulation: torch.set_float32_matmul_precision (tensor/matmul_precision.h).
  MatmulPrecision matmul_precision = MatmulPrecision::highest;
};

struct MixedPrecisionConfig {
  DType param_dtype = DType::f32;  // f32 | bf16 | f16
  DType reduce_dtype = DType::f32;
  DType buffer_dtype = DType::f32;
  ComputePrecision compute = ComputePrecision::param_dtype;  // fsdp/strategy.h
  // What the forward's activations wait for their backward in (nn/activation_stash.h): param_dtype
  // (under compute: param_dtype their values are that dtype's already) or f32. Same names as
  // compute's.
  ComputePrecision saved_activations = ComputePrecision::param_dtype;
  double init_loss_scale = 65536.0;  // f16 dynamic loss scaling starts here (GradScaler's 2^16)
};

struct FsdpConfig {
  Strategy sharding_strategy = Strategy::full_shard;
  WrapPolicy wrap_policy = WrapPolicy::size_based;  // auto_wrap.policy
  int64_t min_num_params = 100;                     // auto_wrap.min_num_params
  std::vector<std::string> wrap_modules;            // auto_wrap.modules (manual)
  MixedPrecisionConfig mixed_precision;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::pre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  bool node_shared_params = false;
  bool activation_checkpointing = false;
  bool cpu_offload = false;
  int64_t shard_group_size = 0;  // hybrid.shard_group_size, 0 = ranks per node
};

struct CommConfig {
  std::string backend = "mpi";                              // one this build has (config/backends.h: mpi, ucx, nccl)
  double timeout_s = 300.0;                                 // > 0
  DeviceBuffers device_buffers = DeviceBuffers::automatic;  // device runs on mpi/ucx (comm/device_buffers.h)
};

struct CheckpointConfig {
  std::string dir;
  CheckpointFormat format = CheckpointFormat::consolidated;
  int64_t every_steps = 0;
  int64_t keep = 2;  // >= 1
  bool save_best = false;
  std::string resume;  // "" | auto | path
  // MPI-IO transfers of a save: independent | collective. Independent is the default: each
  // rank's pieces are large contiguous ranges already, and on one node the two-phase exchange
  // of collective buffering only adds copies (jobs/bench-ckpt.sh measures both).
  CheckpointIo io = CheckpointIo::independent;
};

struct OutputConfig {
  std::string metrics;       // JSON-lines file, "" = none
  int64_t log_every = 10;    // >= 1
  std::string save_weights;  // at the end: HDF5 file with /model/<state_dict name> (full shapes)
  // Chrome trace of every rank's FSDP phases (train/trace_file.h), "" = none; the metrics lines
  // then carry the step breakdown. trace_steps: [first, last], 1-based and inclusive.
  std::string trace;
  int64_t trace_first_step = 1;
  int64_t trace_last_step = std::numeric_limits<int64_t>::max();
};

// Text generation (sequence-to-sequence models): fsdp_app --generate N, and ROUGE on the
// validation set at each evaluation.
struct GenerateConfig {
  int64_t num_beams = 1;        // 1: greedy search
  int64_t max_new_tokens = 0;   // 0: data.target_len
  double length_penalty = 1.0;  // beam search: hypotheses score sum_logprobs / length^this
  int64_t batch_size = 0;       // samples per rank per decoding batch; 0: train.eval_batch_size
  // Validation samples scored with ROUGE-1/2/L at each evaluation: the first N; -1 (default)
  // the whole validation set for data.kind seq2seq and none for synthetic pairs; 0 none.
  int64_t rouge_samples = -1;
  // Causal LMs (llama): each validation sample's first prompt_len tokens are the prompt, the rest
  // its reference; 0: half of model.seq_len.
  int64_t prompt_len = 0;
  // Sampling instead of greedy search (num_beams 1): HF's do_sample with its warpers.
  bool do_sample = false;
  double temperature = 1.0;
  int64_t top_k = 50;  // 0: off
  double top_p = 1.0;  // 1: off
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  FsdpConfig fsdp;
  CommConfig comm;
  CheckpointConfig checkpoint;
  OutputConfig output;
  GenerateConfig generate;
  std::string source_path;  // the input file
  std::string yaml_text;    // the input file's text after overrides (stored in checkpoints)
};

// Reads and validates `path` with overrides ("dotted.key=value", value parsed as YAML).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The config as a run on `world_size` ranks sees it: train.global_batch_size, when given,
// becomes the per-rank train.batch_size (ConfigError when the ranks do not divide it).
Config for_world_size(const Config& config, int world_size);
// The dtype a unit's forward and backward compute in (fsdp.mixed_precision.compute) and the
// facts a model family checks its keys against (models/family.h).
DType compute_dtype(const MixedPrecisionConfig& mp);
// The dtype a training forward's activations are held in until their backward
// (fsdp.mixed_precision.saved_activations): compute_dtype when that is bf16/f16 and
// saved_activations is param_dtype, else f32 (no stash).
DType saved_activation_dtype(const MixedPrecisionConfig& mp);
ModelRunFacts model_run_facts(const Config& config);

// The input file's key reference in Markdown, generated from the table of known keys (types,
// allowed values, descriptions) and a default Config (the defaults): `fsdp_app --keys` prints it
// and docs/input-file.md is its output.
std::string input_file_reference();
// Every known key, dotted as written in the YAML, in the table's order.
std::vector<std::string> input_file_keys();

// Same from text; `source_name` is used in messages in place of a file name.
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

}  // namespace fsdp
