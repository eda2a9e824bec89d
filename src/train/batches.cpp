#include "train/batches.h"

#include <algorithm>

#include "comm/agree.h"
#include "config/config.h"
#include "data/data.h"
#include "tensor/device.h"
#include "tensor/error.h"

namespace fsdp {

namespace {

// The model's embedding must have a row for every piece of data.tokenizer.
void check_fits(const Tokenizer& tokenizer, const Config& c) {
  const ModelFamily& family = c.model.family();
  const int64_t vocab = family.outputs(c.model.args);
  if (tokenizer.vocab_size() > vocab)
    throw Error("data.tokenizer " + c.data.tokenizer + " has " + std::to_string(tokenizer.vocab_size()) +
                " pieces, more than model." + family.vocab_key + " " + std::to_string(vocab));
}

// Pairs for a sequence-to-sequence family; synthetic ones when data.kind is synthetic.
Datasets load_pairs(const Config& c) {
  const DataConfig& d = c.data;
  Seq2SeqOptions o;
  o.path = d.kind == DataKind::seq2seq ? d.path : "";
  o.source = d.source;
  o.target = d.target;
  o.source_len = d.source_len;
  o.target_len = d.target_len;
  o.eval_path = d.kind == DataKind::seq2seq ? d.eval_path : "";
  o.eval_fraction = d.eval_fraction;
  o.clean = d.clean;
  o.loss_on_padding = d.loss_on_padding;
  o.synthetic_samples = d.synthetic_samples;
  o.seed = c.train.seed;
  o.tokenizer = load_tokenizer(d.tokenizer);  // one for both parts
  check_fits(*o.tokenizer, c);
  return {load_seq2seq(o, true), load_seq2seq(o, false)};
}

// Causal-LM text for a decoder-only family, with its bos and eos.
Datasets load_causal_lm_text(const Config& c) {
  const DataConfig& d = c.data;
  const ModelFamily& family = c.model.family();
  const int64_t bos = family.bos_key.empty() ? 1 : c.model.args.i64(family.bos_key);
  const int64_t eos = family.eos_key.empty() ? 2 : c.model.args.i64(family.eos_key);
  if (d.tokenizer.empty() && (bos != 1 || eos != 2))
    throw Error("data.kind causal_lm with byte tokens uses bos 1 and eos 2; model." + family.bos_key + " is " +
                std::to_string(bos) + " and model." + family.eos_key + " " + std::to_string(eos) +
                " (give data.tokenizer, or set them to 1 and 2)");
  CausalLmOptions o;
  o.path = d.path;
  o.eval_path = d.eval_path;
  o.eval_fraction = d.eval_fraction;
  o.seq_len = c.model.args.i64(family.seq_len_key);
  o.sft = d.sft;
  o.pack = d.pack;
  o.field = d.field;
  o.prompt = d.prompt;
  o.response = d.response;
  o.tokenizer = load_tokenizer(d.tokenizer, TokenStyle::llama, static_cast<int32_t>(bos), static_cast<int32_t>(eos));
  check_fits(*o.tokenizer, c);
  return {load_causal_lm(o, true), load_causal_lm(o, false)};
}

// What the model's family reads (ModelTask): images, token sequences or pairs.
Datasets load_data(const Config& c) {
  const DataConfig& d = c.data;
  const ModelFamily& family = c.model.family();
  if (family.task == ModelTask::seq2seq) return load_pairs(c);
  const bool lm = family.task == ModelTask::causal_lm;
  if (d.kind == DataKind::causal_lm) return load_causal_lm_text(c);
  if (d.kind == DataKind::fashion_mnist) {
    if (lm)
      throw Error("data.kind fashion_mnist gives images; model.kind " + c.model.kind +
                  " needs tokens (data.kind text)");
    std::string dir = d.path.empty() ? kFashionMnistDir : d.path;
    return {load_fashion_mnist(dir, true), load_fashion_mnist(dir, false)};
  }
  if (d.kind == DataKind::text) {
    if (!lm) throw Error("data.kind text gives tokens; model.kind " + c.model.kind + " needs images");
    TextCorpusOptions o{d.path.empty() ? kTextCorpusDir : d.path, c.model.args.i64(family.seq_len_key),
                        d.eval_fraction};
    return {load_text_corpus(o, true), load_text_corpus(o, false)};
  }
  SyntheticOptions o;
  o.kind = lm ? "tokens" : "images";
  o.samples = d.synthetic_samples;
  if (lm) {
    o.vocab = family.outputs(c.model.args);
    o.seq_len = c.model.args.i64(family.seq_len_key);
  } else {
    o.classes = family.classes;
  }
  o.seed = c.train.seed;
  SyntheticOptions eval_o = o;
  eval_o.samples = std::max<int64_t>(1, o.samples / 4);
  return {make_synthetic(o, true), make_synthetic(eval_o, false)};
}

}  // namespace

// Data is read by every rank on its own, so one rank can fail where the others succeed (a file
// it may not read, a damaged local copy). The ranks that loaded go on into the mesh's
// communicator splits, which the failed rank never joins: both would wait forever. So the ranks
// agree on the outcome first (bounded by comm.timeout_s), and every rank fails with the first
// failing rank's message, which fsdp_app's set-up error path then reports once.
Datasets load_data_agreed(const Config& c, Communicator& world) {
  Datasets data;
  std::string error;
  try {
    data = load_data(c);
  } catch (const std::bad_alloc&) {
    error = "data: out of memory while loading";
  } catch (const std::exception& e) {
    error = *e.what() ? e.what() : "data: loading failed";
  }
  agree_on_error(world, error).throw_if_failed();
  return data;
}

void load_batch(const Dataset& data, std::span<const int64_t> indices, BatchBuffers& b, MemoryTracker* mem) {
  int64_t n = static_cast<int64_t>(indices.size());
  Shape in = data.input_shape(), tg = data.target_shape();
  in.insert(in.begin(), n);
  tg.insert(tg.begin(), n);
  ensure(b.inputs, in, data.input_dtype(), MemCategory::activations, mem);
  ensure(b.targets, tg, DType::i32, MemCategory::activations, mem);
  data.fill(indices, b.inputs, b.targets);
}

// A device run reads its batch from device buffers: the host batch (read and checked there)
// is copied over, on the compute stream, once per micro-batch. Host runs use it as it is.
const BatchBuffers& upload_batch(DeviceRuntime& rt, const BatchBuffers& host, BatchBuffers& dev) {
  if (rt.device() == Device::cpu) return host;
  ensure(dev.inputs, host.inputs.shape(), host.inputs.dtype(), MemCategory::activations, rt);
  ensure(dev.targets, host.targets.shape(), host.targets.dtype(), MemCategory::activations, rt);
  // Pageable host memory: the copies are synchronous for the host, so `host` may be refilled next.
  rt.copy_async(dev.inputs.raw(), host.inputs.raw(), host.inputs.bytes(), CopyKind::host_to_device,
                rt.compute_stream());
  rt.copy_async(dev.targets.raw(), host.targets.raw(), host.targets.bytes(), CopyKind::host_to_device,
                rt.compute_stream());
  return dev;
}

}  // namespace fsdp
