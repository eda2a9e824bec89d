// Input file -> Config in three passes over one YAML tree:
//  1. the file is parsed and the --set overrides are merged into the tree, so a value from the
//     command line goes through exactly the same checks as one from the file;
//  2. the tree is walked against a table of known keys (unknown keys, sections that are not
//     maps, keys given twice);
//  3. each given value is converted and range-checked from the same table, then the rules that
//     involve several keys run.
// Only keys the user gave are checked one by one: the defaults in config.h are valid by
// construction, and a missing key has no line to point at.
//
// yaml_text: without overrides it is the file text verbatim (comments kept); with overrides it is
// the merged tree emitted by YAML::Emitter under a comment naming the overrides, so that parsing
// yaml_text alone reproduces the run exactly (a list of "--set" lines in a comment would not).
#include "config/config.h"

#include "config/backends.h"
#include "config/hf_config.h"
#include "tensor/device.h"  // device_name

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string_view>
#include <variant>

namespace fsdp {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Bound {
  double lo = -kInf, hi = kInf;
  bool lo_open = false, hi_open = false;

  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
  std::string text() const {
    std::ostringstream s;
    if (hi == kInf)
      s << (lo_open ? "> " : ">= ") << lo;
    else
      s << "in " << (lo_open ? '(' : '[') << lo << ", " << hi << (hi_open ? ')' : ']');
    return s.str();
  }
};
Bound at_least(double lo) { return {lo}; }
Bound above(double lo) { return {lo, kInf, true}; }
Bound closed(double lo, double hi) { return {lo, hi}; }                    // [lo, hi]
Bound closed_open(double lo, double hi) { return {lo, hi, false, true}; }  // [lo, hi)
Bound open_open(double lo, double hi) { return {lo, hi, true, true}; }     // (lo, hi)
Bound unbounded() { return {}; }

// Targets that need more than one scalar conversion.
struct Betas {
  double* b1;
  double* b2;
};
struct StepWindow {  // [first, last]
  int64_t* first;
  int64_t* last;
};
// An enumerated key: the value must be one of `names`; set(i) stores the i-th value, current()
// names the stored one (the key reference's default).
struct Choice {
  std::vector<std::string> names;
  std::function<void(size_t)> set;
  std::function<std::string()> current;
  bool per_build = false;  // `names` depend on the build: the key reference describes them instead
};
using Target = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<std::string>*, Betas,
                            EvalEvery*, StepWindow, Choice>;

// The choice of one enum's name table (config/enums.h).
template <class E, size_t N>
Choice choice(E* dst, const NameTable<E, N>& table) {
  Choice c;
  for (const auto& [value, name] : table) c.names.emplace_back(name);
  c.set = [dst, &table](size_t i) { *dst = table[i].first; };
  c.current = [dst, &table] { return std::string(name_of(table, *dst)); };
  return c;
}

// A choice among values that name themselves (a subset of DType, Device).
template <class E, class NameFn>
Choice choice(E* dst, std::vector<E> values, NameFn name) {
  Choice c;
  for (E v : values) c.names.emplace_back(name(v));
  c.set = [dst, values = std::move(values)](size_t i) { *dst = values[i]; };
  c.current = [dst, name] { return std::string(name(*dst)); };
  return c;
}

// A string that must be one of `names` (comm.backend: the backends this build has; model.preset).
Choice choice(std::string* dst, std::vector<std::string> names) {
  Choice c;
  c.names = std::move(names);
  c.set = [dst, names = c.names](size_t i) { *dst = names[i]; };
  c.current = [dst] { return *dst; };
  return c;
}

// HF hub presets for model.kind t5 (each config.json: vocab_size 32128, 32 buckets, max
// distance 128): t5-small 60,506,624 parameters, t5-base 222,903,552, t5-large 737,668,096.
struct T5Preset {
  const char* name;
  int64_t d_model, d_kv, d_ff, layers, heads;
  bool v1_1;  // gated-gelu, untied lm_head
};
constexpr T5Preset kT5Presets[] = {
    {"t5-small", 512, 64, 2048, 6, 8, false},
    {"t5-base", 768, 64, 3072, 12, 12, false},
    {"t5-large", 1024, 64, 4096, 24, 16, false},
    {"t5-3b", 1024, 128, 16384, 24, 32, false},
    {"t5-11b", 1024, 128, 65536, 24, 128, false},
    {"google/t5-v1_1-small", 512, 64, 1024, 8, 6, true},
    {"google/t5-v1_1-base", 768, 64, 2048, 12, 12, true},
    {"google/t5-v1_1-large", 1024, 64, 2816, 24, 16, true},
    {"google/t5-v1_1-xl", 2048, 64, 5120, 24, 32, true},
    {"google/t5-v1_1-xxl", 4096, 64, 10240, 24, 64, true},
};

// The model keys each kind reads (model.kind and model.init_from: every kind): those its
// config.json sets, and t5's preset.
std::vector<std::string> model_keys(ModelKind kind) {
  std::vector<std::string> keys = hf_config_keys(kind);
  if (kind == ModelKind::t5) keys.insert(keys.begin(), "preset");
  if (kind == ModelKind::transformer) keys.emplace_back("attention");
  return keys;
}

struct Field {
  std::string path;  // dotted, as written in the YAML
  Target target;
  Bound bound = {};
  const char* doc = "";  // one line for the key reference: meaning, units, the PyTorch/HF name
};

// comm.backend: the backends this build has. The key reference describes them instead of listing
// them, so that docs/input-file.md is the same for every build.
Choice built_backends(std::string* dst) {
  Choice c = choice(dst, built_backend_names());
  c.per_build = true;
  return c;
}

// The one list of known keys; sections are the prefixes of these paths. Long because it is a
// table, one entry per key with its description: splitting it would scatter the schema.
// `fsdp_app --keys` prints it as docs/input-file.md (input_file_reference).
std::vector<Field> schema(Config& c) {
  ModelConfig& m = c.model;
  DataConfig& d = c.data;
  TrainConfig& t = c.train;
  OptimizerConfig& o = t.optimizer;
  SchedulerConfig& s = t.scheduler;
  FsdpConfig& f = c.fsdp;
  MixedPrecisionConfig& mp = f.mixed_precision;
  CheckpointConfig& k = c.checkpoint;
  OutputConfig& out = c.output;
  GenerateConfig& g = c.generate;
  const std::vector<DType> precisions = {DType::f32, DType::bf16, DType::f16};
  std::vector<std::string> preset_names;
  for (const T5Preset& p : kT5Presets) preset_names.emplace_back(p.name);
  return {
      {"model.kind", choice(&m.kind, kModelKinds), unbounded(),
       "The model: `mnist_cnn` PyTorch's MNIST example Net (28x28 images, 10 classes), `transformer` a decoder-only "
       "LM (embeddings, model.n_layers blocks, a final LayerNorm, a head), `t5` Hugging Face's "
       "T5ForConditionalGeneration (its state_dict names)"},
      {"model.vocab", &m.vocab, at_least(1),
       "transformer: the token vocabulary (embedding rows, head outputs); at most 256 with `data.kind: text` (bytes)"},
      {"model.d_model", &m.d_model, at_least(1),
       "transformer and t5: the hidden width, that of the residual stream (`embed_dim`, HF's d_model)"},
      {"model.n_layers", &m.n_layers, at_least(1), "transformer: the number of blocks"},
      {"model.n_heads", &m.n_heads, at_least(1),
       "transformer: attention heads per block (`nn.MultiheadAttention`'s num_heads); must divide model.d_model"},
      {"model.d_ff", &m.d_ff, at_least(1),
       "transformer and t5: the inner width of each feed-forward layer (`dim_feedforward`, HF's d_ff)"},
      {"model.seq_len", &m.seq_len, at_least(1),
       "transformer: tokens per sample, the context length (learned positions); a text sample is this many bytes"},
      {"model.attention", choice(&m.attention, kAttentionModes), unbounded(),
       "transformer: what attention keeps for the backward: `materialized` the (B, H, T, T) probabilities (as "
       "`nn.MultiheadAttention`), `recompute` each row's max and 1/sum (the backward recomputes the scores), `fused` "
       "cuDNN's flash attention (needs `train.device: cuda`, `train.matmul_precision: medium` and a head dim that is "
       "a multiple of 8)"},
      {"model.init_from", &m.init_from, unbounded(),
       "Initial weights, any kind: an HDF5 file with `/model/<state_dict name>` (a consolidated checkpoint, "
       "output.save_weights), a `.safetensors` file, or a Hugging Face model folder whose config.json also sets the "
       "model keys (`from_pretrained`); empty: the model's own initialisation"},
      {"model.preset", choice(&m.preset, preset_names), unbounded(),
       "t5: a Hugging Face hub model whose sizes this sets (T5 presets, below); keys given beside it override it; "
       "empty: none"},
      {"model.vocab_size", &m.vocab_size, at_least(1),
       "t5: the vocabulary (rows of `shared`, outputs of the head; HF's vocab_size); at least 259 for byte tokens, "
       "and at least data.tokenizer's pieces"},
      {"model.d_kv", &m.d_kv, at_least(1),
       "t5: the width of each head's q, k and v (HF's d_kv); attention's inner width is num_heads x d_kv"},
      {"model.num_layers", &m.num_layers, at_least(1), "t5: encoder blocks (HF's num_layers)"},
      {"model.num_decoder_layers", &m.num_decoder_layers, at_least(1),
       "t5: decoder blocks (HF's num_decoder_layers); when not given, model.num_layers"},
      {"model.num_heads", &m.num_heads, at_least(1), "t5: attention heads (HF's num_heads)"},
      {"model.relative_attention_num_buckets", &m.relative_attention_num_buckets, at_least(2),
       "t5: buckets of the relative position bias (HF's relative_attention_num_buckets)"},
      {"model.relative_attention_max_distance", &m.relative_attention_max_distance, at_least(1),
       "t5: the distance from which relative positions share the last bucket (HF's relative_attention_max_distance)"},
      {"model.feed_forward_proj", choice(&m.feed_forward_proj, kFeedForwardProjs), unbounded(),
       "t5: the feed-forward layer (HF's feed_forward_proj): `relu` T5 v1.0's (wi, wo), `gated-gelu` v1.1's "
       "(wi_0, wi_1, wo; gelu_new)"},
      {"model.tie_word_embeddings", &m.tie_word_embeddings, unbounded(),
       "t5: the head is `shared.weight`, its input scaled by d_model^-0.5 (HF's tie_word_embeddings); false: a head "
       "of its own, `lm_head.weight` (v1.1)"},
      {"model.dropout_rate", &m.dropout_rate, closed_open(0, 1),
       "t5: the probability of every dropout (HF's dropout_rate); `train.dropout: false` turns them off"},
      {"model.layer_norm_epsilon", &m.layer_norm_epsilon, above(0),
       "t5: epsilon of the RMS norms (T5LayerNorm; HF's layer_norm_epsilon)"},
      {"model.initializer_factor", &m.initializer_factor, above(0),
       "t5: the scale of HF's initialisation (HF's initializer_factor; 1 is HF's own)"},
      {"data.kind", choice(&d.kind, kDataKinds), unbounded(),
       "The data: `fashion_mnist` Fashion-MNIST images (mnist_cnn), `text` byte tokens from a file or folder "
       "(transformer), `synthetic` generated samples of the model's shape (images, tokens or t5's pairs), `seq2seq` "
       "source and target texts from a file (t5)"},
      {"data.source", &d.source, unbounded(),
       "seq2seq: the CSV column or JSON-lines field that holds the source (input) text"},
      {"data.target", &d.target, unbounded(), "seq2seq: the CSV column or JSON-lines field that holds the target text"},
      {"data.source_len", &d.source_len, at_least(2),
       "t5: source tokens per sample: a longer source is cut to source_len - 1 tokens and eos, a shorter one padded "
       "(a tokenizer's max_length with truncation and padding)"},
      {"data.target_len", &d.target_len, at_least(2),
       "t5: label tokens per sample, cut and padded as the source; also the generation length when "
       "generate.max_new_tokens is 0"},
      {"data.path", &d.path, unbounded(),
       "fashion_mnist: the folder of IDX files (empty: Debian's dataset-fashion-mnist); text: a file, or a folder "
       "whose files are concatenated (empty: Debian's fortunes); seq2seq: the CSV (a name ending in .csv) or "
       "JSON-lines file, required"},
      {"data.tokenizer", &d.tokenizer, unbounded(),
       "t5: a SentencePiece model file (an HF T5 folder's spiece.model, as T5Tokenizer reads it; pad 0, eos 1); "
       "empty: byte tokens with ByT5's ids (byte + 3, pad 0, eos 1)"},
      {"data.eval_path", &d.eval_path, unbounded(),
       "seq2seq: a validation file in data.path's format; empty: the last data.eval_fraction of data.path's rows"},
      {"data.clean", choice(&d.clean, kTextCleans), unbounded(),
       "seq2seq: the clean-up before tokenizing: `none`, or `wikihow` the PyTorch FSDP tutorial's WikiHow "
       "preparation"},
      {"data.loss_on_padding", &d.loss_on_padding, unbounded(),
       "t5: the labels after eos are pad, which the loss counts (the PyTorch FSDP tutorial's loss); false: -100, "
       "ignored (HF's CrossEntropyLoss ignore_index)"},
      {"data.eval_fraction", &d.eval_fraction, open_open(0, 1),
       "text, and seq2seq without data.eval_path: the fraction of the samples (text) or rows (seq2seq) at the end "
       "that evaluate instead of training"},
      {"data.synthetic_samples", &d.synthetic_samples, at_least(1),
       "synthetic: training samples; the evaluation set is a quarter of that (at least 1)"},
      {"train.batch_size", &t.batch_size, at_least(1),
       "Samples per rank in each micro-batch (the per-rank DataLoader batch_size); replaced by "
       "train.global_batch_size / ranks when that is given"},
      {"train.global_batch_size", &t.global_batch_size, at_least(0),
       "> 0: the samples of one micro-batch over all ranks, split evenly (the ranks must divide it): the same "
       "losses at any world size; 0: train.batch_size x ranks"},
      {"train.epochs", &t.epochs, at_least(0),
       "Passes over the training data when train.steps is 0 (a last partial global batch is dropped)"},
      {"train.steps", &t.steps, at_least(0),
       "> 0: exactly this many optimizer steps in all, across epochs as needed; 0: train.epochs decides"},
      {"train.stop_after_steps", &t.stop_after_steps, at_least(0),
       "> 0: this launch ends after this many steps (saving a checkpoint when checkpoint.dir is set) and a resume "
       "runs the rest: a job cut to fit a wall-time limit; 0: no limit"},
      {"train.seed", &t.seed, unbounded(),
       "Seeds the initialisation, the shuffle, dropout masks and synthetic data (torch.manual_seed); the same "
       "values at any world size"},
      {"train.grad_accum", &t.grad_accum, at_least(1),
       "Micro-batches per optimizer step; gradients are reduced after the last one only (FSDP's no_sync)"},
      {"train.clip_grad_norm", &t.clip_grad_norm, at_least(0),
       "> 0: the gradients' global L2 norm is clipped to this before each step (FSDP's clip_grad_norm_ max_norm); "
       "0: off"},
      {"train.eval_every", &t.eval_every, unbounded(),
       "When to evaluate: `epoch` after every epoch, `never`, or every N optimizer steps; a run that finishes also "
       "evaluates at its end"},
      {"train.eval_batch_size", &t.eval_batch_size, at_least(1),
       "Evaluation samples per rank per batch (the MNIST example's test_batch_size); generate.batch_size's default"},
      {"train.dropout", &t.dropout, unbounded(),
       "false: every dropout is off while training too (mnist_cnn's and t5's; the transformer has none)"},
      {"train.shuffle", &t.shuffle, unbounded(),
       "Reshuffle the training samples every epoch, by train.seed and the same at any world size "
       "(DistributedSampler's shuffle); false: in order"},
      {"train.threads", &t.threads, at_least(0),
       "> 0: BLAS and OpenMP threads per rank (torch.set_num_threads); 0: OpenBLAS's and OpenMP's defaults "
       "(OPENBLAS_NUM_THREADS, OMP_NUM_THREADS)"},
      {"train.device", choice(&t.device, {Device::cpu, Device::cuda}, device_name), unbounded(),
       "Where tensors live and kernels run: `cpu`, or `cuda` (a GPU per rank: its local rank modulo the GPUs)"},
      {"train.matmul_precision",
       choice(&t.matmul_precision, {MatmulPrecision::highest, MatmulPrecision::high, MatmulPrecision::medium},
              matmul_precision_name),
       unbounded(),
       "f32 GEMM operands as they are (`highest`), rounded to TF32 (`high`) or to bf16 (`medium`), f32 "
       "accumulation (torch.set_float32_matmul_precision)"},
      {"train.optimizer.kind", choice(&o.kind, kOptimizerKinds), unbounded(),
       "`sgd` torch.optim.SGD, `adadelta` torch.optim.Adadelta, `adamw` torch.optim.AdamW; each takes its own keys "
       "(Keys by optimizer, below)"},
      {"train.optimizer.lr", &o.lr, above(0),
       "The learning rate, the schedule's base (the default is adadelta's: Keys by optimizer gives the others)"},
      {"train.optimizer.momentum", &o.momentum, at_least(0), "sgd: the momentum factor (SGD's momentum)"},
      {"train.optimizer.dampening", &o.dampening, unbounded(), "sgd: dampening for momentum (SGD's dampening)"},
      {"train.optimizer.nesterov", &o.nesterov, unbounded(),
       "sgd: Nesterov momentum (SGD's nesterov; needs momentum > 0 and dampening 0)"},
      {"train.optimizer.weight_decay", &o.weight_decay, at_least(0),
       "sgd, adadelta: an L2 penalty added to the gradient; adamw: decoupled weight decay (its default differs: "
       "Keys by optimizer)"},
      {"train.optimizer.rho", &o.rho, closed(0, 1),
       "adadelta: the coefficient of the running averages of squared gradients and updates (Adadelta's rho)"},
      {"train.optimizer.eps", &o.eps, above(0),
       "adadelta, adamw: the term added to denominators for numerical stability (the default is adadelta's: Keys "
       "by optimizer)"},
      {"train.optimizer.betas", Betas{&o.beta1, &o.beta2}, closed_open(0, 1),
       "adamw: [beta1, beta2], the coefficients of the running averages of the gradient and its square (AdamW's "
       "betas)"},
      {"train.scheduler.kind", choice(&s.kind, kSchedulerKinds), unbounded(),
       "The learning-rate schedule: `none` constant, `step` StepLR stepped per epoch, `cosine` a linear warmup "
       "then a cosine decay to min_lr (CosineAnnealingLR after the warmup)"},
      {"train.scheduler.step_size", &s.step_size, at_least(1), "step: epochs between decays (StepLR's step_size)"},
      {"train.scheduler.gamma", &s.gamma, above(0), "step: the factor of each decay (StepLR's gamma)"},
      {"train.scheduler.warmup_steps", &s.warmup_steps, at_least(0),
       "cosine: steps of linear warmup, lr x (step + 1) / warmup_steps; 0: none"},
      {"train.scheduler.total_steps", &s.total_steps, at_least(0),
       "cosine: the step where the decay reaches min_lr, warmup included; 0: the run's total steps"},
      {"train.scheduler.min_lr", &s.min_lr, at_least(0),
       "cosine: the learning rate the decay ends at (CosineAnnealingLR's eta_min)"},
      {"fsdp.sharding_strategy", choice(&f.sharding_strategy, kStrategies), unbounded(),
       "PyTorch's ShardingStrategy: `FULL_SHARD` shards parameters, gradients and optimizer state, `SHARD_GRAD_OP` "
       "keeps the parameters gathered from forward to backward, `NO_SHARD` replicates (DDP), `HYBRID_SHARD` and "
       "`HYBRID_SHARD_ZERO2` are the first two within a shard group (a node, or fsdp.hybrid.shard_group_size "
       "ranks) and replicate across groups"},
      {"fsdp.auto_wrap.policy", choice(&f.wrap_policy, kWrapPolicies), unbounded(),
       "Which modules become FSDP units: `size_based` PyTorch's size_based_auto_wrap_policy, `transformer_layer` "
       "transformer_auto_wrap_policy on the model's block (TransformerBlock, T5Block), `manual` those "
       "fsdp.auto_wrap.modules names"},
      {"fsdp.auto_wrap.min_num_params", &f.min_num_params, at_least(0),
       "size_based: a module becomes a unit when its subtree holds at least this many parameters outside inner "
       "units (size_based_auto_wrap_policy's min_num_params)"},
      {"fsdp.auto_wrap.modules", &f.wrap_modules, unbounded(),
       "manual: the paths of the modules to wrap, at any depth (e.g. `[encoder.block.0, decoder.block.3]`); "
       "required by manual"},
      {"fsdp.mixed_precision.param_dtype", choice(&mp.param_dtype, precisions, dtype_name), unbounded(),
       "MixedPrecision's param_dtype: parameters are gathered in it and computed with at its values (activations "
       "and arithmetic stay f32)"},
      {"fsdp.mixed_precision.reduce_dtype", choice(&mp.reduce_dtype, precisions, dtype_name), unbounded(),
       "MixedPrecision's reduce_dtype: the precision gradients are reduced in"},
      {"fsdp.mixed_precision.buffer_dtype", choice(&mp.buffer_dtype, precisions, dtype_name), unbounded(),
       "MixedPrecision's buffer_dtype: accepted for PyTorch recipes; no model here has buffers, so it changes "
       "nothing"},
      {"fsdp.mixed_precision.init_loss_scale", &mp.init_loss_scale, above(0),
       "With f16 parameters or reductions: dynamic loss scaling's first scale (GradScaler's init_scale), halved "
       "with the step skipped on an overflow, doubled after 2000 good steps"},
      {"fsdp.backward_prefetch", choice(&f.backward_prefetch, kBackwardPrefetches), unbounded(),
       "PyTorch's BackwardPrefetch: gather the next unit in backward order before (`BACKWARD_PRE`) or after "
       "(`BACKWARD_POST`) the current unit's backward computes, or not ahead (`none`)"},
      {"fsdp.forward_prefetch", &f.forward_prefetch, unbounded(),
       "Gather the next unit in forward order when a unit's forward begins (FSDP's forward_prefetch)"},
      {"fsdp.limit_all_gathers", &f.limit_all_gathers, unbounded(),
       "At most two units' gathered parameters alive at once (the one computing and one prefetched); a prefetch "
       "beyond that is skipped (FSDP's limit_all_gathers)"},
      {"fsdp.node_shared_params", &f.node_shared_params, unbounded(),
       "Host runs: the ranks of a shard group on one node read the gathered parameters from one node-shared copy "
       "(MPI-3 shared memory in /dev/shm) instead of all_gathering them, with the same results; the banner says "
       "whether it is on"},
      {"fsdp.activation_checkpointing", &f.activation_checkpointing, unbounded(),
       "Every unit but the root recomputes its forward in the backward instead of keeping its activations "
       "(apply_activation_checkpointing on the units)"},
      {"fsdp.cpu_offload", &f.cpu_offload, unbounded(),
       "Device runs: parameter shards and optimizer state in host memory and the optimizer steps there; only "
       "gathered parameters and gradients on the GPU (CPUOffload(offload_params=True)); needs `train.device: cuda`"},
      {"fsdp.hybrid.shard_group_size", &f.shard_group_size, at_least(0),
       "HYBRID strategies: ranks per shard group (it must divide the ranks); 0: the ranks of a node (detected)"},
      {"comm.backend", built_backends(&c.comm.backend), unbounded(),
       "The collective library of FSDP's all_gather, reduce_scatter and all_reduce (torch.distributed's backend): "
       "`mpi` (always built), `ucx` (built when UCX is found), `nccl` (GPU builds; needs `train.device: cuda`)"},
      {"comm.timeout_s", &c.comm.timeout_s, above(0),
       "Seconds a collective or a device wait may take before the run stops with one line naming it "
       "(init_process_group's timeout)"},
      {"checkpoint.dir", &k.dir, unbounded(),
       "The folder of the checkpoints (`ckpt_<step>.h5`, `best.h5`), made when missing; a launch also saves one "
       "when it ends; empty: no checkpoints"},
      {"checkpoint.format", choice(&k.format, kCheckpointFormats), unbounded(),
       "`consolidated` every tensor at its PyTorch shape (`/model/<state_dict name>`), or `sharded` each unit's "
       "flat shards and an index; either loads at any world size"},
      {"checkpoint.every_steps", &k.every_steps, at_least(0),
       "> 0: save every this many steps (needs checkpoint.dir); 0: at the end only"},
      {"checkpoint.keep", &k.keep, at_least(1),
       "The newest `ckpt_*.h5` files kept; older ones are deleted after each save (`best.h5` apart)"},
      {"checkpoint.save_best", &k.save_best, unbounded(),
       "Also save `best.h5` at each evaluation whose loss is the lowest so far (needs checkpoint.dir and "
       "evaluations)"},
      {"checkpoint.resume", &k.resume, unbounded(),
       "Start from a checkpoint: a file's path, or `auto` the newest complete `ckpt_*.h5` in checkpoint.dir (none: "
       "start fresh); empty: start fresh"},
      {"checkpoint.io", choice(&k.io, kCheckpointIos), unbounded(),
       "MPI-IO transfers of a save: `independent`, or `collective` (two-phase collective buffering)"},
      {"output.metrics", &out.metrics, unbounded(),
       "A JSON-lines file rank 0 writes, one line per step (loss, lr, step time, throughput, memory) and per "
       "evaluation; appended to on resume; empty: none"},
      {"output.log_every", &out.log_every, at_least(1),
       "A progress line on stdout every this many steps (when stdout is not a terminal; a terminal gets progress "
       "bars)"},
      {"output.save_weights", &out.save_weights, unbounded(),
       "At the end, an HDF5 file of the trained weights, `/model/<state_dict name>` at full shapes (what "
       "model.init_from reads); empty: none"},
      {"output.trace", &out.trace, unbounded(),
       "A Chrome trace (Perfetto, chrome://tracing) of every rank's FSDP phases; the metrics lines then carry each "
       "step's breakdown; empty: none"},
      {"output.trace_steps", StepWindow{&out.trace_first_step, &out.trace_last_step}, unbounded(),
       "The steps traced, [first, last], 1-based and inclusive (needs output.trace); by default every step"},
      {"generate.num_beams", &g.num_beams, at_least(1),
       "t5: 1 greedy search, more a beam search of that many beams (HF generate()'s num_beams)"},
      {"generate.max_new_tokens", &g.max_new_tokens, at_least(0),
       "t5: tokens generated at most (HF's max_new_tokens); 0: data.target_len"},
      {"generate.length_penalty", &g.length_penalty, unbounded(),
       "t5, beam search: a finished hypothesis scores sum_logprobs / length^length_penalty (HF's length_penalty)"},
      {"generate.batch_size", &g.batch_size, at_least(0),
       "t5: samples per rank per decoding batch; 0: train.eval_batch_size"},
      {"generate.rouge_samples", &g.rouge_samples, at_least(-1),
       "t5: validation samples decoded and scored with ROUGE-1/2/L at each evaluation, the first N; -1: all for "
       "data.kind seq2seq, none for synthetic pairs; 0: none"},
  };
}

// The settings each optimizer takes, as in PyTorch's constructors (which reject the others).
std::vector<std::string> optimizer_keys(OptimizerKind kind) {
  if (kind == OptimizerKind::sgd) return {"lr", "momentum", "dampening", "nesterov", "weight_decay"};
  if (kind == OptimizerKind::adadelta) return {"lr", "rho", "eps", "weight_decay"};
  return {"lr", "betas", "eps", "weight_decay"};
}

// PyTorch's defaults where they differ from OptimizerConfig's (which are adadelta's): applied when
// the key is not given, and listed by the key reference.
struct KindDefault {
  OptimizerKind kind;
  const char* key;
  double OptimizerConfig::*member;
  double value;
};
constexpr KindDefault kKindDefaults[] = {
    {OptimizerKind::adamw, "lr", &OptimizerConfig::lr, 1e-3},
    {OptimizerKind::adamw, "eps", &OptimizerConfig::eps, 1e-8},
    {OptimizerKind::adamw, "weight_decay", &OptimizerConfig::weight_decay, 0.01},
};

template <class... F>
struct Overload : F... {
  using F::operator()...;
};
template <class... F>
Overload(F...) -> Overload<F...>;  // clang 14 has no CTAD for aggregates (the fuzz build uses it)

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Scalar: return "'" + n.Scalar() + "'";
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "nothing";
  }
}

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlong forms,
// no surrogates, nothing above U+10FFFF), or npos. YAML input is UTF-8; yaml-cpp passes bad bytes
// through on the first read but its emitter and a second read turn them into U+FFFD, so a run
// resumed from the config a checkpoint stores would get another checkpoint.dir or data.path.
size_t first_bad_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    unsigned lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;  // overlong
      if (b == 0xED) hi = 0x9F;  // surrogates
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;  // overlong
      if (b == 0xF4) hi = 0x8F;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > s.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

std::string hex_byte(char c) {
  char text[8];
  std::snprintf(text, sizeof text, "0x%02x", static_cast<unsigned char>(c));
  return text;
}

bool is_prefix(std::string_view prefix, std::string_view path) {
  return path.starts_with(prefix) && (path.size() == prefix.size() || path[prefix.size()] == '.');
}

// Optimal string alignment distance, so that swapped letters count as one typo.
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

// A near spelling, else the same key name elsewhere in the same section ("train.lr" ->
// "train.optimizer.lr") when that is unambiguous.
std::string suggestion(const std::string& path, const std::set<std::string>& known) {
  std::string best;
  size_t best_d = 3;
  for (const auto& k : known)
    if (size_t d = edit_distance(path, k); d < best_d) best = k, best_d = d;
  if (best.empty()) {
    const std::string top = path.substr(0, path.find('.'));
    const std::string leaf = path.substr(path.rfind('.') + 1);
    int matches = 0;
    for (const auto& k : known)
      if (k != path && is_prefix(top, k) && k.substr(k.rfind('.') + 1) == leaf) best = k, ++matches;
    if (matches != 1) best.clear();
  }
  return best.empty() ? "" : " (did you mean '" + best + "'?)";
}

// YAML number syntax is wider than from_chars' (a leading '+'), and yaml-cpp's own conversion
// reads "010" as octal and accepts nan/inf, so numbers are parsed here.
template <class T>
std::optional<T> parse_number(std::string_view s) {
  if (s.size() > 1 && s[0] == '+' && s[1] != '-') s.remove_prefix(1);
  T v{};
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  if constexpr (std::is_floating_point_v<T>)
    if (!std::isfinite(v)) return std::nullopt;
  return v;
}
template <class T>
std::optional<T> number(const YAML::Node& n) {
  return n.IsScalar() ? parse_number<T>(n.Scalar()) : std::nullopt;
}

// YAML 1.2 core booleans only: yaml-cpp would also take yes/no/on/off, which read as strings
// to most people.
std::optional<bool> parse_bool(const YAML::Node& n) {
  if (!n.IsScalar()) return std::nullopt;
  const std::string& s = n.Scalar();
  if (s == "true" || s == "True" || s == "TRUE") return true;
  if (s == "false" || s == "False" || s == "FALSE") return false;
  return std::nullopt;
}

// Where each document of a YAML stream starts, and its first node (Reader::load).
class DocumentMarks final : public YAML::EventHandler {
 public:
  std::vector<YAML::Mark> starts, firsts;
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { first(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { first(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t, const std::string&) override {
    first(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    first(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    first(mark);
  }
  void OnMapEnd() override {}

 private:
  void first(const YAML::Mark& mark) {
    if (firsts.size() < starts.size()) firsts.push_back(mark);
  }
};

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  YAML::Node load(const std::string& text) const;
  void apply(const std::string& override_text, YAML::Node& root);
  void read(const YAML::Node& root, Config& c);
  // The model keys a model.init_from folder's config.json set (path, YAML text), model.kind
  // first when it came from there: parse_config writes them into yaml_text.
  const std::vector<std::pair<std::string, std::string>>& from_init_from() const { return from_init_from_; }

 private:
  struct Given {
    YAML::Node value;
    YAML::Mark mark;  // of the key: a value's own mark can be lines further down
  };

  // A value without a place (a config.json's) is named by its file alone.
  std::string file_at(const YAML::Mark& mark) const {
    if (mark.is_null()) return source_;
    return source_ + ":" + std::to_string(std::max(mark.line, 0) + 1);
  }
  std::string where(const std::string& path, const YAML::Mark& mark) const;
  std::string at(const std::string& path) const;
  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    throw ConfigError(at(path) + ": " + path + ": " + what);
  }
  bool given(const std::string& path) const { return given_.contains(path); }

  void walk(const YAML::Node& map, const std::string& prefix, const std::set<std::string>& fields,
            const std::set<std::string>& sections);
  void convert(const Field& f, const YAML::Node& v) const;
  void check_optimizer(OptimizerConfig& o) const;
  void read_init_from_config(Config& c, const std::vector<Field>& table);
  void check_model(ModelConfig& m) const;
  void check_rules(const Config& c) const;

  std::string source_;
  std::vector<std::string> set_keys_;  // overrides applied so far, in order
  std::map<std::string, Given> given_;
  std::vector<std::pair<std::string, std::string>> from_init_from_;
};

// An override replaces the whole subtree at its key, so the latest one at or above `path`
// supplied the value. Sections an override created have no mark: blame the override below them.
// Reverse iterators, not std::views::reverse: clang 14 (the fuzz build, tests/fuzz) cannot
// compile libstdc++ 12's range views.
std::string Reader::where(const std::string& path, const YAML::Mark& mark) const {
  for (auto k = set_keys_.rbegin(); k != set_keys_.rend(); ++k)
    if (is_prefix(*k, path)) return "--set " + *k;
  if (mark.is_null())
    for (auto k = set_keys_.rbegin(); k != set_keys_.rend(); ++k)
      if (is_prefix(path, *k)) return "--set " + *k;
  return file_at(mark);
}

std::string Reader::at(const std::string& path) const {
  const auto it = given_.find(path);
  return it != given_.end() ? where(path, it->second.mark) : source_ + ":1";  // defaults never fail
}

YAML::Node Reader::load(const std::string& text) const {
  if (const size_t bad = first_bad_utf8(text); bad != std::string_view::npos) {
    const size_t newline = bad == 0 ? std::string::npos : text.rfind('\n', bad - 1);
    const size_t column = newline == std::string::npos ? bad + 1 : bad - newline;
    throw ConfigError(source_ + ":" + std::to_string(std::count(text.data(), text.data() + bad, '\n') + 1) +
                      ": not UTF-8 text (byte " + hex_byte(text[bad]) + " at column " + std::to_string(column) +
                      "); YAML input must be UTF-8");
  }
  // Documents are counted with the parser here, not with YAML::LoadAll: yaml-cpp 0.7 (Debian 12)
  // never returns from LoadAll on a stray ',' outside brackets, handing out the same empty
  // document forever (jbeder/yaml-cpp#1040, fixed upstream after 0.8). Three documents tell
  // that repeat (a document starting where the last one did) from a genuine second document.
  DocumentMarks marks;
  std::vector<YAML::Node> docs;
  try {
    std::istringstream in(text);
    YAML::Parser parser(in);
    while (marks.starts.size() < 3 && parser.HandleNextDocument(marks)) {
      const size_t n = marks.starts.size();
      if (n >= 2 && marks.starts[n - 1].pos == marks.starts[n - 2].pos) {
        const YAML::Mark at = marks.firsts.size() == n ? marks.firsts[n - 1] : marks.starts[n - 1];
        const bool shown = at.pos >= 0 && static_cast<size_t>(at.pos) < text.size() &&
                           std::isgraph(static_cast<unsigned char>(text[at.pos]));
        throw ConfigError(file_at(at) + ": malformed YAML: unexpected " +
                          (shown ? "'" + std::string(1, text[at.pos]) + "'" : std::string("token")));
      }
    }
    if (marks.starts.size() == 1) docs.push_back(YAML::Load(text));
  } catch (const YAML::Exception& e) {  // e.msg is the message without yaml-cpp's position
    throw ConfigError(file_at(e.mark) + ": malformed YAML: " + e.msg);
  }
  if (marks.starts.size() > 1)
    throw ConfigError(file_at(marks.firsts.size() > 1 ? marks.firsts[1] : marks.starts[1]) +
                      ": only one YAML document is allowed");
  if (docs.empty() || docs[0].IsNull()) return YAML::Node(YAML::NodeType::Map);
  if (!docs[0].IsMap())
    throw ConfigError(file_at(docs[0].Mark()) +
                      ": the top level must be a map of sections (model, data, train, ...), got " + describe(docs[0]));
  return docs[0];
}

void Reader::apply(const std::string& text, YAML::Node& root) {
  const size_t eq = text.find('=');
  const std::string key = text.substr(0, eq);
  if (const size_t bad = first_bad_utf8(text); bad != std::string_view::npos)
    throw ConfigError("--set " + key.substr(0, std::min(bad, key.size())) + ": not UTF-8 text (byte " +
                      hex_byte(text[bad]) + " at offset " + std::to_string(bad) + "); YAML input must be UTF-8");
  std::vector<std::string> parts;
  for (size_t b = 0, e = 0; e != std::string::npos; b = e + 1)
    parts.push_back(key.substr(b, (e = key.find('.', b)) - b));
  if (eq == std::string::npos || std::ranges::any_of(parts, &std::string::empty))
    throw ConfigError("--set '" + text + "': expected dotted.key=value");
  YAML::Node value;
  try {
    value = YAML::Load(text.substr(eq + 1));
  } catch (const YAML::Exception& e) {
    throw ConfigError("--set " + key + ": malformed YAML value: " + e.msg);
  }
  set_keys_.push_back(key);
  // yaml-cpp: assigning to a Node writes through to the tree, reset() only rebinds the handle.
  YAML::Node cur = root;
  std::string path;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    path += (i ? "." : "") + parts[i];
    YAML::Node next = cur[parts[i]];
    if (!next.IsDefined() || next.IsNull())
      next = YAML::Node(YAML::NodeType::Map);
    else if (!next.IsMap())
      throw ConfigError(where(path, next.Mark()) + ": " + path + ": expected a map, got " + describe(next));
    cur.reset(next);
  }
  cur[parts.back()] = value;
}

void Reader::walk(const YAML::Node& map, const std::string& prefix, const std::set<std::string>& fields,
                  const std::set<std::string>& sections) {
  for (const auto& kv : map) {
    const std::string name = kv.first.IsScalar() ? kv.first.Scalar() : describe(kv.first);
    // NOLINTNEXTLINE(performance-inefficient-string-concatenation): once per key of a config file
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    const YAML::Mark mark = kv.first.Mark();
    if (!fields.contains(path) && !sections.contains(path)) {
      std::set<std::string> known = fields;
      known.insert(sections.begin(), sections.end());
      throw ConfigError(where(path, mark) + ": unknown key '" + path + "'" + suggestion(path, known));
    }
    // yaml-cpp keeps both copies of a repeated key; which one wins would be an accident.
    if (const auto [it, fresh] = given_.try_emplace(path, Given{kv.second, mark}); !fresh)
      throw ConfigError(where(path, mark) + ": " + path + ": given twice (first at line " +
                        std::to_string(it->second.mark.line + 1) + ")");
    if (sections.contains(path)) {
      if (kv.second.IsMap())
        walk(kv.second, path, fields, sections);
      else if (!kv.second.IsNull())  // "train:" with nothing under it is an empty section
        fail(path, "expected a map, got " + describe(kv.second));
    }
  }
}

void Reader::convert(const Field& f, const YAML::Node& v) const {
  auto expected = [&](const std::string& what) { fail(f.path, "expected " + what + ", got " + describe(v)); };
  auto check = [&](double x, const std::string& text) {
    if (!f.bound.contains(x)) fail(f.path, "must be " + f.bound.text() + ", got " + text);
  };
  std::visit(Overload{
                 [&](int64_t* dst) {
                   const auto x = number<int64_t>(v);
                   if (!x) expected("an integer");
                   check(double(*x), v.Scalar());
                   *dst = *x;
                 },
                 [&](uint64_t* dst) {
                   const auto x = number<uint64_t>(v);
                   if (!x) expected("a non-negative integer");
                   *dst = *x;
                 },
                 [&](double* dst) {
                   const auto x = number<double>(v);
                   if (!x) expected("a number");
                   check(*x, v.Scalar());
                   *dst = *x;
                 },
                 [&](bool* dst) {
                   const auto x = parse_bool(v);
                   if (!x) expected("true or false");
                   *dst = *x;
                 },
                 [&](std::string* dst) {
                   if (!v.IsScalar() && !v.IsNull()) expected("a string");
                   *dst = v.IsScalar() ? v.Scalar() : "";  // "dir:" means ""
                 },
                 [&](std::vector<std::string>* dst) {
                   if (!v.IsSequence() && !v.IsNull()) expected("a list of strings");
                   dst->clear();
                   for (const auto& item : v) {
                     if (!item.IsScalar()) expected("a list of strings");
                     dst->push_back(item.Scalar());
                   }
                 },
                 [&](Betas dst) {
                   if (!v.IsSequence() || v.size() != 2) expected("a list of two numbers");
                   double* out[] = {dst.b1, dst.b2};
                   for (size_t i = 0; i < 2; ++i) {
                     const auto x = number<double>(v[i]);
                     if (!x) expected("a list of two numbers");
                     check(*x, v[i].Scalar());
                     *out[i] = *x;
                   }
                 },
                 [&](const Choice& dst) {
                   if (!v.IsScalar() && !v.IsNull()) expected("a string");
                   const std::string text = v.IsScalar() ? v.Scalar() : "";
                   const auto it = std::ranges::find(dst.names, text);
                   if (it == dst.names.end()) {
                     const std::set<std::string> known(dst.names.begin(), dst.names.end());
                     std::string hint = suggestion(text, known);
                     fail(f.path, "expected one of [" + join(dst.names) + "], got " + describe(v) + hint);
                   }
                   dst.set(static_cast<size_t>(it - dst.names.begin()));
                 },
                 [&](StepWindow dst) {
                   const auto step = [&](size_t i) { return v.IsSequence() ? number<int64_t>(v[i]) : std::nullopt; };
                   if (!v.IsSequence() || v.size() != 2 || !step(0) || !step(1))
                     expected("a list of two step numbers [first, last]");
                   if (*step(0) < 1 || *step(1) < *step(0))
                     fail(f.path, "must be [first, last] with 1 <= first <= last, got [" + v[0].Scalar() + ", " +
                                      v[1].Scalar() + "]");
                   *dst.first = *step(0);
                   *dst.last = *step(1);
                 },
                 [&](EvalEvery* dst) {
                   const std::string s = v.IsScalar() ? v.Scalar() : "";
                   if (s == "epoch" || s == "never") {
                     *dst = {s == "epoch" ? EvalEvery::When::epoch : EvalEvery::When::never, 0};
                   } else if (const auto n = number<int64_t>(v); n && *n >= 1) {
                     *dst = {EvalEvery::When::steps, *n};
                   } else {
                     expected("'epoch', 'never' or a step count >= 1");
                   }
                 },
             },
             f.target);
}

void Reader::check_optimizer(OptimizerConfig& o) const {
  const std::string p = "train.optimizer.";
  const std::vector<std::string> own = optimizer_keys(o.kind);
  for (const auto& [path, g] : given_)
    if (path.starts_with(p) && path != p + "kind" && std::ranges::find(own, path.substr(p.size())) == own.end())
      fail(path, "not a setting of optimizer " + std::string(enum_name(o.kind)) + " (it takes " + join(own) + ")");
  if (o.kind == OptimizerKind::sgd && !given(p + "lr"))
    throw ConfigError(at(p + "kind") + ": " + p + "lr: required for sgd (PyTorch has no default)");
  for (const KindDefault& d : kKindDefaults)
    if (o.kind == d.kind && !given(p + d.key)) o.*d.member = d.value;
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0))
    fail(p + "nesterov", "requires momentum > 0 and dampening 0");
}

void Reader::check_model(ModelConfig& m) const {
  const std::string p = "model.";
  const std::vector<std::string> own = model_keys(m.kind);
  // mnist_cnn has always ignored the transformer's keys (inputs set them for either kind); a
  // key of the other LM, though, is a mistake worth a line.
  const std::vector<std::string> t5_keys = model_keys(ModelKind::t5), lm_keys = model_keys(ModelKind::transformer);
  for (const auto& [path, g] : given_) {
    if (!path.starts_with(p) || path == p + "kind" || path == p + "init_from") continue;
    const std::string key = path.substr(p.size());
    if (std::ranges::find(own, key) != own.end()) continue;
    const bool t5_key =
        std::ranges::find(t5_keys, key) != t5_keys.end() && std::ranges::find(lm_keys, key) == lm_keys.end();
    if (m.kind == ModelKind::t5 || t5_key)
      fail(path, "not a setting of model " + std::string(enum_name(m.kind)) + " (it takes " +
                     (own.empty() ? std::string("none") : join(own)) + ")");
  }
  if (m.kind != ModelKind::t5) return;
  for (const T5Preset& t : kT5Presets) {
    if (m.preset != t.name) continue;
    auto set = [&](const char* key, auto& field, auto value) {
      if (!given(p + key)) field = value;
    };
    set("d_model", m.d_model, t.d_model);
    set("d_kv", m.d_kv, t.d_kv);
    set("d_ff", m.d_ff, t.d_ff);
    set("num_layers", m.num_layers, t.layers);
    set("num_heads", m.num_heads, t.heads);
    set("feed_forward_proj", m.feed_forward_proj, t.v1_1 ? FeedForwardProj::gated_gelu : FeedForwardProj::relu);
    set("tie_word_embeddings", m.tie_word_embeddings, !t.v1_1);
  }
  const bool from_file =
      std::ranges::any_of(from_init_from_, [&](const auto& kv) { return kv.first == p + "num_decoder_layers"; });
  if (!given(p + "num_decoder_layers") && !from_file) m.num_decoder_layers = m.num_layers;
}

// model.init_from as a Hugging Face folder: its config.json fills the model keys (model.kind
// too, when the YAML leaves it out). A key the YAML also gives must have the file's value: the
// folder's weights were made with it, and an override would fail later as a shape mismatch or,
// for layer_norm_epsilon, not at all. The exception is dropout_rate, a training choice the YAML
// may change, as transformers' from_pretrained(DIR, dropout_rate=...) does.
void Reader::read_init_from_config(Config& c, const std::vector<Field>& table) {
  if (c.model.init_from.empty() || init_from_kind(c.model.init_from) != InitFromKind::hf_folder) return;
  HfConfigKeys hf;
  try {
    hf = read_hf_config(c.model.init_from);
  } catch (const Error& e) {
    fail("model.init_from", e.what());
  }
  const std::string kind(name_of(kModelKinds, hf.kind));
  if (given("model.kind") && c.model.kind != hf.kind)
    fail("model.kind", "is " + std::string(name_of(kModelKinds, c.model.kind)) + ", but " + hf.path + " describes a " +
                           kind + " model");
  if (!given("model.kind")) from_init_from_.emplace_back("model.kind", kind);
  c.model.kind = hf.kind;
  if (given("model.preset"))
    fail("model.preset",
         "a preset and a model folder (model.init_from) both set the model keys; give one (" + hf.path + " has them)");
  auto field = [](const std::vector<Field>& fields, const std::string& path) -> const Field& {
    return *std::ranges::find_if(fields, [&](const Field& f) { return f.path == path; });
  };
  Reader file(hf.path);  // its messages name config.json
  for (const auto& [key, text] : hf.keys) {
    const std::string path = "model." + key;
    const YAML::Node value(text);
    file.given_.emplace(path, Given{value, YAML::Mark::null_mark()});
    if (!given(path)) {
      file.convert(field(table, path), value);
      from_init_from_.emplace_back(path, text);
      continue;
    }
    Config in_file, in_yaml;
    file.convert(field(schema(in_file), path), value);
    convert(field(schema(in_yaml), path), given_.at(path).value);
    if (key == "dropout_rate" || in_file.model == in_yaml.model) continue;
    fail(path, "'" + given_.at(path).value.Scalar() + "' disagrees with " + text + " in " + hf.path +
                   " (the folder's weights were made with that; remove the key or make it agree)");
  }
}

void Reader::check_rules(const Config& c) const {
  // The later key of a pair is the one more likely just edited.
  auto blame = [&](const std::string& a, const std::string& b) { return given(b) ? b : a; };
  const ModelConfig& m = c.model;
  if (m.kind != ModelKind::t5 && m.d_model % m.n_heads != 0)
    fail(blame("model.d_model", "model.n_heads"), "model.d_model (" + std::to_string(m.d_model) +
                                                      ") must be divisible by model.n_heads (" +
                                                      std::to_string(m.n_heads) + ")");
  if (m.kind != ModelKind::transformer && m.attention != AttentionMode::materialized)
    fail(blame("model.kind", "model.attention"), "model.attention: " + std::string(enum_name(m.attention)) +
                                                     " is for model.kind transformer (model.kind is " +
                                                     std::string(enum_name(m.kind)) + ")");
  const bool pairs = c.data.kind == DataKind::seq2seq || c.data.kind == DataKind::synthetic;
  if (m.kind != ModelKind::t5)
    for (const auto& [path, g] : given_)
      if (path.starts_with("generate."))
        fail(path, "text generation needs a sequence-to-sequence model (model.kind t5); model.kind is " +
                       std::string(enum_name(m.kind)));
  if ((c.data.kind == DataKind::seq2seq && m.kind != ModelKind::t5) || (m.kind == ModelKind::t5 && !pairs))
    fail(blame("model.kind", "data.kind"), "model.kind t5 reads data.kind seq2seq (or synthetic); got model.kind " +
                                               std::string(enum_name(m.kind)) + " with data.kind " +
                                               std::string(enum_name(c.data.kind)));
  // With data.tokenizer the model's size is checked against the model file when it is read.
  if (m.kind == ModelKind::t5 && c.data.tokenizer.empty() && m.vocab_size < 259)
    fail("model.vocab_size", "must be >= 259 for t5's byte tokens (ids 3..258), got " + std::to_string(m.vocab_size));
  if (c.data.kind == DataKind::seq2seq && c.data.path.empty())
    fail("data.path", "data.kind seq2seq needs data.path (a CSV or JSON-lines file)");
  if (!c.data.tokenizer.empty() && m.kind != ModelKind::t5)
    fail("data.tokenizer",
         "is for model.kind t5 (SentencePiece ids); model.kind " + std::string(enum_name(m.kind)) + " reads bytes");
  if (!c.data.eval_path.empty() && c.data.kind != DataKind::seq2seq)
    fail("data.eval_path", "is for data.kind seq2seq (a validation file beside data.path)");
  if (!c.data.eval_path.empty() && given("data.eval_fraction"))
    fail(blame("data.eval_path", "data.eval_fraction"),
         "data.eval_path and data.eval_fraction both given: the validation rows come from one of them");
  if (c.data.kind == DataKind::text && m.vocab > 256)
    fail("model.vocab", "must be <= 256 when data.kind is text (tokens are bytes), got " + std::to_string(m.vocab));
  if (c.train.epochs == 0 && c.train.steps == 0)
    fail(blame("train.epochs", "train.steps"),
         "train.epochs and train.steps are both 0; one of them must bound the run");
  // Both are about device memory: on cpu the shards are already host memory, and NCCL moves only
  // device buffers.
  if (c.fsdp.cpu_offload && c.train.device != Device::cuda)
    fail(blame("fsdp.cpu_offload", "train.device"),
         "fsdp.cpu_offload needs train.device: cuda (on cpu the shards already live in host memory)");
  if (c.comm.backend == "nccl" && c.train.device != Device::cuda)
    fail(blame("comm.backend", "train.device"),
         "comm.backend nccl needs train.device: cuda (NCCL moves device memory)");
  // Fused attention is cuDNN's flash attention: a GPU's, with bf16 operands (what medium already
  // does to every GEMM operand), head dims in multiples of 8.
  if (m.attention == AttentionMode::fused && m.kind == ModelKind::transformer) {
    if (c.train.device != Device::cuda)
      fail(blame("model.attention", "train.device"),
           "model.attention: fused needs train.device: cuda (cuDNN's flash attention); on the CPU, recompute keeps "
           "the same memory");
    else if (c.train.matmul_precision != MatmulPrecision::medium)
      fail(blame("model.attention", "train.matmul_precision"),
           "model.attention: fused multiplies bf16 operands; it needs train.matmul_precision: medium (is " +
               std::string(matmul_precision_name(c.train.matmul_precision)) + ")");
    else if (m.d_model % m.n_heads == 0 && (m.d_model / m.n_heads) % 8 != 0)
      fail(blame("model.attention", "model.n_heads"),
           "model.attention: fused needs a head dim (d_model / n_heads) that is a multiple of 8, got " +
               std::to_string(m.d_model / m.n_heads));
  }
  // Checkpoints and output.save_weights take any device: device shards, optimizer state and
  // gathered units are staged through host memory for HDF5 (train/checkpointing.h, trainer.cpp).
  if (c.fsdp.wrap_policy == WrapPolicy::manual && c.fsdp.wrap_modules.empty())
    fail("fsdp.auto_wrap.policy", "manual requires a non-empty fsdp.auto_wrap.modules list");
  const CheckpointConfig& k = c.checkpoint;
  if (k.dir.empty()) {
    if (k.every_steps > 0) fail("checkpoint.every_steps", "needs checkpoint.dir");
    if (k.save_best) fail("checkpoint.save_best", "needs checkpoint.dir");
    if (k.resume == "auto")
      fail("checkpoint.resume", "auto needs checkpoint.dir (it resumes from the newest file there)");
  }
  if (given("output.trace_steps") && c.output.trace.empty())
    fail("output.trace_steps", "needs output.trace (the file the steps are traced to)");
  if (k.save_best && c.train.eval_every.never())
    fail(blame("checkpoint.save_best", "train.eval_every"),
         "checkpoint.save_best needs evaluations (train.eval_every is never)");
}

void Reader::read(const YAML::Node& root, Config& c) {
  const std::vector<Field> table = schema(c);
  std::set<std::string> fields, sections;
  for (const Field& f : table) {
    fields.insert(f.path);
    for (size_t dot = f.path.find('.'); dot != std::string::npos; dot = f.path.find('.', dot + 1))
      sections.insert(f.path.substr(0, dot));
  }
  walk(root, "", fields, sections);
  for (const Field& f : table)
    if (const auto it = given_.find(f.path); it != given_.end()) convert(f, it->second.value);
  check_optimizer(c.train.optimizer);
  read_init_from_config(c, table);
  check_model(c.model);
  check_rules(c);
}

std::string merged_text(const YAML::Node& root, const std::string& source, const std::vector<std::string>& overrides,
                        const std::string& keys_from) {
  std::string out = "# " + source + " with overrides merged:\n";
  for (std::string o : overrides) {
    std::ranges::replace(o, '\n', ' ');  // keep each one a comment line
    out += "#   --set " + o + "\n";
  }
  if (!keys_from.empty()) out += "#   model keys from " + keys_from + "\n";
  YAML::Emitter emitter;
  emitter << root;
  return out + emitter.c_str() + "\n";
}

// ---- The key reference (fsdp_app --keys, docs/input-file.md) ----------------------------------
// Everything a key's row says comes from its Field: the allowed values from the target's type, its
// Choice names and its Bound, the default from a default Config read through the target.

std::string number_text(double v) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, v);  // the shortest exact form
  return std::string(text, end);
}

std::string code(const std::string& text) { return "`" + text + "`"; }

// A Markdown table cell: '|' would end it.
std::string cell(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    if (ch == '|') out += '\\';
    out += ch;
  }
  return out;
}

std::string code_list(const std::vector<std::string>& names) {
  std::vector<std::string> quoted;
  quoted.reserve(names.size());
  for (const auto& n : names) quoted.push_back(code(n));
  return join(quoted);
}

std::string default_text(const Target& target) {
  auto text = [](const std::string& s) { return s.empty() ? std::string("\"\"") : s; };
  auto list = [](const std::vector<std::string>& items) { return "[" + join(items) + "]"; };
  return std::visit(Overload{
                        [](const int64_t* v) { return std::to_string(*v); },
                        [](const uint64_t* v) { return std::to_string(*v); },
                        [](const double* v) { return number_text(*v); },
                        [](const bool* v) { return std::string(*v ? "true" : "false"); },
                        [&](const std::string* v) { return text(*v); },
                        [&](const std::vector<std::string>* v) { return list(*v); },
                        [&](Betas b) {
                          return list({number_text(*b.b1), number_text(*b.b2)});
                        },
                        [](const EvalEvery* v) { return v->text(); },
                        [&](StepWindow w) {
                          return list({std::to_string(*w.first), std::to_string(*w.last)});
                        },
                        [&](const Choice& v) { return text(v.current()); },
                    },
                    target);
}

std::string type_text(const Field& f) {
  const std::string bound = f.bound.lo == -kInf && f.bound.hi == kInf ? "" : " " + f.bound.text();
  return std::visit(
      Overload{
          [&](int64_t*) { return "integer" + bound; },
          [](uint64_t*) { return std::string("integer >= 0"); },
          [&](double*) { return "number" + bound; },
          [](bool*) { return std::string("`true`, `false`"); },
          [](std::string*) { return std::string("string"); },
          [](std::vector<std::string>*) { return std::string("list of strings"); },
          [&](Betas) { return "two numbers, each" + bound; },
          [](EvalEvery*) { return std::string("`epoch`, `never` or a step count >= 1"); },
          [](StepWindow) { return std::string("[first, last], 1 <= first <= last"); },
          [](const Choice& c) { return c.per_build ? std::string("a backend this build has") : code_list(c.names); },
      },
      f.target);
}

// One table per section (the first part of the paths), in the table's order.
std::string key_tables() {
  Config defaults;
  std::string out, section;
  for (const Field& f : schema(defaults)) {
    const std::string top = f.path.substr(0, f.path.find('.'));
    if (top != section) {
      section = top;
      out +=
          "\n## " + code(section) + "\n\n| key | type / allowed values | default | description |\n|---|---|---|---|\n";
    }
    out += "| " + code(f.path) + " | " + cell(type_text(f)) + " | " + cell(code(default_text(f.target))) + " | " +
           cell(f.doc) + " |\n";
  }
  return out;
}

constexpr const char* kReferenceIntro = R"(# Input file keys

Generated by `build/apps/fsdp_app --keys > docs/input-file.md` from the table of keys in
`src/config/config.cpp` (types, allowed values, descriptions) and a default `Config` (the
defaults). Do not edit it by hand: change the table and regenerate; test_app's
`keys_reference_is_docs_input_file` fails while the two differ.

## Giving keys

- The input file is YAML: a map of sections (`model`, `data`, `train`, `fsdp`, `comm`,
  `checkpoint`, `output`, `generate`), each a map of the keys below; a dotted key is a nested map
  (`train.optimizer.lr` is `train: {optimizer: {lr: ...}}`). A key left out keeps its default
  (but see "Keys by optimizer" and "T5 presets").
- `fsdp_app INPUT.yaml --set dotted.key=value` (also `--set=dotted.key=value`, repeatable)
  overrides a key: the value is parsed as YAML (`--set train.optimizer.betas=[0.9,0.95]`) and
  replaces the whole subtree at its key before anything is checked, so it passes the same checks
  as the file; a later `--set` wins. Checkpoints store the input with the overrides merged.
- Errors: every key is checked when the file is read (unknown keys, with a suggestion when one is
  close; keys given twice; wrong types; values out of range; the rules between keys, e.g.
  `checkpoint.every_steps` needs `checkpoint.dir`). A mistake is one line on stderr,
  `FILE:LINE: key: problem`, and exit code 1; for a value from an override, `--set key` stands
  in place of `FILE:LINE`. An input file with no settings is an error (on an empty file, give the
  keys with `--set`).
- Batch sizes: `train.batch_size` is per rank: an optimizer step takes batch_size x ranks x
  `train.grad_accum` samples. `train.global_batch_size` > 0 fixes the micro-batch over all ranks
  instead, whatever the world size: each rank takes global_batch_size / ranks (the run stops at
  start when the ranks do not divide it) and `train.batch_size` is not used. The same global
  batch gives the same losses at any world size.
)";

// Which model keys each model.kind reads (model_keys), and those a model folder's config.json
// sets (hf_config_keys).
std::string model_keys_text() {
  std::string out =
      "\n## Keys by model kind\n\n"
      "`model.kind` and `model.init_from` apply to every kind. The other model keys each kind reads:\n\n";
  for (const auto& [kind, name] : kModelKinds) {
    const std::vector<std::string> keys = model_keys(kind);
    out += "- " + code(std::string(name)) + ": " + (keys.empty() ? "none" : code_list(keys)) + "\n";
  }
  out +=
      "\nt5 refuses the keys of the other kinds, and the other kinds refuse t5's own keys; mnist_cnn ignores the\n"
      "transformer's (one input can switch between the two). With `model.init_from` a Hugging Face model folder,\n"
      "its config.json sets these keys (and `model.kind`):\n\n";
  for (const auto& [kind, name] : kModelKinds)
    if (const std::vector<std::string> keys = hf_config_keys(kind); !keys.empty())
      out += "- " + code(std::string(name)) + ": " + code_list(keys) + "\n";
  out +=
      "\nA key the input file also gives must have the folder's value (its weights were made with it), except\n"
      "`dropout_rate`; `model.preset` beside a folder is refused.\n";
  return out;
}

// Which optimizer keys each train.optimizer.kind takes (optimizer_keys) and its own defaults.
std::string optimizer_keys_text() {
  std::string out =
      "\n## Keys by optimizer\n\n"
      "Each `train.optimizer.kind` takes only these keys, as PyTorch's constructors do (a key of another\n"
      "optimizer is an error). The table's defaults are adadelta's; an optimizer whose PyTorch defaults\n"
      "differ lists its own:\n\n";
  for (const auto& [kind, name] : kOptimizerKinds) {
    out += "- " + code(std::string(name)) + ": " + code_list(optimizer_keys(kind));
    std::string defaults;
    for (const KindDefault& d : kKindDefaults)
      if (d.kind == kind) defaults += (defaults.empty() ? "" : ", ") + code(d.key) + " " + number_text(d.value);
    if (!defaults.empty()) out += "; defaults " + defaults;
    out += "\n";
  }
  return out + "\n`sgd` has no default `lr`: give `train.optimizer.lr`.\n";
}

// kT5Presets as a table: the keys each preset sets (Reader::check_model applies them).
std::string presets_text() {
  std::string out =
      "\n## T5 presets\n\n"
      "`model.preset` (model.kind t5) sets these keys as the Hugging Face hub's configs have them. A key\n"
      "given beside the preset overrides it, `model.num_decoder_layers` follows `model.num_layers` unless\n"
      "given, and the other model keys keep their defaults.\n\n"
      "| preset | d_model | d_kv | d_ff | num_layers | num_heads | feed_forward_proj | tie_word_embeddings |\n"
      "|---|---|---|---|---|---|---|---|\n";
  for (const T5Preset& p : kT5Presets) {
    const FeedForwardProj proj = p.v1_1 ? FeedForwardProj::gated_gelu : FeedForwardProj::relu;
    out += "| " + code(p.name) + " | " + std::to_string(p.d_model) + " | " + std::to_string(p.d_kv) + " | " +
           std::to_string(p.d_ff) + " | " + std::to_string(p.layers) + " | " + std::to_string(p.heads) + " | " +
           std::string(name_of(kFeedForwardProjs, proj)) + " | " + (p.v1_1 ? "false" : "true") + " |\n";
  }
  return out;
}

}  // namespace

Config parse_config(const std::string& yaml_text, const std::string& source_name,
                    const std::vector<std::string>& overrides) {
  Reader reader(source_name);
  YAML::Node root = reader.load(yaml_text);
  for (const auto& o : overrides) reader.apply(o, root);
  Config c;
  reader.read(root, c);
  c.source_path = source_name;
  // Keys from a model folder's config.json go into the text too: a checkpoint's config_yaml then
  // describes the model without the folder (fsdp_ckpt export-hf reads it).
  std::string keys_from;
  for (const auto& [path, text] : reader.from_init_from()) {
    root["model"][path.substr(path.find('.') + 1)] = text;
    keys_from = (std::filesystem::path(c.model.init_from) / "config.json").string();
  }
  c.yaml_text =
      overrides.empty() && keys_from.empty() ? yaml_text : merged_text(root, source_name, overrides, keys_from);
  return c;
}

std::string EvalEvery::text() const {
  return when == When::epoch ? "epoch" : when == When::never ? "never" : std::to_string(steps);
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  struct Close {
    void operator()(std::FILE* f) const { (void)std::fclose(f); }  // opened for reading: nothing to lose
  };
  auto cannot_read = [&] { return ConfigError(path + ": cannot read input file (" + std::strerror(errno) + ")"); };
  const std::unique_ptr<std::FILE, Close> file(std::fopen(path.c_str(), "rb"));
  if (!file) throw cannot_read();
  std::string text;
  char buf[1 << 16];
  for (size_t n = 0; (n = std::fread(buf, 1, sizeof buf, file.get())) > 0;) text.append(buf, n);
  if (std::ferror(file.get())) throw cannot_read();  // e.g. a directory: EISDIR
  Config c = parse_config(text, path, overrides);
  // A file with no settings (empty, only comments, `{}`) would train the defaults without a word:
  // almost always the wrong file or one truncated on its way. With --set overrides it is a way to
  // give every key on the command line, and stays allowed.
  if (overrides.empty()) {
    const YAML::Node root = YAML::Load(text);  // parses: parse_config accepted it
    if (root.IsNull() || (root.IsMap() && root.size() == 0))
      throw ConfigError(path + ": empty input file: no settings (see input/ for examples)");
  }
  return c;
}

Config for_world_size(const Config& config, int world_size) {
  Config c = config;
  const int64_t global = c.train.global_batch_size;
  if (global > 0) {
    if (global % world_size != 0)
      throw ConfigError(c.source_path + ": train.global_batch_size " + std::to_string(global) +
                        " is not divisible by the " + std::to_string(world_size) + " ranks of this run");
    c.train.batch_size = global / world_size;
  }
  return c;
}

std::string input_file_reference() {
  return kReferenceIntro + key_tables() + model_keys_text() + optimizer_keys_text() + presets_text();
}

std::vector<std::string> input_file_keys() {
  Config c;
  std::vector<std::string> keys;
  for (const Field& f : schema(c)) keys.push_back(f.path);
  return keys;
}

}  // namespace fsdp
