"""The small models the end-to-end suites train, as fsdp_app --set lists (tests/ckpt, tests/fault,
tests/slurm)."""

# A tiny decoder LM on synthetic tokens (4 units: 3 blocks + root) and the MNIST example CNN on
# synthetic images (5 units). 4 steps per epoch for both: the LM 480 train samples in global
# batches of 120 (splits evenly over 1, 2, 3, 4, 5 and 8 ranks), the CNN 96 in batches of 24 (1, 2,
# 3, 4 and 8 ranks): its convolutions cost about 70 MFLOP a sample, forward and backward, and at
# 120 a batch they were most of the CPU of the suites that train it (ckpt_resume, ckpt_diverge).
GLOBAL_BATCH = 120
CNN_GLOBAL_BATCH = 24
RUN = ["data.kind=synthetic", "train.epochs=0", "train.eval_every=never", "train.shuffle=true", "train.threads=1",
       "output.log_every=1000", "train.dropout=false"]
COMMON = ["data.synthetic_samples=480", f"train.global_batch_size={GLOBAL_BATCH}"] + RUN
TRANSFORMER = ["model.kind=transformer", "model.vocab=64", "model.d_model=32", "model.n_layers=3", "model.n_heads=4",
               "model.d_ff=64", "model.seq_len=16", "train.optimizer.kind=adamw", "train.optimizer.lr=0.003",
               "train.scheduler.kind=cosine", "train.scheduler.warmup_steps=3", "train.clip_grad_norm=1.0",
               "fsdp.auto_wrap.policy=transformer_layer"] + COMMON
CNN = ["model.kind=mnist_cnn", "train.optimizer.kind=adadelta", "train.optimizer.lr=1.0", "train.scheduler.kind=step",
       "train.scheduler.step_size=1", "train.scheduler.gamma=0.7", "fsdp.auto_wrap.policy=size_based",
       "fsdp.auto_wrap.min_num_params=100", "data.synthetic_samples=96", f"train.global_batch_size={CNN_GLOBAL_BATCH}"] + RUN
# T5 (v1.0: lm_head tied to the shared embedding) on synthetic byte pairs, its blocks as units.
T5 = ["model.kind=t5", "model.vocab_size=259", "model.d_model=32", "model.d_kv=8", "model.num_heads=4",
      "model.d_ff=48", "model.num_layers=2", "model.num_decoder_layers=2", "model.dropout_rate=0.1",
      "data.source_len=12", "data.target_len=8", "train.optimizer.kind=adamw", "train.optimizer.lr=0.003",
      "train.clip_grad_norm=1.0", "fsdp.auto_wrap.policy=transformer_layer"] + COMMON
MODELS = {"transformer": TRANSFORMER, "mnist_cnn": CNN, "t5": T5}
