"""Hidden-state extraction (phase 4): the target's auxiliary states and teacher signal, in
verified safetensors shards.

Modules: ``config`` (ExtractConfig), ``store`` (shard writer/reader), ``target`` (target
fingerprint and head tensors), ``hf_backend`` (transformers forward with hooks),
``sglang_backend`` (SGLang's engine, pinned to 0.5.23), ``sglang_hook`` (the capture hook
that runs inside SGLang), ``sglang_spool`` (the files between them), ``shards`` (planning and
one shard), ``plan`` (disk estimate and check), ``gpu_memory`` (the SGLang engine's GPU
memory, by arithmetic), ``specforge`` (migration), ``run`` (the whole
phase).
This package imports neither Prefect nor Fabric.
"""
