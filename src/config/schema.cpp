// The table of keys (schema.h). Long because it is a table, one entry per key with its
// description: splitting it would scatter the schema.
#include "config/schema.h"

#include <iterator>
#include <set>

#include "config/backends.h"
#include "config/hf_config.h"
#include "config/yaml_text.h"  // Overload
#include "tensor/device.h"     // device_name

namespace fsdp::config_internal {

namespace {

// comm.backend: the backends this build has. The key reference describes them instead of listing
// them, so that docs/input-file.md is the same for every build.
Choice built_backends(std::string* dst) {
  Choice c = choice(dst, built_backend_names());
  c.per_build = true;
  return c;
}

}  // namespace

Choice choice(std::string* dst, std::vector<std::string> names) {
  Choice c;
  c.names = std::move(names);
  c.set = [dst, names = c.names](size_t i) { *dst = names[i]; };
  c.current = [dst] { return *dst; };
  return c;
}

std::vector<std::string> model_keys(const ModelFamily& family) {
  std::vector<std::string> keys = family.keys();
  if (!family.presets.empty()) keys.insert(keys.begin(), "preset");
  return keys;
}

const ArgSpec* arg_spec(const std::string& kind, const std::string& key) {
  if (const ModelFamily* own = find_family(kind))
    if (const ArgSpec* spec = own->spec(key)) return spec;
  for (const ModelFamily* f : model_families())
    if (const ArgSpec* spec = f->spec(key)) return spec;
  return nullptr;
}

Field arg_field(const ArgSpec& spec, ArgValue& value) {
  Field f{"model." + spec.key, {}, spec.bound, spec.doc.c_str()};
  std::visit(
      Overload{
          [&](int64_t& x) { f.target = &x; },
          [&](double& x) { f.target = &x; },
          [&](bool& x) { f.target = &x; },
          [&](std::string& x) { f.target = spec.choices.empty() ? Target(&x) : Target(choice(&x, spec.choices)); },
      },
      value);
  return f;
}

namespace {

// model.kind, model.init_from, model.preset, then every family's keys (each once, in registration
// order): the reader converts them by the family's ArgSpec, the key reference lists them by family.
std::vector<Field> model_fields(ModelConfig& m) {
  std::vector<std::string> kinds, presets;
  for (const ModelFamily* f : model_families()) {
    kinds.push_back(f->name);
    for (const ModelPreset& p : f->presets) presets.push_back(p.name);
  }
  std::string summaries;
  for (const ModelFamily* f : model_families())
    summaries += (summaries.empty() ? "" : ", ") + ("`" + f->name + "` " + f->summary);
  static const std::string kind_doc = "The model (a registered family; Keys by model kind, below): " + summaries;
  std::vector<Field> fields = {
      {"model.kind", choice(&m.kind, kinds), unbounded(), kind_doc.c_str()},
      {"model.init_from", &m.init_from, unbounded(),
       "Initial weights, any kind: an HDF5 file with `/model/<state_dict name>` (a consolidated checkpoint, "
       "output.save_weights), a `.safetensors` file, or a Hugging Face model folder whose config.json also sets the "
       "model keys (`from_pretrained`); empty: the model's own initialisation"},
      {"model.preset", choice(&m.preset, presets), unbounded(),
       "A Hugging Face hub model whose keys this sets (Presets, below; t5 has them); keys given beside it override "
       "it; empty: none"},
  };
  std::set<std::string> seen;
  for (const ModelFamily* f : model_families())
    for (const ArgSpec& spec : f->args)
      if (seen.insert(spec.key).second) fields.push_back({"model." + spec.key, ArgSlot{&m, spec.key}});
  return fields;
}

}  // namespace

// The one list of known keys; sections are the prefixes of these paths. Long because it is a
// table, one entry per key with its description: splitting it would scatter the schema.
// `fsdp_app --keys` prints it as docs/input-file.md (input_file_reference).
// NOLINTNEXTLINE(readability-function-size): the reason is above
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
  std::vector<Field> fields = model_fields(m);
  std::vector<Field> rest = {
      {"data.kind", choice(&d.kind, kDataKinds), unbounded(),
       "The data: `fashion_mnist` Fashion-MNIST images (mnist_cnn), `text` byte tokens from a file or folder "
       "(transformer), `synthetic` generated samples of the model's shape (images, tokens or t5's pairs), `seq2seq` "
       "source and target texts from a file (t5), `causal_lm` text or prompt/response pairs from a file or folder, "
       "tokenized and packed as transformers' run_clm.py does (llama, transformer)"},
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
       "JSON-lines file, required; causal_lm: a file or folder, required (files named *.jsonl or *.json hold JSON "
       "lines, others plain text whose lines are the rows)"},
      {"data.tokenizer", &d.tokenizer, unbounded(),
       "t5: a SentencePiece model file (an HF T5 folder's spiece.model, as T5Tokenizer reads it; pad 0, eos 1); "
       "empty: byte tokens with ByT5's ids (byte + 3, pad 0, eos 1). causal_lm: a SentencePiece model file (a "
       "Llama folder's tokenizer.model; its bos and eos must be model.bos_token_id and model.eos_token_id); empty: "
       "byte tokens (byte + 3, unk 0, bos 1, eos 2)"},
      {"data.eval_path", &d.eval_path, unbounded(),
       "seq2seq, causal_lm: a validation file (or folder) in data.path's format; empty: the last "
       "data.eval_fraction of data.path's rows"},
      {"data.clean", choice(&d.clean, kTextCleans), unbounded(),
       "seq2seq: the clean-up before tokenizing: `none`, or `wikihow` the PyTorch FSDP tutorial's WikiHow "
       "preparation"},
      {"data.loss_on_padding", &d.loss_on_padding, unbounded(),
       "t5: the labels after eos are pad, which the loss counts (the PyTorch FSDP tutorial's loss); false: -100, "
       "ignored (HF's CrossEntropyLoss ignore_index)"},
      {"data.eval_fraction", &d.eval_fraction, open_open(0, 1),
       "text, and seq2seq or causal_lm without data.eval_path: the fraction of the samples (text) or rows (seq2seq, "
       "causal_lm) at the end that evaluate instead of training"},
      {"data.field", &d.field, unbounded(),
       "causal_lm pretraining: the JSON-lines field that holds a document's text (run_clm.py's text column)"},
      {"data.sft", &d.sft, unbounded(),
       "causal_lm: supervised fine-tuning on JSON lines {prompt, response}: [bos] + prompt + response + [eos], "
       "labels -100 on bos and the prompt; false: pretraining (every token a label, rows packed into blocks)"},
      {"data.prompt", &d.prompt, unbounded(), "causal_lm with data.sft: the JSON-lines field of the prompt"},
      {"data.response", &d.response, unbounded(), "causal_lm with data.sft: the JSON-lines field of the response"},
      {"data.pack", &d.pack, unbounded(),
       "causal_lm with data.sft: concatenate the examples and cut them into full blocks of the model's seq_len "
       "(TRL's packing); false: one example per sample, truncated or padded to seq_len"},
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
       "MixedPrecision's param_dtype: parameters are gathered in it, and (fsdp.mixed_precision.compute: "
       "param_dtype) each unit's forward and backward compute in it"},
      {"fsdp.mixed_precision.compute", choice(&mp.compute, kComputePrecisions), unbounded(),
       "What param_dtype bf16/f16 means for the arithmetic: `param_dtype` PyTorch's meaning (FSDP, FSDP2): every "
       "op's output (activations, input and parameter gradients) rounded to param_dtype, each op's own math "
       "(GEMM accumulation, norm and softmax statistics, GELU) and the loss in f32; `f32` activations and "
       "arithmetic stay f32 on the parameters' rounded values (more accurate, more memory)"},
      {"fsdp.mixed_precision.saved_activations", choice(&mp.saved_activations, kComputePrecisions), unbounded(),
       "With compute: param_dtype, what a training forward's activations wait for their backward in: "
       "`param_dtype` (bf16/f16, as PyTorch's tensors hold them: half the bytes; lossless, their values are "
       "param_dtype's already; each FSDP unit's are packed when its forward ends and unpacked when its backward "
       "begins, one cast pass each way) or `f32` (no packing). No effect with compute: f32 or f32 parameters"},
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
      {"comm.device_buffers", choice(&c.comm.device_buffers, kDeviceBuffers), unbounded(),
       "Device runs on `mpi` or `ucx`: `auto` passes device pointers where the library says it reads device "
       "memory (a CUDA-aware Open MPI, a UCX with CUDA transports) and stages through pinned host memory "
       "otherwise; `staged` always stages; `direct` passes device pointers without asking (a CUDA-aware MPI "
       "that has no Open MPI query: Cray MPICH, MVAPICH2-GDR). The banner says which path and why"},
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
       "t5: 1 greedy search, more a beam search of that many beams (HF generate()'s num_beams); llama: 1"},
      {"generate.max_new_tokens", &g.max_new_tokens, at_least(0),
       "Tokens generated at most (HF's max_new_tokens); 0: data.target_len (t5), the rest of the sample after "
       "its prompt (llama)"},
      {"generate.prompt_len", &g.prompt_len, at_least(0),
       "llama: the first this many tokens of each validation sample are its prompt, the rest its reference; 0: "
       "half of model.seq_len"},
      {"generate.do_sample", &g.do_sample, unbounded(),
       "Sample each token (HF's do_sample: temperature, top-k, top-p, then a draw keyed by train.seed and the "
       "sample's index) instead of greedy search; num_beams 1"},
      {"generate.temperature", &g.temperature, above(0), "do_sample: logits are divided by it (HF's temperature)"},
      {"generate.top_k", &g.top_k, at_least(0), "do_sample: only the k most likely tokens are drawn; 0: all"},
      {"generate.top_p", &g.top_p, open_closed(0, 1),
       "do_sample: only the smallest set of most likely tokens whose probability reaches top_p; 1: all"},
      {"generate.length_penalty", &g.length_penalty, unbounded(),
       "t5, beam search: a finished hypothesis scores sum_logprobs / length^length_penalty (HF's length_penalty)"},
      {"generate.batch_size", &g.batch_size, at_least(0),
       "t5: samples per rank per decoding batch; 0: train.eval_batch_size"},
      {"generate.rouge_samples", &g.rouge_samples, at_least(-1),
       "t5: validation samples decoded and scored with ROUGE-1/2/L at each evaluation, the first N; -1: all for "
       "data.kind seq2seq, none for synthetic pairs; 0: none"},
  };
  fields.insert(fields.end(), std::make_move_iterator(rest.begin()), std::make_move_iterator(rest.end()));
  return fields;
}

// The settings each optimizer takes, as in PyTorch's constructors (which reject the others).
std::vector<std::string> optimizer_keys(OptimizerKind kind) {
  if (kind == OptimizerKind::sgd) return {"lr", "momentum", "dampening", "nesterov", "weight_decay"};
  if (kind == OptimizerKind::adadelta) return {"lr", "rho", "eps", "weight_decay"};
  return {"lr", "betas", "eps", "weight_decay"};
}

}  // namespace fsdp::config_internal
