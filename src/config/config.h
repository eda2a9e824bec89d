#pragma once
// The input file (YAML) as typed structs. Every key is validated: unknown keys, wrong types and
// out-of-range values throw ConfigError whose message starts with "FILE:LINE: key.path: ".
// `--set dotted.key=value` overrides are applied to the YAML tree before validation, and an
// error in one names "--set dotted.key".
#include <cstdint>
#include <string>
#include <vector>

#include "tensor/error.h"

namespace fsdp {

class ConfigError : public Error {
 public:
  using Error::Error;
};

struct ModelConfig {
  std::string kind = "mnist_cnn";  // mnist_cnn | transformer
  int64_t vocab = 256;             // transformer fields
  int64_t d_model = 512;
  int64_t n_layers = 8;
  int64_t n_heads = 8;  // d_model % n_heads == 0
  int64_t d_ff = 2048;
  int64_t seq_len = 256;
  std::string init_from;  // HDF5 file with /model/<state_dict name> datasets; "" = none
};

struct DataConfig {
  std::string kind = "fashion_mnist";  // fashion_mnist | text | synthetic
  std::string path;                    // fashion_mnist: dir (default Debian's); text: file/folder
  double eval_fraction = 0.05;         // text: tail of the corpus held out, in (0, 1)
  int64_t synthetic_samples = 1024;    // synthetic: train samples (eval gets a quarter)
};

struct OptimizerConfig {
  std::string kind = "adadelta";  // sgd | adadelta | adamw
  double lr = 1.0;
  double momentum = 0.0;      // sgd
  double dampening = 0.0;     // sgd
  bool nesterov = false;      // sgd
  double weight_decay = 0.0;  // all (adamw default 0.01 when not given)
  double rho = 0.9;           // adadelta
  double eps = 1e-6;          // adadelta 1e-6, adamw 1e-8 when not given
  double beta1 = 0.9;         // adamw
  double beta2 = 0.999;       // adamw
};

struct SchedulerConfig {
  std::string kind = "none";  // none | step | cosine
  int64_t step_size = 1;      // step: epochs between decays
  double gamma = 0.7;         // step
  int64_t warmup_steps = 0;   // cosine: linear warmup from 0
  int64_t total_steps = 0;    // cosine: 0 = the run's total steps
  double min_lr = 0.0;        // cosine floor
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
  std::string eval_every = "epoch";  // "epoch", "never", or a step count as text ("100")
  int64_t eval_batch_size = 1000;
  bool dropout = true;
  bool shuffle = true;
  int64_t threads = 0;         // 0 = leave OpenBLAS/OpenMP defaults
  std::string device = "cpu";  // cpu | cuda: where tensors live and kernels run
};

struct MixedPrecisionConfig {
  std::string param_dtype = "f32";  // f32 | bf16 | f16
  std::string reduce_dtype = "f32";
  std::string buffer_dtype = "f32";
  double init_loss_scale = 65536.0;  // f16 dynamic loss scaling starts here (GradScaler's 2^16)
};

struct FsdpConfig {
  std::string sharding_strategy = "FULL_SHARD";  // FULL_SHARD | SHARD_GRAD_OP | NO_SHARD |
                                                 // HYBRID_SHARD | HYBRID_SHARD_ZERO2
  std::string wrap_policy = "size_based";        // auto_wrap.policy: size_based |
                                                 // transformer_layer | manual
  int64_t min_num_params = 100;                  // auto_wrap.min_num_params
  std::vector<std::string> wrap_modules;         // auto_wrap.modules (manual)
  MixedPrecisionConfig mixed_precision;
  std::string backward_prefetch = "BACKWARD_PRE";  // BACKWARD_PRE | BACKWARD_POST | none
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  bool activation_checkpointing = false;
  bool cpu_offload = false;
  int64_t shard_group_size = 0;  // hybrid.shard_group_size, 0 = ranks per node
  // debug.skip_replicate_reduce: drops HYBRID's replicate all_reduce — only so a test can show
  // that the equivalence check catches a gradient that never crosses the replicate group.
  bool debug_skip_replicate_reduce = false;
};

struct CommConfig {
  std::string backend = "mpi";  // mpi | ucx | nccl
  double timeout_s = 300.0;     // > 0
};

struct CheckpointConfig {
  std::string dir;
  std::string format = "consolidated";  // consolidated | sharded
  int64_t every_steps = 0;
  int64_t keep = 2;  // >= 1
  bool save_best = false;
  std::string resume;  // "" | auto | path
  // MPI-IO transfers of a save: independent | collective. Independent is the default: each
  // rank's pieces are large contiguous ranges already, and on one node the two-phase exchange
  // of collective buffering only adds copies (jobs/bench-ckpt.sh measures both).
  std::string io = "independent";
};

struct OutputConfig {
  std::string metrics;       // JSON-lines file, "" = none
  int64_t log_every = 10;    // >= 1
  std::string save_weights;  // at the end: HDF5 file with /model/<state_dict name> (full shapes)
};

struct Config {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  FsdpConfig fsdp;
  CommConfig comm;
  CheckpointConfig checkpoint;
  OutputConfig output;
  std::string source_path;  // the input file
  std::string yaml_text;    // the input file's text after overrides (stored in checkpoints)
};

// Reads and validates `path` with overrides ("dotted.key=value", value parsed as YAML).
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The config as a run on `world_size` ranks sees it: train.global_batch_size, when given,
// becomes the per-rank train.batch_size (ConfigError when the ranks do not divide it).
Config for_world_size(const Config& config, int world_size);

// Same from text; `source_name` is used in messages in place of a file name.
Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides = {});

}  // namespace fsdp
