"""The DeepSpeed engine and what surrounds it; every DeepSpeed and torch.distributed call lives here.

* :mod:`~trainer_lib.engine.strategy`: ``DeepSpeedStrategy``, the one object the stages train through
  (initialize, prepare, backward, optimizer step, all-reduce, checkpoints, rank 0).
* :mod:`~trainer_lib.engine.deepspeed_file`: a user's DeepSpeed JSON (``engine.deepspeed_config``) laid
  over ours, and DeepSpeed's memory estimate.
* :mod:`~trainer_lib.engine.batch_size`: ``batch_size=auto``, a probe for the largest micro-batch that fits.
* :mod:`~trainer_lib.engine.checkpoint`: resumable checkpoints, local or at a storage URL, and the final model.
* :mod:`~trainer_lib.engine.launch`: ``--nproc N``, local worker processes through torchrun.
* :mod:`~trainer_lib.engine.parallel`: the tensor / pipeline / data layout of the ranks, and its checks.
* :mod:`~trainer_lib.engine.pipeline`: a causal LM cut into stages for DeepSpeed's pipeline engine.

Nothing is imported here: DeepSpeed and torch load when a strategy is built.
"""
